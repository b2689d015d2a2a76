"""Rollout buffers that also keep what off-policy re-estimation needs: behavior versions, bootstrap observations."""

from collections.abc import Generator
from typing import Any, NamedTuple

import numpy as np
import torch as th
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import TensorDict
from stable_baselines3.common.vec_env import VecNormalize

Observation = np.ndarray | dict[str, np.ndarray]


class LaggedRolloutBufferSamples(NamedTuple):
    """SB3's ``RolloutBufferSamples`` plus the learner's log-prob at the start of the update."""

    observations: th.Tensor | TensorDict
    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor  # log μ(a|s), the policy that acted
    advantages: th.Tensor
    returns: th.Tensor
    learner_log_prob: th.Tensor  # log π_T(a|s), the learner when the update started


class LaggedRolloutBuffer(RolloutBuffer):
    """
    ``RolloutBuffer`` for lagged / asynchronous rollouts.

    Besides SB3's arrays it stores, per step and env, the version of the policy that acted
    (``behavior_versions``; ``log_probs`` holds that policy's log-probs), the learner's log-probs
    (``learner_log_probs``, filled at train time), and what a critic needs to bootstrap *at train time*:
    the observation after the last step, the done flags of the last step, and the terminal observations
    of time-limit truncations. Works for Dict observations through ``LaggedDictRolloutBuffer``.

    Re-estimation runs on time-ordered ``[n_steps, n_envs]`` arrays: use :meth:`time_major` and
    :meth:`set_time_major`, which work before and after ``get()`` has flattened the arrays in place.
    """

    behavior_versions: np.ndarray
    learner_log_probs: np.ndarray
    truncation_observations: dict[tuple[int, int], Observation]
    last_observations: Observation | None
    last_dones: np.ndarray | None

    _extra_flattened = ("behavior_versions", "learner_log_probs", "rewards", "episode_starts")

    def reset(self) -> None:
        self.behavior_versions = np.zeros((self.buffer_size, self.n_envs), dtype=np.int64)
        self.learner_log_probs = np.zeros((self.buffer_size, self.n_envs), dtype=np.float32)
        self.truncation_observations = {}
        self.last_observations = None
        self.last_dones = None
        super().reset()

    def add(  # type: ignore[override]
        self, *args: Any, behavior_version: np.ndarray | int = 0, **kwargs: Any
    ) -> None:
        """SB3's ``add()`` plus the version of the policy that acted in each env."""
        self.behavior_versions[self.pos] = behavior_version
        super().add(*args, **kwargs)

    def add_truncation(self, env_idx: int, terminal_observation: Observation) -> None:
        """Keep the terminal observation of a time-limit truncation at the current step, for a later bootstrap."""
        self.truncation_observations[(self.pos, env_idx)] = terminal_observation

    def set_bootstrap(self, last_observations: Observation, last_dones: np.ndarray) -> None:
        """Keep the observation after the last step and whether the last step ended an episode."""
        self.last_observations = last_observations
        self.last_dones = np.asarray(last_dones, dtype=np.float32).copy()

    # Time-major access, valid before and after `get()` flattens [T, N, ...] into [N * T, ...] in place.
    def time_major(self, name: str) -> np.ndarray:
        """A ``[n_steps, n_envs]`` view of a per-step scalar array such as ``rewards`` or ``log_probs``."""
        array = self.__dict__[name]
        if self.generator_ready:
            return array.reshape(self.n_envs, self.buffer_size).swapaxes(0, 1)
        return array.reshape(self.buffer_size, self.n_envs)

    def set_time_major(self, name: str, values: np.ndarray) -> None:
        """Write a ``[n_steps, n_envs]`` array into a per-step scalar array, in the buffer's current layout."""
        self.time_major(name)[...] = values

    def flat_observations(self) -> Observation:
        """All observations as ``[n_steps * n_envs, ...]`` in the buffer's current layout (see :meth:`time_major`)."""
        if isinstance(self.observations, dict):
            return {key: self.flat_array(obs) for key, obs in self.observations.items()}
        return self.flat_array(self.observations)

    def flat_actions(self) -> np.ndarray:
        return self.flat_array(self.actions)

    def flat_array(self, array: np.ndarray) -> np.ndarray:
        """A per-step array of the buffer (``[n_steps, n_envs, ...]`` before ``get()``) as ``[n_steps * n_envs, ...]``."""
        if self.generator_ready:
            return array
        return array.reshape(self.buffer_size * self.n_envs, *array.shape[2:])

    def flat_to_time_major(self, flat: np.ndarray) -> np.ndarray:
        """Inverse of the flat layout: ``[n_steps * n_envs]`` → ``[n_steps, n_envs]``."""
        if self.generator_ready:
            return flat.reshape(self.n_envs, self.buffer_size).swapaxes(0, 1)
        return flat.reshape(self.buffer_size, self.n_envs)

    def get(  # type: ignore[override]
        self, batch_size: int | None = None
    ) -> Generator[LaggedRolloutBufferSamples, None, None]:
        if not self.generator_ready:
            # The parent flattens its own arrays in place on the first call: flatten ours with them.
            for name in self._extra_flattened:
                self.__dict__[name] = self.swap_and_flatten(self.__dict__[name])
        yield from super().get(batch_size)  # type: ignore[misc]

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None
    ) -> LaggedRolloutBufferSamples:
        samples = super()._get_samples(batch_inds, env)
        learner_log_prob = self.to_torch(self.learner_log_probs[batch_inds].flatten())
        return LaggedRolloutBufferSamples(*samples, learner_log_prob=learner_log_prob)


class LaggedDictRolloutBuffer(LaggedRolloutBuffer, DictRolloutBuffer):  # type: ignore[misc]
    """:class:`LaggedRolloutBuffer` for Dict observation spaces (SB3's ``DictRolloutBuffer`` underneath)."""
