"""
How a rollout is written into the buffer, whoever collects it: the synchronous loop of a lagged algorithm or the
asynchronous actors (a *rollout source*, :class:`RolloutSource`). Both hand every step to a :class:`RolloutWriter`,
the per-step part of SB3's ``OnPolicyAlgorithm.collect_rollouts`` (SB3 2.9, where it is inline), so that a step is
counted, shown to the callbacks, logged and stored the same way wherever it came from.
"""

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from sb3_vaco.common.buffers import LaggedRolloutBuffer, Observation
from sb3_vaco.common.steps import time_limit_truncations


class RolloutWriter:
    """
    Writes one rollout of an on-policy algorithm: the steps, then the lag statistics.

    :param model: the algorithm the rollout is for (its counters, callbacks' view, episode-info buffer and logger)
    :param callback: the rollout's callback
    :param rollout_buffer: the buffer
    :param bootstrap_at_train_time: keep time-limit truncations for the learner's critic (True) instead of adding
        ``γ·V_μ(terminal obs)`` of the behavior critic to the reward (False, SB3's way)
    :param grad_steps_per_update: the policy's gradient steps per count of the learner's ``_n_updates``, to log the
        lag in gradient steps
    """

    def __init__(
        self,
        model: OnPolicyAlgorithm,
        callback: BaseCallback,
        rollout_buffer: LaggedRolloutBuffer,
        bootstrap_at_train_time: bool,
        grad_steps_per_update: int,
    ) -> None:
        self.model = model
        self.callback = callback
        self.rollout_buffer = rollout_buffer
        self.bootstrap_at_train_time = bootstrap_at_train_time
        self.grad_steps_per_update = grad_steps_per_update

    @property
    def n_updates(self) -> int:
        """The learner's update counter (SB3's ``_n_updates``): a new policy version once it changes."""
        return self.model._n_updates

    def step(
        self,
        step_locals: dict[str, Any],
        observations: Observation,
        actions: np.ndarray,
        rewards: np.ndarray,
        episode_starts: np.ndarray,
        dones: np.ndarray,
        infos: list[dict[str, Any]],
        values: th.Tensor,
        log_probs: th.Tensor,
        behavior_versions: np.ndarray,
        behavior_terminal_value: Callable[[int, Observation], th.Tensor | float],
        buffer_inputs: dict[str, np.ndarray] | None = None,
    ) -> bool:
        """
        SB3's step after ``env.step()``: count the transitions, call the callbacks, update the episode-info buffer,
        handle time-limit truncations, add the step to the buffer.

        :param step_locals: the caller's ``locals()`` (what the callbacks see as ``self.locals``)
        :param observations: the observations the policies acted on
        :param actions: the actions as sampled
        :param rewards: the env rewards (a time-limit bootstrap is added in place)
        :param episode_starts: whether each observation starts an episode
        :param dones: the ``dones`` of the step
        :param infos: its ``infos``
        :param values: behavior critic values of ``observations``
        :param log_probs: behavior log-probs of ``actions``
        :param behavior_versions: the policy version that acted, per env
        :param behavior_terminal_value: ``(env index, terminal observation) -> V_μ(terminal observation)`` of the
            policy that acted in that env (used when truncations are bootstrapped at collection time)
        :param buffer_inputs: more per-step arrays the buffer stores (MaskablePPO's ``action_masks``)
        :return: False if a callback stopped training
        """
        model = self.model
        model.num_timesteps += len(dones)

        # Give access to local variables
        self.callback.update_locals(step_locals)
        if not self.callback.on_step():
            return False

        model._update_info_buffer(infos, dones)

        if isinstance(model.action_space, spaces.Discrete):
            # Reshape in case of discrete action
            actions = actions.reshape(-1, 1)

        # Handle timeout by bootstrapping with value function (a truncated episode is not a terminal state)
        for idx, terminal_obs in time_limit_truncations(dones, infos):
            if self.bootstrap_at_train_time:
                # lag: keep the observation, the learner's critic bootstraps it at train time
                self.rollout_buffer.add_truncation(idx, terminal_obs)
            else:
                rewards[idx] += model.gamma * behavior_terminal_value(idx, terminal_obs)

        self.rollout_buffer.add(
            observations,  # type: ignore[arg-type]
            actions,
            rewards,
            episode_starts,
            values,
            log_probs,
            behavior_version=behavior_versions,  # lag: which policy version acted
            **(buffer_inputs or {}),
        )
        return True

    def record_lag(self, version: int, versions_behind: np.ndarray, lag_epochs: np.ndarray) -> None:
        """Log the staleness per env column: in policy versions, and in the policy's gradient steps."""
        model = self.model
        model.logger.record("rollout/policy_version", version)
        model.logger.record("rollout/policy_lag_mean", float(np.mean(versions_behind)))
        model.logger.record("rollout/policy_lag_max", int(np.max(versions_behind)))
        model.logger.record("rollout/policy_lag_grad_steps_mean", float(np.mean(lag_epochs)) * self.grad_steps_per_update)


class RolloutSource(Protocol):
    """Something other than the learner's own env loop that fills a rollout (the asynchronous actors)."""

    def collect_rollouts(self, model: OnPolicyAlgorithm, writer: RolloutWriter) -> bool:
        """Fill ``writer.rollout_buffer`` through ``writer``; False if a callback stopped training."""
        ...
