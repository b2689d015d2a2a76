from typing import Any

import torch as th
from stable_baselines3.common.distributions import kl_divergence
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_vaco.common.buffers import LaggedRolloutBufferSamples
from sb3_vaco.common.clipped import ClippedOnPolicyAlgorithm
from sb3_vaco.common.losses import appo_surrogate, clip_fraction, importance_weights, safe_ratio
from sb3_vaco.common.policy_lag import frozen_copy


class APPO(ClippedOnPolicyAlgorithm):
    """
    APPO, RLlib's asynchronous PPO (after IMPACT, Luo et al., 2020, https://arxiv.org/abs/1912.00167): V-trace
    advantages and PPO's clip on the ratio to a target policy, with an optional KL penalty to it::

        π_target = the learner at the start of the update (a target network updated every update)
        Â    = min(ρ̄_pg, π_target/μ) · (r_s + γ·v_{s+1} − V(s))        (V-trace, Espeholt et al. 2018, Sec. 4.2)
        r    = clip(μ/π_target, 0, c) · π_θ/μ
        L    = − mean( min( r·Â, clip(r, 1 − ε, 1 + ε)·Â ) ) + β·mean( KL(π_target‖π_θ) )       (KL only if use_kl_loss)
             + vf_coef · mean( (v_s − V_θ(s))² ) − ent_coef · mean( H(π_θ) )

    with the critic fit to the V-trace targets ``v_s``. With ``use_kl_loss`` the coefficient β adapts after each
    update as RLlib's does: ×1.5 when the update's mean KL exceeds ``2·kl_target``, ×0.5 below ``kl_target/2``.

    Where it differs from RLlib: the target network is the learner at the start of each update (RLlib updates it
    every ``target_network_update_freq`` learner steps) and the V-trace estimates are computed once per batch.
    The other settings are SB3 PPO's defaults, so that a PPO user's settings carry over (RLlib's defaults differ:
    ε = 0.4, entropy 0.01, learning rate 5e-4, no advantage normalization).

    Not :class:`~sb3_vaco.VACOAlignOnly`, the ablation, whose clip is on ``π_θ/μ`` (around the behavior policy) with
    unweighted V-trace advantages and the learner's TD(λ) returns as critic targets.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param clip_range: PPO's ε around the target policy (float or schedule of the progress remaining)
    :param value_target: The critic's targets: ``"vtrace"`` (APPO's) or ``"gae"``
    :param pg_rho_bar: Truncation ρ̄_pg of the importance weight ``π_target/μ`` of the advantages
    :param is_ratio_clip: c, the clip of ``μ/π_target`` in the ratio
    :param use_kl_loss: Whether to add the KL penalty to the target policy
    :param kl_coef: β, the initial KL coefficient
    :param kl_target: The KL that β adapts to
    :param kwargs: every other parameter of :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm` (SB3 PPO's,
        with the same defaults, and ``policy_lag``, ``n_actors``, ...)
    """

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        clip_range: float | Schedule = 0.2,
        value_target: str = "vtrace",
        pg_rho_bar: float = 1.0,
        is_ratio_clip: float = 2.0,
        use_kl_loss: bool = False,
        kl_coef: float = 1.0,
        kl_target: float = 0.01,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        super().__init__(policy, env, clip_range=clip_range, value_target=value_target, **kwargs, _init_setup_model=False)
        self.pg_rho_bar = pg_rho_bar
        self.is_ratio_clip = is_ratio_clip
        self.use_kl_loss = use_kl_loss
        self.kl_coef = kl_coef
        self.kl_target = kl_target
        self._check_hyperparameters()
        self._kl_coef_now = float(kl_coef)  # β, adapted after each update; saved, so a reloaded model goes on with it
        if _init_setup_model:
            self._setup_model()

    def _setup_model(self) -> None:
        super()._setup_model()
        self._target_policy: ActorCriticPolicy | None = None
        self._update_kls: list[float] = []

    def _start_policy_update(self, tv_behavior: float) -> None:
        """Copy the learner into the target policy (only with ``use_kl_loss``: the log-probs are already realigned)."""
        self._update_kls = []
        if not self.use_kl_loss:
            return
        if self._target_policy is None:
            self._target_policy = frozen_copy(self.policy)
        self._target_policy.load_state_dict(self.policy.state_dict())

    def _policy_loss(
        self, log_prob: th.Tensor, rollout_data: LaggedRolloutBufferSamples, advantages: th.Tensor
    ) -> tuple[th.Tensor, dict[str, float]]:
        clip_range = self._current_clip_range()
        target_log_prob, behavior_log_prob = rollout_data.learner_log_prob, rollout_data.old_log_prob
        pg_rhos = importance_weights(target_log_prob - behavior_log_prob, self.pg_rho_bar)
        policy_loss = appo_surrogate(
            log_prob, target_log_prob, behavior_log_prob, pg_rhos * advantages, clip_range, self.is_ratio_clip
        )
        ratio = safe_ratio(log_prob - target_log_prob)
        stats = {"clip_fraction": clip_fraction(ratio, clip_range)}
        if self.use_kl_loss:
            assert self._target_policy is not None
            with th.no_grad():
                target_distribution = self._target_policy.get_distribution(rollout_data.observations)
            kl = kl_divergence(target_distribution, self.policy.get_distribution(rollout_data.observations)).mean()
            policy_loss = policy_loss + self._kl_coef_now * kl
            self._update_kls.append(kl.item())
            stats.update(kl=kl.item(), kl_coef=self._kl_coef_now)
        return policy_loss, stats

    def train(self) -> None:
        """The shared update; then, with ``use_kl_loss``, β adapts to the update's mean KL (RLlib's rule)."""
        super().train()
        if self.use_kl_loss and self._update_kls:
            mean_kl = sum(self._update_kls) / len(self._update_kls)
            if mean_kl > 2.0 * self.kl_target:
                self._kl_coef_now *= 1.5
            elif mean_kl < 0.5 * self.kl_target:
                self._kl_coef_now *= 0.5

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_target_policy", "_update_kls"]
