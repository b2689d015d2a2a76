import warnings
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, BasePolicy, MultiInputActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule, explained_variance, obs_as_tensor
from torch.nn import functional as F

from sb3_vaco.common.buffers import LaggedRolloutBuffer, LaggedRolloutBufferSamples, Observation
from sb3_vaco.common.lag import LaggedOnPolicyAlgorithm, PolicyLagSpec, parse_policy_lag
from sb3_vaco.common.losses import (
    clipped_surrogate,
    kl_penalty_surrogate,
    safe_ratio,
    spo_surrogate,
    tv_filtered_surrogate,
)
from sb3_vaco.common.vtrace import VTraceReturns, vtrace

SelfVACO = TypeVar("SelfVACO", bound="VACO")

TV_REFERENCES = ("behavior", "learner", "decoupled")
POLICY_LOSSES = ("tv_filter", "clip", "spo", "kl")
ADVANTAGE_ESTIMATORS = ("vtrace", "gae")
VALUE_TARGETS = ("vtrace", "gae")


class VACO(LaggedOnPolicyAlgorithm):
    """
    VACO: total-Variation-based Advantage-aligned Constrained policy Optimization ("Align and Filter").

    PPO-style training that stays reliable when the data comes from stale policies (policy lag):

    1. Align: once per batch, the learner re-estimates the advantages with V-trace, using the behavior
       log-probs stored with every sample, and its critic's targets (TD(λ) returns by default; V-trace targets,
       the paper's rule, with ``value_target="vtrace"``).
    2. Filter: per minibatch, once the estimated total-variation distance to the reference policy exceeds
       ``tv_threshold``, the samples whose gradient would push the policy further away are dropped; with
       ``ratio_bound`` (default 0.2) so is, inside the budget too, each such sample whose ratio to the reference is
       already outside ``[1 − ε, 1 + ε]``. No KL penalty. The default reference is the learner at the start of the
       update, with the samples weighted by ``min(1, π_T/μ)`` (the decoupled form, Hilton et al. 2022), and δ = 0.05.

    The paper's rule is ``VACO(..., tv_reference="behavior", tv_threshold=0.2, ratio_bound=None,
    value_target="vtrace")``; the defaults come from the variant study in ``docs/study.md``. There, at 300k steps,
    they came close to PPO without lag (0.95× on HalfCheetah-v5, 0.91× on Hopper-v5), beat it under lag on
    HalfCheetah-v5 (1.36× at lag 4), lost to it on Hopper-v5, held InvertedPendulum-v5 at lag 4 and fell from it
    at lag 16 (four runs of five end below 1,000, two near 0).

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
    :param vtrace_rho_bar: Truncation ρ̄ of the importance weight in V-trace's TD errors
    :param vtrace_c_bar: Truncation c̄ of V-trace's trace coefficients
    :param tv_reference: Reference policy of the TV filter. ``"decoupled"`` (default): ``π_θ/π_T``, the drift
        since the update started, samples weighted by ``min(pg_rho_bar, π_T/μ)``. ``"behavior"``: ``π_θ/μ``, the
        total lag (the paper's rule, with ``tv_threshold=0.2``). ``"learner"``: as ``"decoupled"`` with the weight
        ``π_T/μ`` untruncated. Without lag (π_T = μ) all three are the same filter. The default bounds the learner's
        own move per update, as PPO's clip does without lag; the behavior reference is over budget from the first step
        once the lag exceeds δ and then only pulls the learner back toward the stale policy (``docs/study.md``)
    :param pg_rho_bar: Truncation of the importance weight ``π_T/μ`` for ``tv_reference="decoupled"``
    :param ratio_bound: Per-sample bound ε on ``|q − 1|``, ``q`` the ratio to the filter's reference: inside the TV
        budget too, a sample already outside ``[1 − ε, 1 + ε]`` whose gradient would push it further is dropped (PPO's
        clip around the reference, on top of the budget, which bounds only the minibatch's average). The default 0.2
        kept InvertedPendulum-v5 at lag 4 and lifted HalfCheetah-v5 at lag 4 (``docs/study.md``, seventh screen).
        None: no per-sample bound (the paper's filter)
    :param policy_loss: ``"tv_filter"`` (VACO), or the baselines' surrogates on the ratio to the behavior
        policy: ``"clip"`` (PPO), ``"spo"`` (Simple Policy Optimization), ``"kl"`` (PPO with a KL penalty)
    :param advantage_estimator: ``"vtrace"`` (VACO's realignment) or ``"gae"`` (GAE with the learner's critic
        and no importance correction: the "filter only" ablation)
    :param value_target: Estimator of the critic's targets: ``"gae"`` (default: the TD(λ) returns of the
        learner's critic, no importance correction) or ``"vtrace"`` (the paper's V-trace targets). The policy's
        advantages follow ``advantage_estimator`` either way. With π_T = μ (no lag) both give the same targets. Under
        lag the truncated weights make V-trace targets close to the critic's own values, so the critic stops
        learning; GAE targets keep it learning (``docs/study.md``)
    :param realign_every_epoch: Recompute the realignment before every epoch instead of once per batch
    :param tv_lag_scaling: Divide the TV budget by ``(1 + k̄)^p``, with ``k̄`` the rollout's measured mean staleness
        in updates and ``p`` this exponent (``True`` = 1, ``False`` = 0: off). With ``p = 1`` and a steady per-update
        move of ``δ/(1 + k̄)`` the learner after the update is about ``δ`` in TV from the behavior data, as without
        lag: the trust region shrinks for stale samples as in GePPO (Queeney et al., 2021). ``p = 0.5`` assumes the
        moves of successive updates add up like a random walk's
    :param tv_behavior_limit: Shrink the TV budget with the measured lag ``TV(π_T, μ)`` of the rollout:
        ``δ · max(0, 1 − TV(π_T, μ)/τ)``, τ this limit (full budget without lag, none once the learner is τ from the
        data). None: no shrinking
    :param data_tv_limit: A second budget τ, on the learner's total distance to its data: once the minibatch's
        ``½·mean|π_θ/μ − 1|`` exceeds τ, the samples whose gradient would move ``π_θ`` further from the behavior
        policy are dropped too (the paper's filter at budget τ, on top of the one around ``π_T``). None: no second
        budget
    :param clip_range: ε of ``policy_loss="clip"`` and ``"spo"`` (float or schedule)
    :param clip_range_vf: Clipping of the value function around the learner's values at the start of the update
    :param kl_coef: β of ``policy_loss="kl"``
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

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": ActorCriticPolicy,
        "CnnPolicy": ActorCriticCnnPolicy,
        "MultiInputPolicy": MultiInputActorCriticPolicy,
    }
    rollout_buffer: LaggedRolloutBuffer
    bootstrap_at_train_time = True

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
        vtrace_rho_bar: float = 1.0,
        vtrace_c_bar: float = 1.0,
        tv_reference: str = "decoupled",
        pg_rho_bar: float = 1.0,
        ratio_bound: float | None = 0.2,
        policy_loss: str = "tv_filter",
        advantage_estimator: str = "vtrace",
        value_target: str = "gae",
        realign_every_epoch: bool = False,
        tv_lag_scaling: bool | float = False,
        tv_behavior_limit: float | None = None,
        data_tv_limit: float | None = None,
        clip_range: float | Schedule = 0.2,
        clip_range_vf: float | Schedule | None = None,
        kl_coef: float = 1.0,
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
            gamma=gamma,
            gae_lambda=gae_lambda,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            device=device,
            seed=seed,
            n_actors=n_actors,
            actor_backend=actor_backend,
            actor_backend_kwargs=actor_backend_kwargs,
            _init_setup_model=False,
            supported_action_spaces=(spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary),
        )
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.tv_threshold = tv_threshold
        self.vtrace_rho_bar = vtrace_rho_bar
        self.vtrace_c_bar = vtrace_c_bar
        self.tv_reference = tv_reference
        self.pg_rho_bar = pg_rho_bar
        self.ratio_bound = ratio_bound
        self.policy_loss = policy_loss
        self.advantage_estimator = advantage_estimator
        self.value_target = value_target
        self.realign_every_epoch = realign_every_epoch
        self.tv_lag_scaling = float(tv_lag_scaling)
        self.tv_behavior_limit = tv_behavior_limit
        self.data_tv_limit = data_tv_limit
        self.clip_range = clip_range
        self.clip_range_vf = clip_range_vf
        self.kl_coef = kl_coef
        self.normalize_advantage = normalize_advantage
        self.policy_lag = policy_lag
        self.target_kl = target_kl
        self._check_hyperparameters()

        if _init_setup_model:
            self._setup_model()

    def _check_hyperparameters(self) -> None:
        """Raise a ``ValueError`` naming the parameter and its valid range for any invalid setting."""

        def require(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(message)

        def positive(name: str, value: Any) -> None:
            if not callable(value):
                require(value > 0, f"`{name}` must be > 0, got {value!r}")

        positive("tv_threshold", self.tv_threshold)
        positive("clip_range", self.clip_range)
        if self.clip_range_vf is not None:
            positive("clip_range_vf", self.clip_range_vf)
        positive("vtrace_rho_bar", self.vtrace_rho_bar)
        positive("vtrace_c_bar", self.vtrace_c_bar)
        positive("pg_rho_bar", self.pg_rho_bar)
        for name in ("ratio_bound", "tv_behavior_limit", "data_tv_limit"):
            if getattr(self, name) is not None:
                positive(name, getattr(self, name))
        require(self.tv_lag_scaling >= 0, f"`tv_lag_scaling` must be a bool or an exponent >= 0, got {self.tv_lag_scaling!r}")
        positive("n_epochs", self.n_epochs)
        positive("n_steps", self.n_steps)
        require(self.kl_coef >= 0, f"`kl_coef` must be >= 0, got {self.kl_coef!r}")
        require(0.0 <= self.gamma <= 1.0, f"`gamma` must be in [0, 1], got {self.gamma!r}")
        require(0.0 <= self.gae_lambda <= 1.0, f"`gae_lambda` must be in [0, 1], got {self.gae_lambda!r}")
        for name, value, valid in (
            ("tv_reference", self.tv_reference, TV_REFERENCES),
            ("policy_loss", self.policy_loss, POLICY_LOSSES),
            ("advantage_estimator", self.advantage_estimator, ADVANTAGE_ESTIMATORS),
            ("value_target", self.value_target, VALUE_TARGETS),
        ):
            require(value in valid, f"`{name}` must be one of {', '.join(map(repr, valid))}; got {value!r}")
        min_batch_size = 2 if self.normalize_advantage else 1
        require(
            self.batch_size >= min_batch_size,
            f"`batch_size` must be >= {min_batch_size} (advantages are normalized per minibatch), got {self.batch_size}",
        )
        if self.env is not None:
            buffer_size = self.n_steps * self._rollout_n_envs()
            require(
                self.batch_size <= buffer_size,
                f"`batch_size` ({self.batch_size}) must be <= n_steps * n_envs = {buffer_size}: "
                "lower batch_size or raise n_steps",
            )
        parse_policy_lag(self.policy_lag)

    def _setup_model(self) -> None:
        super()._setup_model()
        self.tv_threshold = FloatSchedule(self.tv_threshold)
        self.clip_range = FloatSchedule(self.clip_range)
        if self.clip_range_vf is not None:
            self.clip_range_vf = FloatSchedule(self.clip_range_vf)

    def _bootstrap_values(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """
        ``V(s_{t+1})`` and episode ends for every step, with the learner's critic: the next stored state inside
        an episode, the observation after the rollout at the last step, ``V(terminal observation)`` after a
        time-limit truncation and 0 after a termination.
        """
        buffer = self.rollout_buffer
        assert buffer.last_observations is not None and buffer.last_dones is not None
        dones = np.empty_like(values)
        dones[:-1] = buffer.time_major("episode_starts")[1:]
        dones[-1] = buffer.last_dones
        next_values = np.empty_like(values)
        next_values[:-1] = values[1:]
        next_values[-1] = self.policy.predict_values(obs_as_tensor(buffer.last_observations, self.device)).flatten().cpu()
        next_values *= 1.0 - dones
        if buffer.truncation_observations:
            steps, envs = zip(*buffer.truncation_observations.keys(), strict=True)
            terminal_obs = list(buffer.truncation_observations.values())
            if isinstance(terminal_obs[0], dict):
                batch: Observation = {key: np.stack([o[key] for o in terminal_obs]) for key in terminal_obs[0]}  # type: ignore[index]
            else:
                batch = np.stack(terminal_obs)  # type: ignore[arg-type]
            next_values[steps, envs] = self.policy.predict_values(obs_as_tensor(batch, self.device)).flatten().cpu()
        return next_values, dones

    def _realign(self) -> tuple[float, float]:
        """
        Align: re-estimate, for the learner ``π_T`` as it is now, the values ``V(s_t)``, log-probs ``log π_T(a_t|s_t)``,
        value targets and advantages of the whole rollout (V-trace, paper's "advantage alignment"), and write
        them into the buffer. Runs on the time-ordered rollout, before or after the buffer was flattened.

        :return: the sample estimate of ``TV(π_T, μ) = ½·E_μ|π_T/μ − 1|`` over the rollout (the backward lag) and the
            effective sample size fraction ``(Σρ)² / (N·Σρ²)`` of the weights ``ρ = π_T/μ``
        """
        buffer = self.rollout_buffer
        self.policy.set_training_mode(False)
        with th.no_grad():
            flat_values, flat_log_probs = self._evaluate_rollout(buffer.flat_observations(), buffer.flat_actions())
            values = buffer.flat_to_time_major(flat_values)
            learner_log_probs = buffer.flat_to_time_major(flat_log_probs)
            next_values, dones = self._bootstrap_values(values)

            def to_tensor(array: np.ndarray) -> th.Tensor:
                return th.as_tensor(np.ascontiguousarray(array), device=self.device)

            log_rhos = to_tensor(learner_log_probs - buffer.time_major("log_probs"))
            values_t = to_tensor(values)
            rewards_t, next_values_t, dones_t = map(to_tensor, (buffer.time_major("rewards"), next_values, dones))

            def returns(importance_corrected: bool) -> VTraceReturns:
                # GAE is V-trace without importance correction: log ρ = 0, ρ̄ = c̄ = 1.
                return vtrace(
                    log_rhos if importance_corrected else th.zeros_like(log_rhos),
                    rewards=rewards_t,
                    values=values_t,
                    next_values=next_values_t,
                    dones=dones_t,
                    gamma=self.gamma,
                    gae_lambda=self.gae_lambda,
                    rho_bar=self.vtrace_rho_bar if importance_corrected else 1.0,
                    c_bar=self.vtrace_c_bar if importance_corrected else 1.0,
                )

            correct_advantages = self.advantage_estimator == "vtrace"
            correct_targets = self.value_target == "vtrace"
            policy_returns = returns(correct_advantages)
            critic_returns = policy_returns if correct_targets == correct_advantages else returns(correct_targets)
            targets = critic_returns.value_targets
            advantages = policy_returns.advantages if correct_advantages else policy_returns.value_targets - values_t
            rhos = safe_ratio(log_rhos)
            tv_behavior = 0.5 * th.mean(th.abs(rhos - 1.0)).item()
            ess_fraction = (th.sum(rhos) ** 2 / (rhos.numel() * th.sum(rhos**2))).item()

        buffer.set_time_major("values", values)
        buffer.set_time_major("learner_log_probs", learner_log_probs)
        buffer.set_time_major("returns", targets.cpu().numpy())
        buffer.set_time_major("advantages", advantages.cpu().numpy())
        self.policy.set_training_mode(True)
        return tv_behavior, ess_fraction

    def _surrogate(
        self,
        log_prob: th.Tensor,
        rollout_data: LaggedRolloutBufferSamples,
        advantages: th.Tensor,
        tv_threshold: float,
        clip_range: float,
    ) -> tuple[th.Tensor, dict[str, float]]:
        """The policy loss selected by ``policy_loss`` and its diagnostics for the logger."""
        log_ratio = log_prob - rollout_data.old_log_prob  # log π_θ/μ
        if self.policy_loss == "tv_filter":
            if self.tv_reference == "behavior":
                ratio, weights = safe_ratio(log_ratio), None
            else:
                ratio = safe_ratio(log_prob - rollout_data.learner_log_prob)  # π_θ/π_T
                weights = safe_ratio(rollout_data.learner_log_prob - rollout_data.old_log_prob)  # π_T/μ
                if self.tv_reference == "decoupled":
                    weights = th.clamp(weights, max=self.pg_rho_bar)
            behavior_ratio = safe_ratio(log_ratio).detach()
            filtered = tv_filtered_surrogate(
                ratio, advantages, tv_threshold, weights, self.ratio_bound, behavior_ratio, self.data_tv_limit
            )
            stats = {
                "tv_estimate": filtered.tv_estimate.item(),
                # ½·mean|π_θ/μ − 1|: the learner's distance to its data during the update, bounded under any lag
                "tv_data": 0.5 * th.mean(th.abs(behavior_ratio - 1.0)).item(),
                "filtered_fraction": 1.0 - filtered.mask.mean().item(),
                "filter_active_fraction": float(filtered.filter_active),
            }
            if self.ratio_bound is not None:
                stats["bound_fraction"] = filtered.bound_fraction
            if self.data_tv_limit is not None:
                stats["anchor_active_fraction"] = float(filtered.anchor_active)
            return filtered.loss, stats
        if self.policy_loss == "kl":
            return kl_penalty_surrogate(log_ratio, advantages, self.kl_coef), {}
        ratio = safe_ratio(log_ratio)
        clip_fraction = th.mean((th.abs(ratio - 1) > clip_range).float()).item()
        if self.policy_loss == "spo":
            return spo_surrogate(ratio, advantages, clip_range), {"clip_fraction": clip_fraction}
        return clipped_surrogate(ratio, advantages, clip_range), {"clip_fraction": clip_fraction}

    def _tv_budget(self, tv_threshold: float, tv_behavior: float) -> float:
        """This update's TV budget: δ, shrunk for the lag when ``tv_lag_scaling`` or ``tv_behavior_limit`` is set."""
        if self.tv_lag_scaling:
            tv_threshold /= (1.0 + self._rollout_policy_lag) ** self.tv_lag_scaling
        if self.tv_behavior_limit is not None:
            tv_threshold *= max(0.0, 1.0 - tv_behavior / self.tv_behavior_limit)
        return tv_threshold

    def train(self) -> None:
        """
        Update policy using the currently gathered rollout buffer: realign once (or every epoch),
        then minimize the filtered surrogate, the value loss to the V-trace targets and the entropy bonus.
        """
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        tv_threshold = self.tv_threshold(self._current_progress_remaining)  # type: ignore[operator]
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        clip_range_vf = None if self.clip_range_vf is None else self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]

        tv_behavior, ess_fraction = self._realign()
        tv_threshold = self._tv_budget(tv_threshold, tv_behavior)

        # Per-minibatch diagnostics, logged as means over the update under train/<key>
        diagnostics: dict[str, list[float]] = {}
        skipped_minibatches = 0
        continue_training = True
        for epoch in range(self.n_epochs):
            if epoch > 0 and self.realign_every_epoch:
                self._realign()
            for rollout_data in self.rollout_buffer.get(self.batch_size):
                actions = rollout_data.actions
                if isinstance(self.action_space, spaces.Discrete):
                    actions = rollout_data.actions.long().flatten()

                values, log_prob, entropy = self.policy.evaluate_actions(rollout_data.observations, actions)
                values = values.flatten()
                advantages = rollout_data.advantages
                if self.normalize_advantage and len(advantages) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

                policy_loss, stats = self._surrogate(log_prob, rollout_data, advantages, tv_threshold, clip_range)

                values_pred = values
                if clip_range_vf is not None:
                    # Clip the change of the value estimate around the learner's values at the start of the update
                    values_pred = rollout_data.old_values + th.clamp(
                        values - rollout_data.old_values, -clip_range_vf, clip_range_vf
                    )
                # Value loss to the realigned targets (`value_target`)
                value_loss = F.mse_loss(rollout_data.returns, values_pred)
                entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
                loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss

                # KL(π_T‖π_θ): how far this update has moved the learner (PPO's approx_kl when there is no lag)
                with th.no_grad():
                    log_ratio = log_prob - rollout_data.learner_log_prob
                    approx_kl_div = th.mean(safe_ratio(log_ratio) - 1 - log_ratio).item()

                stats.update(
                    policy_gradient_loss=policy_loss.item(),
                    value_loss=value_loss.item(),
                    entropy_loss=entropy_loss.item(),
                    approx_kl=approx_kl_div,
                )
                for key, value in stats.items():
                    diagnostics.setdefault(key, []).append(value)

                if self.target_kl is not None and approx_kl_div > 1.5 * self.target_kl:
                    continue_training = False
                    if self.verbose >= 1:
                        print(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl_div:.2f}")
                    break

                if not th.isfinite(loss):
                    # Never hand a NaN/inf to the optimizer: skip this minibatch and report it.
                    skipped_minibatches += 1
                    continue

                self.policy.optimizer.zero_grad()
                loss.backward()
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()

            self._n_updates += 1
            if not continue_training:
                break

        if skipped_minibatches:
            warnings.warn(f"VACO skipped {skipped_minibatches} minibatch(es) with a non-finite loss in this update")
        diagnostics.update(
            tv_behavior=[tv_behavior],
            ess_fraction=[ess_fraction],
            skipped_minibatches=[skipped_minibatches],
            loss=[loss.item()],
            explained_variance=[
                explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
            ],
        )
        self._record_diagnostics(diagnostics, tv_threshold, clip_range, clip_range_vf)

    def _record_diagnostics(
        self, diagnostics: dict[str, list[float]], tv_threshold: float, clip_range: float, clip_range_vf: float | None
    ) -> None:
        """Log the means over the update under ``train/``, the current budget / clip range, PPO's ``std`` and ``n_updates``."""
        for key, values in diagnostics.items():
            self.logger.record(f"train/{key}", np.mean(values))
        if self.policy_loss == "tv_filter":
            self.logger.record("train/tv_threshold", tv_threshold)
        else:
            self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")

    def learn(
        self: SelfVACO,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "VACO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfVACO:
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )
