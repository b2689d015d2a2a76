"""
The baselines and ablations VACO is compared with, each a small subclass with one hook: the policy loss
(:meth:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm._policy_loss`) or the advantage estimator. They share
VACO's update loop, lag handling and critic targets, so a comparison changes one part at a time. SB3's PPO under the
same lag is :class:`~sb3_vaco.LaggedPPO`.
"""

from typing import Any, ClassVar

import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv

from sb3_vaco.common.aligned import AlignedOnPolicyAlgorithm
from sb3_vaco.common.buffers import LaggedRolloutBufferSamples
from sb3_vaco.common.clipped import ClippedOnPolicyAlgorithm
from sb3_vaco.common.losses import clip_fraction, clipped_surrogate, kl_penalty_surrogate, safe_ratio, spo_surrogate
from sb3_vaco.vaco import VACO


class VACOFilterOnly(VACO):
    """
    Ablation: VACO's filter without the realignment. The advantages are GAE's, computed with the learner's critic
    at the start of the update but without importance correction. Same parameters as :class:`~sb3_vaco.VACO`.
    """

    importance_corrected_advantages: ClassVar[bool] = False


class _ClippedRatio(ClippedOnPolicyAlgorithm):
    """A policy loss on the ratio ``r = π_θ/μ`` to the behavior policy with a clip range ε: :meth:`_surrogate`."""

    def _surrogate(self, ratio: th.Tensor, advantages: th.Tensor, clip_range: float) -> th.Tensor:
        raise NotImplementedError

    def _policy_loss(
        self, log_prob: th.Tensor, rollout_data: LaggedRolloutBufferSamples, advantages: th.Tensor
    ) -> tuple[th.Tensor, dict[str, float]]:
        clip_range = self._current_clip_range()
        ratio = safe_ratio(log_prob - rollout_data.old_log_prob)
        return self._surrogate(ratio, advantages, clip_range), {"clip_fraction": clip_fraction(ratio, clip_range)}


class VACOAlignOnly(_ClippedRatio):
    """
    Ablation: VACO's realignment without the filter. V-trace advantages, then PPO's clipped surrogate on the ratio
    to the behavior policy (Schulman et al., 2017, Eq. 7). It is not :class:`~sb3_vaco.APPO`: APPO clips the ratio
    to the learner at the start of the update (``π_θ/π_T``, reached through a clipped ``μ/π_T``), weights its V-trace
    advantages by ``min(ρ̄, π_T/μ)`` and fits the critic to V-trace targets; this ablation keeps everything of VACO
    but the filter, which is replaced by the clip around the behavior policy that naive PPO uses.

    :param clip_range: PPO's ε (float or schedule of the progress remaining)
    :param kwargs: the parameters of :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm`
    """

    def _surrogate(self, ratio: th.Tensor, advantages: th.Tensor, clip_range: float) -> th.Tensor:
        return clipped_surrogate(ratio, advantages, clip_range)


class SPO(_ClippedRatio):
    """
    Simple Policy Optimization (Xie et al., 2024), a baseline of the paper: GAE advantages with the learner's critic,
    and the penalized surrogate ``r·Â − |Â|/(2ε)·(r − 1)²`` on the ratio to the behavior policy.

    :param clip_range: SPO's ε (float or schedule of the progress remaining)
    :param kwargs: the parameters of :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm`
    """

    importance_corrected_advantages: ClassVar[bool] = False

    def _surrogate(self, ratio: th.Tensor, advantages: th.Tensor, clip_range: float) -> th.Tensor:
        return spo_surrogate(ratio, advantages, clip_range)


class PPOKL(AlignedOnPolicyAlgorithm):
    """
    PPO with a fixed KL penalty (Schulman et al., 2017, Eq. 8), a baseline of the paper: GAE advantages with the
    learner's critic, and ``r·Â − β·KL(μ‖π_θ)`` on the ratio to the behavior policy, without clipping.

    :param kl_coef: β
    :param kwargs: the parameters of :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm`
    """

    importance_corrected_advantages: ClassVar[bool] = False

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        kl_coef: float = 1.0,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        super().__init__(policy, env, **kwargs, _init_setup_model=False)
        self.kl_coef = kl_coef
        self._check_hyperparameters()
        if _init_setup_model:
            self._setup_model()

    def _policy_loss(
        self, log_prob: th.Tensor, rollout_data: LaggedRolloutBufferSamples, advantages: th.Tensor
    ) -> tuple[th.Tensor, dict[str, float]]:
        return kl_penalty_surrogate(log_prob - rollout_data.old_log_prob, advantages, self.kl_coef), {}
