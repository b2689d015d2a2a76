from typing import Any

import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_vaco.common.aligned import AlignedOnPolicyAlgorithm
from sb3_vaco.common.buffers import LaggedRolloutBufferSamples
from sb3_vaco.common.losses import importance_weights, vtrace_policy_gradient_loss


class IMPALA(AlignedOnPolicyAlgorithm):
    """
    IMPALA's learner: the V-trace actor-critic (Espeholt et al., 2018, "IMPALA: Scalable Distributed Deep-RL with
    Importance Weighted Actor-Learner Architectures", https://arxiv.org/abs/1802.01561, Sec. 4)::

        v_s   V-trace targets (Eq. 1) with ρ_t = min(ρ̄, π/μ), c_t = λ·min(c̄, π/μ)
        L     = − mean( min(ρ̄_pg, π/μ) · (r_s + γ·v_{s+1} − V(s)) · log π_θ(a_s|s) )       (policy, Sec. 4.2)
              + vf_coef · mean( (v_s − V_θ(s))² )  − ent_coef · mean( H(π_θ(·|s)) )

    ``π`` is the learner at the start of the update; the targets and advantages are computed once per batch (with
    one pass, ``n_epochs=1``, that is the learner the gradient is taken at, as in the paper; with more passes the
    later ones reuse them, where RLlib recomputes them per minibatch).

    Defaults where the paper is silent are RLlib's ``IMPALAConfig``: learning rate 5e-4, entropy 0.01, value loss
    ``0.5·mean(δ²)`` weighted 0.5 (``vf_coef=0.25`` here, where the value loss is ``mean(δ²)``), global gradient-norm
    clip 40, ρ̄ = ρ̄_pg = c̄ = 1, λ = 1, no advantage normalization, one SGD pass over the whole train batch (500 steps:
    ``n_steps=500``, ``batch_size=None``).

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, it can be a function of the current progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update (one train batch)
    :param batch_size: Minibatch size (None: the whole batch, one gradient step per pass)
    :param n_epochs: Number of passes over each batch
    :param gae_lambda: λ of V-trace's trace coefficients (the paper's Remark 2)
    :param ent_coef: Entropy coefficient
    :param vf_coef: Value loss coefficient
    :param max_grad_norm: The maximum value for the gradient clipping
    :param normalize_advantage: Whether to normalize the advantage per minibatch
    :param value_target: The critic's targets: ``"vtrace"`` (the paper's) or ``"gae"``
    :param pg_rho_bar: Truncation ρ̄_pg of the importance weight of the policy gradient
    :param kwargs: every other parameter of :class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm` (``gamma``,
        ``vtrace_rho_bar``, ``vtrace_c_bar``, ``policy_lag``, ``n_actors``, ...)
    """

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 5e-4,
        n_steps: int = 500,
        batch_size: int | None = None,
        n_epochs: int = 1,
        gae_lambda: float = 1.0,
        ent_coef: float = 0.01,
        vf_coef: float = 0.25,
        max_grad_norm: float = 40.0,
        normalize_advantage: bool = False,
        value_target: str = "vtrace",
        pg_rho_bar: float = 1.0,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            n_epochs=n_epochs,
            gae_lambda=gae_lambda,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            normalize_advantage=normalize_advantage,
            value_target=value_target,
            **kwargs,
            _init_setup_model=False,
        )
        self.pg_rho_bar = pg_rho_bar
        self._check_hyperparameters()
        if _init_setup_model:
            self._setup_model()

    def _policy_loss(
        self, log_prob: th.Tensor, rollout_data: LaggedRolloutBufferSamples, advantages: th.Tensor
    ) -> tuple[th.Tensor, dict[str, float]]:
        pg_rhos = importance_weights(rollout_data.learner_log_prob - rollout_data.old_log_prob, self.pg_rho_bar)
        stats = {"pg_rho_mean": pg_rhos.mean().item()}
        return vtrace_policy_gradient_loss(log_prob, advantages, pg_rhos), stats
