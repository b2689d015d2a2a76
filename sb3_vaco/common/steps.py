"""
The pieces of SB3's env-step loop (``OnPolicyAlgorithm.collect_rollouts``) that run on *both* sides of the actors,
written once: the synchronous rollout (:class:`~sb3_vaco.common.lagged.LaggedOnPolicyAlgorithm`) and the actor loop
(:class:`~sb3_vaco.actors.worker.ActorWorker`) use them to act and to recognize time-limit truncations; the
learner-side storing of a step (:class:`~sb3_vaco.common.collect.RolloutWriter`) is shared by the synchronous rollout
and the replay of actor segments.
"""

from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy

from sb3_vaco.common.buffers import Observation


def env_actions(policy: BasePolicy, actions: np.ndarray) -> np.ndarray:
    """
    The actions to pass to ``env.step()`` for actions sampled by ``policy``: SB3's rescaling of squashed actions or
    clipping of Gaussian ones to the action space (``OnPolicyAlgorithm.collect_rollouts``, SB3 2.9).

    :param policy: the policy that sampled the actions
    :param actions: the sampled actions (stored unclipped in the buffer)
    """
    # Rescale and perform action
    clipped_actions = actions
    if isinstance(policy.action_space, spaces.Box):
        if policy.squash_output:
            # Unscale the actions to match env bounds
            # if they were previously squashed (scaled in [-1, 1])
            clipped_actions = policy.unscale_action(clipped_actions)
        else:
            # Otherwise, clip the actions to avoid out of bound error
            # as we are sampling from an unbounded Gaussian distribution
            clipped_actions = np.clip(actions, policy.action_space.low, policy.action_space.high)
    return clipped_actions


def time_limit_truncations(dones: np.ndarray, infos: list[dict[str, Any]]) -> list[tuple[int, Observation]]:
    """
    ``(env index, terminal observation)`` of the envs whose episode a time limit cut at this step: SB3's rule for
    bootstrapping a timeout with the value function (``OnPolicyAlgorithm.collect_rollouts``: a
    truncated episode is not a terminal state).

    :param dones: the ``dones`` of a VecEnv step
    :param infos: its ``infos``
    """
    return [
        (idx, infos[idx]["terminal_observation"])
        for idx, done in enumerate(dones)
        if done and infos[idx].get("terminal_observation") is not None and infos[idx].get("TimeLimit.truncated", False)
    ]
