"""
Injected policy lag: which policy acts in each env. One place, shared by VACO and LaggedPPO.

``policy_lag=K`` makes every env act with the learner's parameters from K updates ago;
``policy_lag=(K_min, K_max)`` gives each env (actor) its own staleness, drawn uniformly per rollout,
so one batch mixes several policy versions, as independent actors with random delays would.
"""

from collections import deque

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import PyTorchObs
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_vaco.common.buffers import LaggedDictRolloutBuffer, LaggedRolloutBuffer, Observation

PolicyLagSpec = int | tuple[int, int] | list[int]
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
    """

    bootstrap_at_train_time: bool = False
    policy_lag: PolicyLagSpec
    batch_size: int
    rollout_buffer: LaggedRolloutBuffer
    _policy_lag: PolicyLag

    def _setup_model(self) -> None:
        if self.rollout_buffer_class is None:
            is_dict = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = LaggedDictRolloutBuffer if is_dict else LaggedRolloutBuffer
        super()._setup_model()
        if not issubclass(self.rollout_buffer_class, LaggedRolloutBuffer):
            raise ValueError(
                f"`rollout_buffer_class` must be a subclass of LaggedRolloutBuffer, got {self.rollout_buffer_class.__name__}"
            )
        self._policy_lag = PolicyLag(self.policy_lag, seed=self.seed)

    def _learner_tv_to_behavior(self) -> float:
        """``½·mean|π_T/μ − 1|`` over the rollout: how far the learner is from the policies that acted."""
        if not self._policy_lag.enabled:
            return 0.0
        buffer = self.rollout_buffer
        self.policy.set_training_mode(False)
        with th.no_grad():
            _, learner_log_probs = self._evaluate_rollout(buffer.flat_observations(), buffer.flat_actions())
        self.policy.set_training_mode(True)
        log_rhos = buffer.flat_to_time_major(learner_log_probs) - buffer.time_major("log_probs")
        return float(0.5 * np.mean(np.abs(np.exp(np.clip(log_rhos, -20, 20)) - 1.0)))

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
        # The snapshot ring is runtime state: after `load()`, lag builds up again from the loaded parameters.
        return [*super()._excluded_save_params(), "_policy_lag"]

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
        """
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
        versions_behind = lag.version - lag.env_versions
        minibatches_per_epoch = int(np.ceil(self.n_steps * self.n_envs / self.batch_size))
        self.logger.record("rollout/policy_version", lag.version)
        self.logger.record("rollout/policy_lag_mean", float(np.mean(versions_behind)))
        self.logger.record("rollout/policy_lag_max", int(np.max(versions_behind)))
        self.logger.record("rollout/policy_lag_grad_steps_mean", float(np.mean(lag.env_lag_epochs)) * minibatches_per_epoch)
