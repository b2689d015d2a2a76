"""The shared update loop with PPO's clip range: the base of the clipped objectives (decoupled PPO, APPO, SPO, ...)."""

from typing import Any

from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule
from stable_baselines3.common.utils import FloatSchedule

from sb3_vaco.common.aligned import AlignedOnPolicyAlgorithm


class ClippedOnPolicyAlgorithm(AlignedOnPolicyAlgorithm):
    """
    :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm` with PPO's clip range ε (a float or a schedule of the
    progress remaining, as in SB3's PPO), logged as ``train/clip_range``; the subclass defines the policy loss.

    :param clip_range: ε
    :param kwargs: the parameters of :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm`
    """

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        clip_range: float | Schedule = 0.2,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        super().__init__(policy, env, **kwargs, _init_setup_model=False)
        self.clip_range = clip_range
        self._check_hyperparameters()
        if _init_setup_model:
            self._setup_model()

    def _setup_model(self) -> None:
        super()._setup_model()
        self.clip_range = FloatSchedule(self.clip_range)

    def _current_clip_range(self) -> float:
        return self.clip_range(self._current_progress_remaining)  # type: ignore[operator]

    def _policy_loss_settings(self) -> dict[str, float]:
        return {"clip_range": self._current_clip_range()}
