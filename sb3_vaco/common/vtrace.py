"""V-trace (Espeholt et al., 2018) as a pure tensor function: VACO's "Align" step."""

from typing import NamedTuple

import numpy as np
import torch as th


class VTraceReturns(NamedTuple):
    """
    :param value_targets: ``v_t``, the V-trace targets for the critic, shape ``[T, N]``
    :param advantages: ``r_t + γ·v_{t+1} − V(s_t)``, the advantages of the learner policy, shape ``[T, N]``
    :param clipped_rhos: ``ρ_t = min(ρ̄, π/μ)``, shape ``[T, N]``
    """

    value_targets: th.Tensor
    advantages: th.Tensor
    clipped_rhos: th.Tensor


def vtrace(
    log_rhos: th.Tensor,
    rewards: th.Tensor,
    values: th.Tensor,
    next_values: th.Tensor,
    dones: th.Tensor,
    gamma: float,
    gae_lambda: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> VTraceReturns:
    """
    V-trace targets and policy advantages for time-major ``[T, N]`` tensors
    (IMPALA, Espeholt et al. 2018, Eq. 1 and Sec. 4.2, with the λ of their Remark 2)::

        ρ_t = min(ρ̄, π(a_t|s_t)/μ(a_t|s_t))        c_t = λ·min(c̄, π(a_t|s_t)/μ(a_t|s_t))
        δ_t = ρ_t·(r_t + γ·V(s_{t+1}) − V(s_t))
        v_t − V(s_t) = δ_t + γ·c_t·(1 − done_t)·(v_{t+1} − V(s_{t+1}))
        A_t = r_t + γ·v'_{t+1} − V(s_t)

    where ``v'_{t+1}`` is ``v_{t+1}`` inside an episode and the bootstrap value ``next_values[t]``
    across an episode boundary or at the end of the rollout.

    With ``log_rhos = 0`` and ``rho_bar, c_bar ≥ 1`` the targets are the TD(λ) returns, i.e. exactly what
    SB3's ``RolloutBuffer.compute_returns_and_advantage`` stores in ``returns`` (GAE + values).

    :param log_rhos: ``log π(a_t|s_t) − log μ(a_t|s_t)``, learner vs behavior log-probs
    :param rewards: ``r_t``, without any bootstrap added in
    :param values: ``V(s_t)`` of the learner's critic
    :param next_values: ``V(s_{t+1})``; must already be 0 where the episode *terminated* after step t,
        and ``V(terminal observation)`` where it was *truncated* (time limit).
    :param dones: 1 where an episode ended (terminated or truncated) after step t: the trace is cut there
    :param gamma: discount factor γ
    :param gae_lambda: trace decay λ
    :param rho_bar: truncation ρ̄ of the importance weight in the TD error
    :param c_bar: truncation c̄ of the trace coefficient
    :return: V-trace value targets, policy advantages and the truncated importance weights
    """
    rhos = th.exp(log_rhos)
    clipped_rhos = th.clamp(rhos, max=rho_bar)
    cs = gae_lambda * th.clamp(rhos, max=c_bar)
    not_dones = 1.0 - dones.float()
    deltas = clipped_rhos * (rewards + gamma * next_values - values)

    # Backward recursion on the corrections v_t − V(s_t); at t = T − 1 the trace stops at the bootstrap.
    # The loop runs in numpy: per-step torch ops cost ~10x more for [n_envs]-sized rows.
    step_deltas = deltas.detach().cpu().numpy()
    decays = (gamma * cs * not_dones).detach().cpu().numpy()
    corrections = np.zeros_like(step_deltas)
    correction = np.zeros_like(step_deltas[0])
    for t in reversed(range(len(step_deltas))):
        correction = step_deltas[t] + decays[t] * correction
        corrections[t] = correction
    value_targets = values + th.as_tensor(corrections, device=values.device)

    # v'_{t+1}: the V-trace target of the next state inside an episode, the bootstrap value otherwise.
    next_targets = next_values.clone()
    next_targets[:-1] = th.where(not_dones[:-1].bool(), value_targets[1:], next_values[:-1])
    advantages = rewards + gamma * next_targets - values
    return VTraceReturns(value_targets, advantages, clipped_rhos)
