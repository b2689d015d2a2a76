from typing import Any, ClassVar

import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_vaco.common.buffers import LaggedRolloutBufferSamples
from sb3_vaco.common.clipped import ClippedOnPolicyAlgorithm
from sb3_vaco.common.losses import clip_fraction, clipped_surrogate, safe_ratio


class DecoupledPPO(ClippedOnPolicyAlgorithm):
    """
    Decoupled PPO: PPO's clip around a *proximal* policy instead of the behavior policy, with the stale samples
    reweighted to it (Hilton et al., 2022, "Batch size-invariance for policy optimization",
    https://arxiv.org/abs/2110.00641, Sec. 3; AReaL's objective for asynchronous RL, Fu et al., 2025,
    https://arxiv.org/abs/2505.24298)::

        q = π_θ/π_prox      w = min(π_prox/μ, c̄)      L = − mean( w · min( q·Â, clip(q, 1 − ε, 1 + ε)·Â ) )

    ``π_prox`` is the learner at the start of the update (its log-probs recomputed on the whole rollout), ``μ`` the
    policy that acted, ``Â`` GAE with the learner's critic at the start of the update (no importance correction).

    How it differs from :class:`~sb3_vaco.VACO`'s defaults, line by line:

    * advantages: GAE with the learner's critic here; V-trace (corrected by ``π_T/μ``) in VACO;
    * critic targets: the same (the learner's TD(λ) returns);
    * anchor: the same (``π_prox`` = VACO's ``π_T``, ``tv_reference="decoupled"``);
    * sample weight: ``min(π_prox/μ, c̄)`` with ``c̄ = weight_cap`` (default 2) here; ``min(1, π_T/μ)`` in VACO;
    * per sample: PPO's clip of ``q`` (zero gradient for a sample outside ``[1 − ε, 1 + ε]`` that moves away) here;
      VACO drops the same samples (``ratio_bound=0.2``), so the two agree per sample at ε = 0.2;
    * per minibatch: nothing here; VACO drops every sample that moves away once the minibatch's TV estimate exceeds
      its budget δ;
    * per update: nothing here; VACO shrinks δ to 0 as the measured distance to the data ``TV(π_T, μ)`` approaches
      ``tv_behavior_limit``.

    AReaL drops the samples whose weight exceeds its cap (``behav_imp_weight_cap``) instead of truncating the weight.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param clip_range: PPO's ε around the proximal policy (float or schedule of the progress remaining)
    :param weight_cap: c̄, the truncation of the sample weight ``π_prox/μ``
    :param kwargs: every other parameter of :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm` (SB3 PPO's,
        with the same defaults, and ``policy_lag``, ``n_actors``, ...)
    """

    importance_corrected_advantages: ClassVar[bool] = False

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        clip_range: float | Schedule = 0.2,
        weight_cap: float = 2.0,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        super().__init__(policy, env, clip_range=clip_range, **kwargs, _init_setup_model=False)
        self.weight_cap = weight_cap
        self._check_hyperparameters()
        if _init_setup_model:
            self._setup_model()

    def _policy_loss(
        self, log_prob: th.Tensor, rollout_data: LaggedRolloutBufferSamples, advantages: th.Tensor
    ) -> tuple[th.Tensor, dict[str, float]]:
        clip_range = self._current_clip_range()
        ratio = safe_ratio(log_prob - rollout_data.learner_log_prob)  # q = π_θ/π_prox
        behavior_weights = safe_ratio(rollout_data.learner_log_prob - rollout_data.old_log_prob)  # π_prox/μ
        weights = th.clamp(behavior_weights, max=self.weight_cap)
        stats = {
            "clip_fraction": clip_fraction(ratio, clip_range),
            "weight_capped_fraction": th.mean((behavior_weights > self.weight_cap).float()).item(),
        }
        return clipped_surrogate(ratio, advantages, clip_range, weights), stats
