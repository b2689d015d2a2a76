"""
Injected policy lag: which policy acts in each env. One place, shared by VACO and LaggedPPO.

``policy_lag=K`` makes every env act with the learner's parameters from K updates ago;
``policy_lag=(K_min, K_max)`` gives each env (actor) its own staleness, drawn uniformly per rollout,
so one batch mixes several policy versions, as independent actors with random delays would.

``n_actors > 0`` replaces the injected lag by real asynchronous actors (``sb3_vaco/common/actors/``): the lag is then
whatever the actors' speed and the learner's update time make it.
"""

from collections import deque
from typing import Any, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ConvertCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, PyTorchObs
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_vaco.common.actors.base import ActorSettings, parse_actor_settings, pickle_env_fn
from sb3_vaco.common.actors.pool import ActorPool, ActorProgressBarCallback, vec_wrappers_of
from sb3_vaco.common.buffers import LaggedDictRolloutBuffer, LaggedRolloutBuffer, Observation
from sb3_vaco.common.losses import MAX_LOG_RATIO

PolicyLagSpec = int | tuple[int, int] | list[int]
SelfLaggedOnPolicyAlgorithm = TypeVar("SelfLaggedOnPolicyAlgorithm", bound="LaggedOnPolicyAlgorithm")
# Rows per forward pass when the learner re-evaluates a whole rollout.
_EVAL_CHUNK = 4096


def parse_policy_lag(policy_lag: PolicyLagSpec) -> tuple[int, int]:
    """
    Validate a lag setting and return it as ``(K_min, K_max)``.

    :param policy_lag: ``K`` (every env K updates stale) or ``(K_min, K_max)`` (per-env staleness range)
    """
    if isinstance(policy_lag, (int, np.integer)) and not isinstance(policy_lag, bool):
        lag_range = (int(policy_lag), int(policy_lag))
    elif (
        isinstance(policy_lag, (tuple, list))
        and len(policy_lag) == 2
        and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in policy_lag)
    ):
        lag_range = (int(policy_lag[0]), int(policy_lag[1]))
    else:
        raise ValueError(
            f"`policy_lag` must be an int K >= 0 or a pair (K_min, K_max) of ints with 0 <= K_min <= K_max, got {policy_lag!r}"
        )
    if lag_range[0] < 0 or lag_range[0] > lag_range[1]:
        raise ValueError(f"`policy_lag` must satisfy 0 <= K_min <= K_max, got {policy_lag!r}")
    return lag_range


def _index_obs(obs: PyTorchObs, env_indices: th.Tensor) -> PyTorchObs:
    if isinstance(obs, dict):
        return {key: value[env_indices] for key, value in obs.items()}
    return obs[env_indices]


class PolicyLag:
    """
    Keeps a ring of the learner's last ``K_max + 1`` parameter snapshots and decides, per rollout,
    which snapshot acts in each env.

    A new *version* starts each time the learner's parameters have been updated (detected through the
    algorithm's ``_n_updates`` counter) and a rollout begins. A staleness of ``k`` means the env acts with
    version ``current − k``; early in training, when fewer versions exist, the oldest one acts.
    With ``K_max = 0`` the learner itself acts and nothing is copied.

    :param policy_lag: ``K`` or ``(K_min, K_max)``
    :param seed: seed of the staleness draws (independent of the global RNGs, so ``K = 0`` changes nothing)
    """

    def __init__(self, policy_lag: PolicyLagSpec, seed: int | None = None) -> None:
        self.min_lag, self.max_lag = parse_policy_lag(policy_lag)
        self.rng = np.random.default_rng(seed)
        self.version = -1
        self._last_n_updates: int | None = None
        # (version, n_updates at that version, parameters)
        self.snapshots: deque[tuple[int, int, dict[str, th.Tensor]]] = deque(maxlen=self.max_lag + 1)
        self._behavior_pool: list[ActorCriticPolicy] = []
        self.learner: ActorCriticPolicy | None = None
        # Per rollout: the acting policies and the envs each one acts in.
        self.groups: list[tuple[ActorCriticPolicy, th.Tensor]] = []
        self.env_versions = np.zeros(0, dtype=np.int64)
        self.env_lag_epochs = np.zeros(0, dtype=np.int64)

    @property
    def enabled(self) -> bool:
        return self.max_lag > 0

    def start_rollout(self, learner: ActorCriticPolicy, n_updates: int, n_envs: int) -> None:
        """Record the learner's current version and draw which version acts in each env for this rollout."""
        self.learner = learner
        if n_updates != self._last_n_updates:
            self.version += 1
            self._last_n_updates = n_updates
            if self.enabled:
                params = {name: tensor.detach().clone() for name, tensor in learner.state_dict().items()}
                self.snapshots.append((self.version, n_updates, params))

        if not self.enabled:
            self.groups = [(learner, th.arange(n_envs, device=learner.device))]
            self.env_versions = np.full(n_envs, self.version, dtype=np.int64)
            self.env_lag_epochs = np.zeros(n_envs, dtype=np.int64)
            return

        staleness = self.rng.integers(self.min_lag, self.max_lag + 1, size=n_envs)
        oldest_version = self.snapshots[0][0]
        self.env_versions = np.maximum(self.version - staleness, oldest_version)
        self.groups = []
        self.env_lag_epochs = np.zeros(n_envs, dtype=np.int64)
        for slot, version in enumerate(np.unique(self.env_versions)):
            _, version_n_updates, params = self.snapshots[version - oldest_version]
            env_indices = np.flatnonzero(self.env_versions == version)
            self.env_lag_epochs[env_indices] = n_updates - version_n_updates
            behavior = learner if version == self.version else self._behavior_policy(slot, learner)
            if behavior is not learner:
                behavior.load_state_dict(params)
            self.groups.append((behavior, th.as_tensor(env_indices, device=learner.device)))

    def _behavior_policy(self, slot: int, learner: ActorCriticPolicy) -> ActorCriticPolicy:
        # A separate module per acting version: SB3 policies keep one distribution object per module,
        # so a stale policy cannot be a second call on the learner.
        while len(self._behavior_pool) <= slot:
            policy = learner.__class__(**learner._get_constructor_parameters()).to(learner.device)
            policy.set_training_mode(False)
            policy.requires_grad_(False)
            self._behavior_pool.append(policy)
        return self._behavior_pool[slot]

    def reset_noise(self) -> None:
        """Resample gSDE exploration noise of every acting policy (each for the envs it acts in)."""
        for policy, env_indices in self.groups:
            policy.reset_noise(len(env_indices))

    def act(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Actions, behavior values and behavior log-probs for all envs, each env acting with its version."""
        if len(self.groups) == 1:
            return self.groups[0][0](obs)
        n_envs = len(self.env_versions)
        actions: th.Tensor | None = None
        values = th.zeros((n_envs, 1), device=self.groups[0][1].device)
        log_probs = th.zeros(n_envs, device=values.device)
        for policy, env_indices in self.groups:
            group_actions, group_values, group_log_probs = policy(_index_obs(obs, env_indices))
            if actions is None:
                actions = th.zeros((n_envs, *group_actions.shape[1:]), dtype=group_actions.dtype, device=values.device)
            actions[env_indices] = group_actions
            values[env_indices] = group_values
            log_probs[env_indices] = group_log_probs
        assert actions is not None
        return actions, values, log_probs

    def predict_values(self, obs: PyTorchObs, env_indices: th.Tensor | None = None) -> th.Tensor:
        """Values of the behavior critics for ``obs`` of the given envs (all envs by default)."""
        if len(self.groups) == 1:
            return self.groups[0][0].predict_values(obs)
        if env_indices is None:
            env_indices = th.arange(len(self.env_versions), device=self.groups[0][1].device)
        values = th.zeros((len(env_indices), 1), device=env_indices.device)
        for policy, group_envs in self.groups:
            rows = th.isin(env_indices, group_envs)
            if rows.any():
                values[rows] = policy.predict_values(_index_obs(obs, rows))
        return values


class LaggedOnPolicyAlgorithm(OnPolicyAlgorithm):
    """
    An SB3 on-policy algorithm whose rollouts come from stale policies (injected policy lag).
    Subclass it directly (``VACO``) or in front of an existing algorithm (``class LaggedPPO(LaggedOnPolicyAlgorithm, PPO)``).

    The subclass sets ``self.policy_lag`` before the model is set up. Rollouts are
    collected by :class:`PolicyLag`'s acting policies into a :class:`LaggedRolloutBuffer` that stores the
    behavior log-probs and versions. ``bootstrap_at_train_time`` chooses how time-limit truncations are
    bootstrapped: ``False`` adds ``γ·V_μ(terminal obs)`` of the *behavior* critic to the reward at
    collection time (SB3's way, what naive asynchronous PPO does); ``True`` keeps the terminal observation
    in the buffer so the learner's critic can bootstrap at train time (VACO).

    With ``n_actors > 0`` the rollouts come from asynchronous actors instead (see ``docs/actors.md``);
    the subclass passes ``n_actors``, ``actor_backend`` and ``actor_backend_kwargs`` to this constructor.

    :param policy: the policy model to use
    :param env: the environment to learn from (with actors: also what the actors build, if it is an env id)
    :param args: the parent algorithm's positional arguments
    :param n_actors: 0: synchronous collection (with injected ``policy_lag``); ``> 0``: that many asynchronous actors
    :param actor_backend: ``"process"`` (local processes) or ``"ray"``
    :param actor_backend_kwargs: actor settings (:class:`~sb3_vaco.common.actors.base.ActorSettings`)
    :param kwargs: the parent algorithm's keyword arguments
    """

    bootstrap_at_train_time: bool = False
    policy_lag: PolicyLagSpec
    batch_size: int
    rollout_buffer: LaggedRolloutBuffer
    _policy_lag: PolicyLag

    def __init__(
        self,
        policy: Any,
        env: GymEnv | str,
        *args: Any,
        n_actors: int = 0,
        actor_backend: str = "process",
        actor_backend_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # Set before the parent constructor, which may build the model.
        self.n_actors = n_actors
        self.actor_backend = actor_backend
        self.actor_backend_kwargs = actor_backend_kwargs
        self._actor_settings: ActorSettings = parse_actor_settings(n_actors, actor_backend, actor_backend_kwargs)
        self._actor_env_id = env if isinstance(env, str) else None  # what the actors build by default
        self._actors: ActorPool | None = None
        super().__init__(policy, env, *args, **kwargs)

    def _setup_model(self) -> None:
        if self.rollout_buffer_class is None:
            is_dict = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = LaggedDictRolloutBuffer if is_dict else LaggedRolloutBuffer
        self._setup_actors()
        super()._setup_model()
        if not issubclass(self.rollout_buffer_class, LaggedRolloutBuffer):
            raise ValueError(
                f"`rollout_buffer_class` must be a subclass of LaggedRolloutBuffer, got {self.rollout_buffer_class.__name__}"
            )
        self._policy_lag = PolicyLag(self.policy_lag, seed=self.seed)
        # Mean staleness (in policy versions) of the samples in the current rollout, measured at collection.
        self._rollout_policy_lag = 0.0

    def _learner_tv_to_behavior(self) -> float:
        """``½·mean|π_T/μ − 1|`` over the rollout: how far the learner is from the policies that acted."""
        if not self._policy_lag.enabled and self.n_actors == 0:
            return 0.0
        buffer = self.rollout_buffer
        self.policy.set_training_mode(False)
        with th.no_grad():
            _, learner_log_probs = self._evaluate_rollout(buffer.flat_observations(), buffer.flat_actions())
        self.policy.set_training_mode(True)
        log_rhos = buffer.flat_to_time_major(learner_log_probs) - buffer.time_major("log_probs")
        return float(0.5 * np.mean(np.abs(np.exp(np.clip(log_rhos, -MAX_LOG_RATIO, MAX_LOG_RATIO)) - 1.0)))

    def _evaluate_rollout(self, observations: Observation, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Learner values and log-probs of every stored sample, in chunks, without gradient."""
        n_samples = len(actions)
        values, log_probs = np.zeros(n_samples, dtype=np.float32), np.zeros(n_samples, dtype=np.float32)
        for start in range(0, n_samples, _EVAL_CHUNK):
            rows = slice(start, start + _EVAL_CHUNK)
            obs = {key: o[rows] for key, o in observations.items()} if isinstance(observations, dict) else observations[rows]
            chunk_actions = th.as_tensor(actions[rows].astype(np.float32, copy=False), device=self.device)
            if isinstance(self.action_space, spaces.Discrete):
                chunk_actions = chunk_actions.long().flatten()
            chunk_values, chunk_log_probs, _ = self.policy.evaluate_actions(obs_as_tensor(obs, self.device), chunk_actions)
            values[rows] = chunk_values.flatten().cpu().numpy()
            log_probs[rows] = chunk_log_probs.cpu().numpy()
        return values, log_probs

    def _excluded_save_params(self) -> list[str]:
        # The snapshot ring and the actors are runtime state: after `load()`, lag builds up again from the loaded
        # parameters, and actors start at the next `learn()`.
        return [*super()._excluded_save_params(), "_policy_lag", "_rollout_policy_lag", "_actors", "_actor_settings"]

    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:
        """
        ``OnPolicyAlgorithm.collect_rollouts`` with the acting policy chosen by :class:`PolicyLag`.
        Copied from SB3 2.9 because SB3 offers no hook for the acting policy; the changes are marked ``lag:``.
        With ``policy_lag=0`` it makes exactly the same calls, in the same order, as SB3's.
        With ``n_actors > 0`` the rollout comes from the actors instead (:meth:`_collect_rollouts_from_actors`).
        """
        if self.n_actors > 0:
            return self._collect_rollouts_from_actors(callback, rollout_buffer)
        assert self._last_obs is not None, "No previous observation was provided"
        assert isinstance(rollout_buffer, LaggedRolloutBuffer)
        lag: PolicyLag = self._policy_lag
        # Switch to eval mode (this affects batch norm / dropout)
        self.policy.set_training_mode(False)
        # lag: choose the acting policy of each env for this rollout
        lag.start_rollout(self.policy, self._n_updates, env.num_envs)

        n_steps = 0
        rollout_buffer.reset()
        # Sample new weights for the state dependent exploration
        if self.use_sde:
            lag.reset_noise()

        callback.on_rollout_start()

        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                # Sample a new noise matrix
                lag.reset_noise()

            with th.no_grad():
                # Convert to pytorch tensor or to TensorDict
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                action_tensor, values, log_probs = lag.act(obs_tensor)  # lag: behavior policies act
            actions = action_tensor.cpu().numpy()

            # Rescale and perform action
            clipped_actions = actions

            if isinstance(self.action_space, spaces.Box):
                if self.policy.squash_output:
                    # Unscale the actions to match env bounds
                    # if they were previously squashed (scaled in [-1, 1])
                    clipped_actions = self.policy.unscale_action(clipped_actions)
                else:
                    # Otherwise, clip the actions to avoid out of bound error
                    # as we are sampling from an unbounded Gaussian distribution
                    clipped_actions = np.clip(actions, self.action_space.low, self.action_space.high)

            new_obs, rewards, dones, infos = env.step(clipped_actions)

            self.num_timesteps += env.num_envs

            # Give access to local variables
            callback.update_locals(locals())
            if not callback.on_step():
                return False

            self._update_info_buffer(infos, dones)
            n_steps += 1

            if isinstance(self.action_space, spaces.Discrete):
                # Reshape in case of discrete action
                actions = actions.reshape(-1, 1)

            # Handle timeout by bootstrapping with value function
            # see GitHub issue #633
            for idx, done in enumerate(dones):
                if (
                    done
                    and infos[idx].get("terminal_observation") is not None
                    and infos[idx].get("TimeLimit.truncated", False)
                ):
                    if self.bootstrap_at_train_time:
                        # lag: keep the observation, the learner's critic bootstraps it at train time
                        rollout_buffer.add_truncation(idx, infos[idx]["terminal_observation"])
                        continue
                    terminal_obs = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                    with th.no_grad():
                        # lag: the critic of the policy that acted in this env
                        terminal_value = lag.predict_values(terminal_obs, th.tensor([idx], device=self.device))[0]
                    rewards[idx] += self.gamma * terminal_value

            rollout_buffer.add(
                self._last_obs,  # type: ignore[arg-type]
                actions,
                rewards,
                self._last_episode_starts,  # type: ignore[arg-type]
                values,
                log_probs,
                behavior_version=lag.env_versions,  # lag: which policy version acted
            )
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones

        with th.no_grad():
            # Compute value for the last timestep
            values = lag.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]  # lag: behavior critics

        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        rollout_buffer.set_bootstrap(new_obs, dones)  # type: ignore[arg-type]  # lag: for re-estimation at train time
        self._record_lag(lag)

        callback.update_locals(locals())

        callback.on_rollout_end()

        return True

    def _record_lag(self, lag: PolicyLag) -> None:
        """Log the measured staleness of this rollout, in policy versions and in gradient steps."""
        self._record_lag_stats(lag.version, lag.version - lag.env_versions, lag.env_lag_epochs)

    def _record_lag_stats(self, version: int, versions_behind: np.ndarray, lag_epochs: np.ndarray) -> None:
        """Log the staleness per env column: in policy versions, and in gradient steps (epochs × minibatches per epoch)."""
        minibatches_per_epoch = int(np.ceil(self.n_steps * self.n_envs / self.batch_size))
        self._rollout_policy_lag = float(np.mean(versions_behind))
        self.logger.record("rollout/policy_version", version)
        self.logger.record("rollout/policy_lag_mean", float(np.mean(versions_behind)))
        self.logger.record("rollout/policy_lag_max", int(np.max(versions_behind)))
        self.logger.record("rollout/policy_lag_grad_steps_mean", float(np.mean(lag_epochs)) * minibatches_per_epoch)

    # ------------------------------------------------------------------------------------------------------------
    # Asynchronous actors (n_actors > 0); see sb3_vaco/common/actors/ and docs/actors.md

    def _setup_actors(self) -> None:
        """Validate the actor settings; with actors, the buffer's columns are the actors' envs."""
        self._actor_settings = parse_actor_settings(self.n_actors, self.actor_backend, self.actor_backend_kwargs)
        self._actors = None
        if self.n_actors == 0:
            return
        if parse_policy_lag(self.policy_lag) != (0, 0):
            raise ValueError(
                f"`policy_lag` must be 0 when n_actors > 0 (the actors' lag is real, not injected), got {self.policy_lag!r}"
            )
        self.n_envs = self._actor_settings.n_envs
        if self.env is not None:
            self._actor_env_fn()
            vec_wrappers_of(self.env)

    def _rollout_n_envs(self) -> int:
        """Columns of the rollout buffer: the envs of all actors with actors, else the env's."""
        if self.n_actors > 0:
            return self._actor_settings.n_envs
        assert self.env is not None
        return self.env.num_envs

    def _actor_env_fn(self) -> Any:
        """The env id or factory the actors build their envs from (checked to be picklable)."""
        env_fn = self._actor_settings.env_fn if self._actor_settings.env_fn is not None else self._actor_env_id
        if env_fn is None:
            hint = ""
            try:
                spec = self.env.get_attr("spec", indices=[0])[0] if self.env is not None else None
                hint = f", e.g. actor_backend_kwargs={{'env_fn': {spec.id!r}}}" if spec is not None else ""
            except Exception:  # the env has no registered spec: no hint
                pass
            raise ValueError(
                "With n_actors > 0 the actors build their own envs: pass `env` as an env id string, or an env factory as "
                f"actor_backend_kwargs={{'env_fn': ...}} (an env id or a picklable callable returning a gym.Env){hint}"
            )
        pickle_env_fn(env_fn)
        return env_fn

    def _collect_rollouts_from_actors(self, callback: BaseCallback, rollout_buffer: RolloutBuffer) -> bool:
        """
        ``collect_rollouts`` with asynchronous actors: publish the learner's parameters if it was updated since the
        last batch, take the next ``n_actors`` segments (whichever actors and versions produced them), then replay
        them step by step into the buffer exactly as a synchronous rollout of ``n_actors * n_envs_per_actor`` envs is
        stored: the same ``add()`` calls and truncation handling, the episode-info buffer, and ``callback.on_step()``
        once per step row (``num_timesteps`` advanced by the ``n_envs`` transitions of the row). The callbacks thus
        run in a burst once the batch has arrived; returning False stops training as usual.
        """
        assert isinstance(rollout_buffer, LaggedRolloutBuffer) and self.env is not None
        if self._actors is None:
            self._actors = ActorPool(
                self._actor_settings,
                self._actor_env_fn(),
                self.env,
                self.policy,
                self.n_steps,
                self.use_sde,
                self.sde_sample_freq,
                self.seed,
            )
        pool = self._actors
        self.policy.set_training_mode(False)
        vec_normalize = self.get_vec_normalize_env()
        pool.publish(self.policy, self._n_updates, vec_normalize)  # a new version after every train()
        rollout_buffer.reset()
        callback.on_rollout_start()
        batch = pool.collect(self.n_actors, vec_normalize)

        for step in range(self.n_steps):
            rewards = batch.rewards[step].copy()
            dones = batch.dones[step]
            infos = batch.infos(step)
            self.num_timesteps += batch.n_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            actions = batch.actions[step]
            if isinstance(self.action_space, spaces.Discrete):
                actions = actions.reshape(-1, 1)
            for idx, info in enumerate(infos):
                if "terminal_observation" in info:  # time-limit truncations only
                    if self.bootstrap_at_train_time:
                        rollout_buffer.add_truncation(idx, info["terminal_observation"])
                    else:
                        rewards[idx] += self.gamma * batch.truncations[(step, idx)][1]  # the behavior critic's value
            rollout_buffer.add(
                batch.observations_at(step),
                actions,
                rewards,
                batch.episode_starts[step],
                th.as_tensor(batch.values[step]),
                th.as_tensor(batch.log_probs[step]),
                behavior_version=batch.versions,
            )

        rollout_buffer.compute_returns_and_advantage(last_values=th.as_tensor(batch.last_values), dones=batch.last_dones)
        rollout_buffer.set_bootstrap(batch.last_observations, batch.last_dones)
        lag_epochs = self._n_updates - np.array([pool.version_n_updates[version] for version in batch.versions])
        self._record_lag_stats(pool.version, pool.version - batch.versions, lag_epochs)
        self.logger.record("rollout/actor_restarts", pool.restarts)
        self.logger.record("rollout/actor_segments_dropped", pool.dropped_segments)
        self.logger.record("rollout/actor_wait_time", pool.wait_seconds)

        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def close_actors(self) -> None:
        """Stop the actors, if any are running (``learn()`` does it when it returns or raises)."""
        if self._actors is not None:
            self._actors.close()
            self._actors = None

    def learn(self: SelfLaggedOnPolicyAlgorithm, *args: Any, **kwargs: Any) -> SelfLaggedOnPolicyAlgorithm:
        """The parent's ``learn()``; actors (if any) are shut down when it returns or raises, Ctrl-C included."""
        try:
            return super().learn(*args, **kwargs)
        finally:
            self.close_actors()

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        if self.n_actors == 0:
            super().set_env(env, force_reset)
            return
        # SB3 requires env.num_envs == n_envs; with actors, n_envs counts the actors' envs, not the learner's env.
        self.n_envs = env.num_envs if isinstance(env, VecEnv) else 1
        try:
            super().set_env(env, force_reset)
            vec_wrappers_of(self.env)  # type: ignore[arg-type]
        finally:
            self.n_envs = self._actor_settings.n_envs

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        if not (progress_bar and self.n_actors > 0):
            return super()._init_callback(callback, progress_bar)
        # SB3's bar advances by the learner env's num_envs per on_step(); with actors a step row has n_envs transitions.
        if isinstance(callback, list):
            callback = CallbackList(callback)
        if not isinstance(callback, BaseCallback):
            callback = ConvertCallback(callback)
        return super()._init_callback(CallbackList([callback, ActorProgressBarCallback()]), progress_bar=False)
