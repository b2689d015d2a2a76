"""
VACO's "Align" step and update loop as a base class, shared by VACO, its ablations and the baselines it is compared
with (PPO-KL, SPO): once per batch the learner re-estimates values, log-probs, critic targets and advantages of the
stale rollout (V-trace, or GAE with the learner's critic), then minimizes a policy loss that the subclass defines,
plus the value loss and the entropy bonus, over minibatches as SB3's PPO does.
"""

import warnings
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, BasePolicy, MultiInputActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule
from stable_baselines3.common.utils import FloatSchedule, explained_variance, obs_as_tensor
from torch.nn import functional as F

from sb3_vaco.common.buffers import LaggedRolloutBuffer, LaggedRolloutBufferSamples, Observation
from sb3_vaco.common.checks import check_hyperparameters, require
from sb3_vaco.common.lag_spec import PolicyLagSpec, parse_policy_lag
from sb3_vaco.common.lagged import LaggedOnPolicyAlgorithm
from sb3_vaco.common.losses import behavior_kl, safe_ratio, total_variation
from sb3_vaco.common.vtrace import VTraceReturns, vtrace

VALUE_TARGETS = ("gae", "vtrace")


class AlignedOnPolicyAlgorithm(LaggedOnPolicyAlgorithm):
    """
    On-policy actor-critic training on stale data: realign once per batch, then PPO's minibatch loop with the
    subclass's policy loss (:meth:`_policy_loss`).

    Align (arXiv 2603.01365, "advantage alignment"): with the learner ``π_T`` and its critic at the start of the
    update, the whole rollout is re-evaluated and the advantages recomputed with V-trace (Espeholt et al., 2018),
    ``ρ_t = min(ρ̄, π_T/μ)``, ``c_t = λ·min(c̄, π_T/μ)``; subclasses with ``importance_corrected_advantages = False``
    use GAE with the learner's critic instead (no importance correction). The critic's targets follow
    ``value_target``.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, it can be a function of the current progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Minibatch size (None: the whole rollout, one gradient step per epoch)
    :param n_epochs: Number of epochs when optimizing the surrogate loss
    :param gamma: Discount factor
    :param gae_lambda: Trace decay λ inside V-trace (``c_t = λ·min(c̄, π/μ)``) and for GAE
    :param vtrace_rho_bar: Truncation ρ̄ of the importance weight in V-trace's TD errors
    :param vtrace_c_bar: Truncation c̄ of V-trace's trace coefficients
    :param value_target: The critic's targets: ``"gae"`` (the TD(λ) returns of the learner's critic, no importance
        correction) or ``"vtrace"`` (V-trace targets, the paper's rule). Without lag both are the same. Under lag the
        truncated weights pull V-trace targets toward the critic's own values, so the critic learns little
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

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": ActorCriticPolicy,
        "CnnPolicy": ActorCriticCnnPolicy,
        "MultiInputPolicy": MultiInputActorCriticPolicy,
    }
    rollout_buffer: LaggedRolloutBuffer
    batch_size: int | None
    bootstrap_at_train_time = True
    #: V-trace advantages (True) or GAE with the learner's critic, without importance correction (False)
    importance_corrected_advantages: ClassVar[bool] = True

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int = 2048,
        batch_size: int | None = 64,
        n_epochs: int = 10,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
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
        # Checked before the parent constructor, which would fail on them with a bare TypeError.
        check_hyperparameters({"n_steps": n_steps, "n_epochs": n_epochs, "batch_size": batch_size})
        require(
            batch_size is None or batch_size > 1 or not normalize_advantage,
            "`batch_size` must be > 1 with normalize_advantage=True (a minibatch of one has no spread to normalize by)",
        )
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
            policy_lag=policy_lag,
            n_actors=n_actors,
            actor_backend=actor_backend,
            actor_backend_kwargs=actor_backend_kwargs,
            _init_setup_model=False,
            supported_action_spaces=(spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary),
        )
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.vtrace_rho_bar = vtrace_rho_bar
        self.vtrace_c_bar = vtrace_c_bar
        self.value_target = value_target
        self.clip_range_vf = clip_range_vf
        self.normalize_advantage = normalize_advantage
        self.target_kl = target_kl
        # A concrete class sets its own attributes, then calls `_check_hyperparameters()` and, if asked to,
        # `_setup_model()`; `_init_setup_model` is taken here only for the signature that SB3's `load()` uses.

    def _check_hyperparameters(self) -> None:
        """Raise a ``ValueError`` naming the parameter and what to change, for any invalid setting."""
        check_hyperparameters(vars(self))  # every numeric setting the model has so far (sb3_vaco.common.checks)
        require(
            self.value_target in VALUE_TARGETS,
            f"`value_target` must be one of {', '.join(map(repr, VALUE_TARGETS))}; got {self.value_target!r}",
        )
        parse_policy_lag(self.policy_lag)
        if self.env is not None and self.batch_size is not None:
            buffer_size = self.n_steps * self._rollout_n_envs()
            require(
                self.batch_size <= buffer_size,
                f"`batch_size` ({self.batch_size}) must be <= n_steps * n_envs = {buffer_size}: "
                "lower batch_size or raise n_steps",
            )
            untruncated_batches = buffer_size // self.batch_size
            if buffer_size % self.batch_size > 0:
                # The same warning as SB3's PPO
                warnings.warn(
                    f"You have specified a mini-batch size of {self.batch_size},"
                    f" but because the `RolloutBuffer` is of size `n_steps * n_envs = {buffer_size}`,"
                    f" after every {untruncated_batches} untruncated mini-batches,"
                    f" there will be a truncated mini-batch of size {buffer_size % self.batch_size}\n"
                    f"We recommend using a `batch_size` that is a factor of `n_steps * n_envs`.\n"
                    f"Info: (n_steps={self.n_steps} and n_envs={self._rollout_n_envs()})"
                )

    def _setup_model(self) -> None:
        super()._setup_model()
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
        value targets and advantages of the whole rollout, and write them into the buffer (before its first ``get()``
        flattens it).

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

            correct_advantages = self.importance_corrected_advantages
            correct_targets = self.value_target == "vtrace"
            policy_returns = returns(correct_advantages)
            critic_returns = policy_returns if correct_targets == correct_advantages else returns(correct_targets)
            targets = critic_returns.value_targets
            advantages = policy_returns.advantages if correct_advantages else policy_returns.value_targets - values_t
            rhos = safe_ratio(log_rhos)
            tv_behavior = total_variation(log_rhos).item()
            ess_fraction = (th.sum(rhos) ** 2 / (rhos.numel() * th.sum(rhos**2))).item()

        buffer.set_time_major("values", values)
        buffer.set_time_major("learner_log_probs", learner_log_probs)
        buffer.set_time_major("returns", targets.cpu().numpy())
        buffer.set_time_major("advantages", advantages.cpu().numpy())
        self.policy.set_training_mode(True)
        return tv_behavior, ess_fraction

    def _start_policy_update(self, tv_behavior: float) -> None:
        """Called once per update after the realignment, with the rollout's ``TV(π_T, μ)``: set per-update settings."""

    @abstractmethod
    def _policy_loss(
        self, log_prob: th.Tensor, rollout_data: LaggedRolloutBufferSamples, advantages: th.Tensor
    ) -> tuple[th.Tensor, dict[str, float]]:
        """
        The policy loss of one minibatch and its diagnostics for the logger (means over the update under ``train/``).

        :param log_prob: ``log π_θ(a|s)`` of the minibatch's actions (with gradient)
        :param rollout_data: the minibatch: behavior log-probs ``log μ`` (``old_log_prob``), ``log π_T``
            (``learner_log_prob``), ...
        :param advantages: the realigned advantages, normalized per minibatch if ``normalize_advantage``
        """

    def _policy_loss_settings(self) -> dict[str, float]:
        """This update's settings of the policy loss, logged under ``train/`` (e.g. the TV budget or the clip range)."""
        return {}

    def train(self) -> None:
        """
        Update policy using the currently gathered rollout buffer: realign once, then minimize the policy loss, the
        value loss to the realigned targets and the entropy bonus over ``n_epochs`` epochs of minibatches.
        """
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        clip_range_vf = None if self.clip_range_vf is None else self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]

        tv_behavior, ess_fraction = self._realign()
        self._start_policy_update(tv_behavior)

        # Per-minibatch diagnostics, logged as means over the update under train/<key>
        diagnostics: dict[str, list[float]] = {}
        skipped_minibatches = 0
        continue_training = True
        for epoch in range(self.n_epochs):
            for rollout_data in self.rollout_buffer.get(self.batch_size):
                actions = rollout_data.actions
                if isinstance(self.action_space, spaces.Discrete):
                    actions = rollout_data.actions.long().flatten()

                values, log_prob, entropy = self.policy.evaluate_actions(rollout_data.observations, actions)
                values = values.flatten()
                advantages = rollout_data.advantages
                if self.normalize_advantage and len(advantages) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

                policy_loss, stats = self._policy_loss(log_prob, rollout_data, advantages)

                values_pred = values
                if clip_range_vf is not None:
                    # Clip the change of the value estimate around the learner's values at the start of the update
                    values_pred = rollout_data.old_values + th.clamp(
                        values - rollout_data.old_values, -clip_range_vf, clip_range_vf
                    )
                value_loss = F.mse_loss(rollout_data.returns, values_pred)
                entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
                loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss

                with th.no_grad():
                    # How far this update has moved the learner: PPO's approx_kl, mean((r − 1) − log r) with r = π_θ/π_T
                    # (behavior_kl's estimator with π_T in μ's place), KL(π_T‖π_θ) without lag; under lag the samples
                    # come from μ, not π_T, and a few dominate it
                    approx_kl_div = behavior_kl(log_prob - rollout_data.learner_log_prob).item()
                    # ½·mean|π_θ/μ − 1|: the learner's distance to its data, in [0, 1] in expectation under any lag
                    tv_data = total_variation(log_prob - rollout_data.old_log_prob).item()

                stats.update(
                    policy_gradient_loss=policy_loss.item(),
                    value_loss=value_loss.item(),
                    entropy_loss=entropy_loss.item(),
                    approx_kl=approx_kl_div,
                    tv_data=tv_data,
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
            warnings.warn(f"{type(self).__name__} skipped {skipped_minibatches} minibatch(es) with a non-finite loss")
        diagnostics.update(
            tv_behavior=[tv_behavior],
            ess_fraction=[ess_fraction],
            skipped_minibatches=[skipped_minibatches],
            loss=[loss.item()],
            explained_variance=[
                explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
            ],
        )
        self._record_diagnostics(diagnostics, clip_range_vf)

    def _record_diagnostics(self, diagnostics: dict[str, list[float]], clip_range_vf: float | None) -> None:
        """Log the means over the update under ``train/``, the policy loss's settings, PPO's ``std`` and ``n_updates``."""
        for key, values in diagnostics.items():
            self.logger.record(f"train/{key}", np.mean(values))
        for key, setting in self._policy_loss_settings().items():
            self.logger.record(f"train/{key}", setting)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
