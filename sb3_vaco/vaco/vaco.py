from typing import Any, ClassVar, TypeVar

import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule
from stable_baselines3.common.utils import FloatSchedule

from sb3_vaco.common.aligned import AlignedOnPolicyAlgorithm
from sb3_vaco.common.buffers import LaggedRolloutBufferSamples
from sb3_vaco.common.lag_spec import PolicyLagSpec
from sb3_vaco.common.losses import (
    TV_REFERENCES,
    behavior_kl,
    importance_weights,
    reverse_behavior_kl,
    safe_ratio,
    total_variation,
    tv_filtered_surrogate,
)

#: Where VACO's anchor to the data acts (``behavior_kl_form``)
BEHAVIOR_KL_FORMS = ("loss", "advantage", "bounded")
#: The anchor's KL (``behavior_kl_direction``): ``KL(μ‖π_θ)`` (PPO's) or ``KL(π_θ‖μ)`` (RLHF's)
BEHAVIOR_KLS = {"forward": behavior_kl, "reverse": reverse_behavior_kl}

SelfVACO = TypeVar("SelfVACO", bound="VACO")


class VACO(AlignedOnPolicyAlgorithm):
    """
    VACO: total-Variation-based Advantage-aligned Constrained policy Optimization ("Align and Filter").

    PPO-style training that stays reliable when the data comes from stale policies (policy lag):

    1. Align: once per batch, the learner re-estimates the advantages with V-trace, using the behavior
       log-probs stored with every sample (:class:`~sb3_vaco.common.aligned.AlignedOnPolicyAlgorithm`).
    2. Filter: per minibatch, once the estimated total-variation distance to the reference policy exceeds
       the budget ``tv_threshold``, the samples whose gradient would push the policy further away are dropped
       (:func:`~sb3_vaco.common.losses.tv_filtered_surrogate`). No ratio clipping, no KL penalty.

    The defaults come from the variant study (``docs/study.md``): the reference is the learner at the start of the
    update, with the samples weighted by ``min(1, π_T/μ)`` (the decoupled form, Hilton et al. 2022), δ = 0.05, a
    per-sample bound ``ratio_bound=0.2``, and a budget that shrinks to 0 as the learner's distance to its data
    ``TV(π_T, μ)`` approaches ``tv_behavior_limit=0.1``. The paper's rule is ``VACO(..., **VACO.PAPER)``: TV to the
    behavior policy, δ = 0.2, no per-sample bound, no limit, V-trace critic targets.

    Paper: "Align and Filter: Improving Performance in Asynchronous On-Policy RL",
    Honari et al., 2026, https://arxiv.org/abs/2603.01365

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, it can be a function of the current progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Minibatch size
    :param n_epochs: Number of epochs when optimizing the surrogate loss
    :param gamma: Discount factor
    :param gae_lambda: Trace decay λ inside V-trace (``c_t = λ·min(c̄, π/μ)``) and for GAE
    :param tv_threshold: The TV budget δ per minibatch (float or schedule of the progress remaining). The default
        0.05 is about PPO's per-update step (TV = ½·E|r − 1| ≤ ε/2 with clip range ε = 0.1); the paper uses 0.2
    :param tv_reference: Reference policy of the TV filter. ``"decoupled"`` (default): ``q = π_θ/π_T``, the drift
        since the update started, samples weighted by ``min(1, π_T/μ)``. ``"behavior"``: ``q = π_θ/μ``, the total lag
        (the paper's rule). ``"behavior_relative"``: ``q = π_θ/μ`` too, but the budget bounds how much further from
        its data the update takes the learner: the filter acts once ``D̂`` exceeds δ plus the minibatch's distance at
        the start of the update, ``½·mean|π_T/μ − 1|``, so a learner that starts far from stale data can still move
        (towards it freely). Without lag (π_T = μ) all three are the same filter
    :param ratio_bound: Per-sample bound ε on ``|q − 1|``: inside the TV budget too, a sample already outside
        ``[1 − ε, 1 + ε]`` whose gradient would push it further is dropped (PPO's clip around the reference, on top of
        the budget, which bounds only the minibatch's average). None: no per-sample bound (the paper's filter)
    :param tv_behavior_limit: A limit τ on the learner's distance to its data: the update's TV budget shrinks with
        the rollout's measured lag, ``δ · max(0, 1 − TV(π_T, μ)/τ)``, so the learner stops moving away from data it
        has already left ``τ`` behind (``TV(π_T, μ) = ½·E_μ|π_T/μ − 1|``, logged as ``train/tv_behavior``). Without
        lag the budget is δ. None: no limit (the budget is δ under any lag)
    :param behavior_kl_coef: β of a penalty ``β·KL(μ‖π_θ)`` to the behavior policy added to the filtered surrogate
        (PPO's KL penalty, Schulman et al. 2017, Eq. 8, estimated on the samples as ``mean((r − 1) − log r)``,
        ``r = π_θ/μ``; logged as ``train/behavior_kl``). The forward KL keeps the learner's support over its data:
        it grows fast where π_θ puts little mass on the actions μ took. None: no penalty
    :param behavior_kl_form: Where the anchor ``behavior_kl_coef`` acts. ``"loss"``: the penalty above, added to the
        loss (it acts in every epoch, outside the TV budget). ``"advantage"``: inside the filtered surrogate, each
        sample's (normalized) advantage lowered by ``β·log(π_T/μ)`` (the KL-in-reward of RLHF's PPO, Ouyang et al.
        2022, Eq. 2, with the learner at the start of the update in place of π_θ): to first order in ``log(π_T/μ)`` the
        same gradient at the start of the update, but filtered with the rest, so the budget δ bounds the whole step;
        without lag (π_T = μ) it is zero. ``"bounded"``: the penalty in the loss while the update has moved the
        learner less than the budget δ from where it started (``TV(π_θ, π_T) = ½·E_μ|π_θ/μ − π_T/μ|`` on the
        minibatch, the paper's Eq. 5 between the two); beyond, the pull stops as the filter's push does, so that one
        update cannot swing the learner far back towards data many updates old
    :param behavior_kl_direction: The anchor's KL in the ``"loss"`` and ``"bounded"`` forms: ``"forward"``, PPO's
        ``KL(μ‖π_θ)`` above, or ``"reverse"``, ``KL(π_θ‖μ)`` as RLHF's PPO writes it (Ouyang et al. 2022, Eq. 2),
        estimated as ``mean(r·log r − (r − 1))``. Against a Gaussian μ whose mean is ``Δm`` away the forward KL is
        least at the learner's ``σ² = σ_μ² + Δm²``, so a learner whose mean moves away from stale data widens its
        actions; the reverse KL is least at ``σ = σ_μ`` and only pulls the mean back
    :param vtrace_rho_bar: Truncation ρ̄ of the importance weight in V-trace's TD errors
    :param vtrace_c_bar: Truncation c̄ of V-trace's trace coefficients
    :param value_target: The critic's targets: ``"gae"`` (the learner's TD(λ) returns) or ``"vtrace"`` (the paper's)
    :param clip_range_vf: Clipping of the value function around the learner's values at the start of the update
    :param normalize_advantage: Whether to normalize the advantage per minibatch
    :param ent_coef: Entropy coefficient for the loss calculation
    :param vf_coef: Value function coefficient for the loss calculation
    :param max_grad_norm: The maximum value for the gradient clipping
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE)
    :param sde_sample_freq: Sample a new noise matrix every n steps when using gSDE (-1: once per rollout)
    :param policy_lag: Injected policy lag: every env acts with the learner's parameters from ``K`` updates
        ago, or, for a pair ``(K_min, K_max)``, each env with its own staleness drawn per rollout
    :param n_actors: Number of asynchronous actors collecting the rollouts (0: synchronous collection in ``env``).
        With actors the lag is real (``policy_lag`` must be 0) and the buffer has ``n_actors * n_envs_per_actor`` columns
    :param actor_backend: ``"process"`` (local processes) or ``"ray"`` (local Ray or a cluster)
    :param actor_backend_kwargs: Actor settings: ``env_fn``, ``n_envs_per_actor``, ``delay``, ``actor_timeout``, ...
        (see ``docs/actors.md``)
    :param rollout_buffer_class: Rollout buffer class (a :class:`LaggedRolloutBuffer`); chosen automatically if None
    :param rollout_buffer_kwargs: Keyword arguments to pass to the rollout buffer on creation
    :param target_kl: Stop the epochs early when the estimated KL from the learner at the start of the update
        exceeds ``1.5 * target_kl`` (as in SB3's PPO). None: no limit
    :param stats_window_size: Window size for the rollout logging
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: additional arguments to be passed to the policy on creation
    :param verbose: Verbosity level: 0 for no output, 1 for info messages, 2 for debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    #: The paper's rule: ``VACO("MlpPolicy", env, **VACO.PAPER)``
    PAPER: ClassVar[dict[str, Any]] = {
        "tv_reference": "behavior",
        "tv_threshold": 0.2,
        "ratio_bound": None,
        "tv_behavior_limit": None,
        "value_target": "vtrace",
    }

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int = 2048,
        batch_size: int = 64,
        n_epochs: int = 10,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        tv_threshold: float | Schedule = 0.05,
        tv_reference: str = "decoupled",
        ratio_bound: float | None = 0.2,
        tv_behavior_limit: float | None = 0.1,
        behavior_kl_coef: float | None = None,
        behavior_kl_form: str = "loss",
        behavior_kl_direction: str = "forward",
        vtrace_rho_bar: float = 1.0,
        vtrace_c_bar: float = 1.0,
        value_target: str = "gae",
        clip_range_vf: float | Schedule | None = None,
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        policy_lag: PolicyLagSpec = 0,
        n_actors: int = 0,
        actor_backend: str = "process",
        actor_backend_kwargs: dict[str, Any] | None = None,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        target_kl: float | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ):
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            n_epochs=n_epochs,
            gamma=gamma,
            gae_lambda=gae_lambda,
            vtrace_rho_bar=vtrace_rho_bar,
            vtrace_c_bar=vtrace_c_bar,
            value_target=value_target,
            clip_range_vf=clip_range_vf,
            normalize_advantage=normalize_advantage,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            policy_lag=policy_lag,
            n_actors=n_actors,
            actor_backend=actor_backend,
            actor_backend_kwargs=actor_backend_kwargs,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            target_kl=target_kl,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=False,
        )
        self.tv_threshold = tv_threshold
        self.tv_reference = tv_reference
        self.ratio_bound = ratio_bound
        self.tv_behavior_limit = tv_behavior_limit
        self.behavior_kl_coef = behavior_kl_coef
        self.behavior_kl_form = behavior_kl_form
        self.behavior_kl_direction = behavior_kl_direction
        self._check_hyperparameters()
        if _init_setup_model:
            self._setup_model()

    def _check_hyperparameters(self) -> None:
        super()._check_hyperparameters()
        if self.tv_reference not in TV_REFERENCES:
            raise ValueError(f"`tv_reference` must be one of {', '.join(map(repr, TV_REFERENCES))}; got {self.tv_reference!r}")
        if self.behavior_kl_form not in BEHAVIOR_KL_FORMS:
            raise ValueError(
                f"`behavior_kl_form` must be one of {', '.join(map(repr, BEHAVIOR_KL_FORMS))}; got {self.behavior_kl_form!r}"
            )
        if self.behavior_kl_direction not in BEHAVIOR_KLS:
            raise ValueError(
                f"`behavior_kl_direction` must be one of {', '.join(map(repr, BEHAVIOR_KLS))}; "
                f"got {self.behavior_kl_direction!r}"
            )
        if self.behavior_kl_direction == "reverse" and self.behavior_kl_form == "advantage":
            raise ValueError(
                "`behavior_kl_direction='reverse'` sets the penalty of `behavior_kl_form` 'loss' or 'bounded'; "
                "the 'advantage' form is a shift of the advantages, set `behavior_kl_direction='forward'` with it"
            )

    def _setup_model(self) -> None:
        super()._setup_model()
        self.tv_threshold = FloatSchedule(self.tv_threshold)
        self._update_tv_threshold = self.tv_threshold(1.0)

    def _start_policy_update(self, tv_behavior: float) -> None:
        """This update's TV budget: δ, shrunk with the distance to the data ``TV(π_T, μ)`` under ``tv_behavior_limit``."""
        tv_threshold = self.tv_threshold(self._current_progress_remaining)  # type: ignore[operator]
        if self.tv_behavior_limit is not None:
            tv_threshold *= max(0.0, 1.0 - tv_behavior / self.tv_behavior_limit)
        self._update_tv_threshold = tv_threshold

    def _policy_loss(
        self, log_prob: th.Tensor, rollout_data: LaggedRolloutBufferSamples, advantages: th.Tensor
    ) -> tuple[th.Tensor, dict[str, float]]:
        """Filter: the TV-filtered surrogate against the reference policy ``tv_reference``."""
        anchor = self.behavior_kl_coef if self.behavior_kl_form == "advantage" else None
        if anchor is not None:
            advantages = advantages - anchor * (rollout_data.learner_log_prob - rollout_data.old_log_prob)  # −β·log(π_T/μ)
        tv_threshold = self._update_tv_threshold
        if self.tv_reference == "decoupled":
            ratio = safe_ratio(log_prob - rollout_data.learner_log_prob)  # q = π_θ/π_T
            weights = importance_weights(rollout_data.learner_log_prob - rollout_data.old_log_prob, 1.0)  # min(1, π_T/μ)
        else:
            ratio, weights = safe_ratio(log_prob - rollout_data.old_log_prob), None  # q = π_θ/μ
        if self.tv_reference == "behavior_relative":
            # δ on top of D̂ at π_θ = π_T: the learner's distance to this minibatch's data at the start of the update
            tv_threshold += total_variation(rollout_data.learner_log_prob - rollout_data.old_log_prob).item()
        filtered = tv_filtered_surrogate(ratio, advantages, tv_threshold, weights, self.ratio_bound)
        loss = filtered.loss
        stats = {
            "tv_estimate": filtered.tv_estimate.item(),
            "filtered_fraction": 1.0 - filtered.mask.mean().item(),
            "filter_active_fraction": float(filtered.filter_active),
        }
        if self.ratio_bound is not None:
            stats["bound_fraction"] = filtered.bound_fraction
        if self.behavior_kl_coef is not None:
            kl = BEHAVIOR_KLS[self.behavior_kl_direction](log_prob - rollout_data.old_log_prob)
            anchor_on = self.behavior_kl_form == "loss"
            if self.behavior_kl_form == "bounded":
                # TV(π_θ, π_T) = ½·mean|π_θ/μ − π_T/μ| on μ's samples: how far this update has moved the learner
                ratio_now = safe_ratio(log_prob - rollout_data.old_log_prob)
                ratio_start = safe_ratio(rollout_data.learner_log_prob - rollout_data.old_log_prob)
                step_tv = 0.5 * th.mean(th.abs(ratio_now - ratio_start)).item()
                anchor_on = step_tv <= self._update_tv_threshold
                stats["anchor_active_fraction"] = float(anchor_on)
            if anchor_on:
                loss = loss + self.behavior_kl_coef * kl
            stats["behavior_kl"] = kl.item()
        return loss, stats

    def _policy_loss_settings(self) -> dict[str, float]:
        return {"tv_threshold": self._update_tv_threshold}

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_update_tv_threshold"]
