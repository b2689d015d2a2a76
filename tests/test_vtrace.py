import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.buffers import RolloutBuffer

from sb3_vaco.common.vtrace import vtrace

T, N, GAMMA = 17, 3, 0.97


def random_rollout(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dones = (rng.random((T, N)) < 0.15).astype(np.float32)
    truncated = dones * (rng.random((T, N)) < 0.5)
    values = rng.normal(size=(T, N)).astype(np.float32)
    bootstrap = rng.normal(size=N).astype(np.float32)  # V(observation after the rollout)
    terminal_values = rng.normal(size=(T, N)).astype(np.float32)  # V(terminal obs) where truncated
    next_values = np.concatenate([values[1:], bootstrap[None]], axis=0)
    next_values = np.where(dones > 0, np.where(truncated > 0, terminal_values, 0.0), next_values).astype(np.float32)
    return {
        "rewards": rng.normal(size=(T, N)).astype(np.float32),
        "values": values,
        "next_values": next_values,
        "dones": dones,
        "truncated": truncated,
        "terminal_values": terminal_values,
        "bootstrap": bootstrap,
        "log_rhos": rng.normal(scale=0.7, size=(T, N)).astype(np.float32),
    }


def run_vtrace(data: dict[str, np.ndarray], log_rhos: np.ndarray, **kwargs):
    tensors = {k: th.as_tensor(data[k]) for k in ("rewards", "values", "next_values", "dones")}
    return vtrace(th.as_tensor(log_rhos), gamma=GAMMA, **tensors, **kwargs)


def brute_force_vtrace(data, lam: float, rho_bar: float, c_bar: float) -> tuple[np.ndarray, np.ndarray]:
    """The V-trace target as the sum in Espeholt et al. (2018), Eq. 1, written out step by step."""
    ratio = np.exp(data["log_rhos"])
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    delta = rho * (data["rewards"] + GAMMA * data["next_values"] - data["values"])
    targets = np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            total, discount = 0.0, 1.0
            for t in range(s, T):
                total += discount * delta[t, n]
                if data["dones"][t, n]:
                    break
                discount *= GAMMA * c[t, n]
            targets[s, n] = data["values"][s, n] + total
    next_targets = np.concatenate([targets[1:], data["bootstrap"][None]], axis=0)
    next_targets = np.where(data["dones"] > 0, data["next_values"], next_targets)
    advantages = data["rewards"] + GAMMA * next_targets - data["values"]
    return targets, advantages


@pytest.mark.parametrize("lam, rho_bar, c_bar", [(1.0, 1.0, 1.0), (0.9, 1.0, 1.0), (0.95, 2.0, 0.5), (0.5, 0.3, 1.5)])
def test_vtrace_matches_brute_force(lam, rho_bar, c_bar):
    data = random_rollout(seed=1)
    result = run_vtrace(data, data["log_rhos"], gae_lambda=lam, rho_bar=rho_bar, c_bar=c_bar)
    targets, advantages = brute_force_vtrace(data, lam, rho_bar, c_bar)
    np.testing.assert_allclose(result.value_targets.numpy(), targets, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.advantages.numpy(), advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.clipped_rhos.numpy(), np.minimum(rho_bar, np.exp(data["log_rhos"])), rtol=1e-6)


@pytest.mark.parametrize("lam", [0.0, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("bar", [1.0, 3.0])
def test_zero_lag_equals_sb3_gae_returns(lam, bar):
    """Without lag (π = μ) and ρ̄, c̄ ≥ 1, the V-trace targets are the TD(λ) returns of SB3's GAE buffer."""
    data = random_rollout(seed=2)
    buffer = RolloutBuffer(T, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), gamma=GAMMA, gae_lambda=lam, n_envs=N)
    buffer.values = data["values"].copy()
    # SB3 adds γ·V(terminal obs) of a time-limit truncation into the reward at collection time.
    buffer.rewards = data["rewards"] + GAMMA * data["truncated"] * data["terminal_values"]
    buffer.episode_starts = np.concatenate([np.zeros((1, N)), data["dones"][:-1]], axis=0).astype(np.float32)
    buffer.compute_returns_and_advantage(th.as_tensor(data["bootstrap"]), dones=data["dones"][-1])

    result = run_vtrace(data, np.zeros((T, N), dtype=np.float32), gae_lambda=lam, rho_bar=bar, c_bar=bar)
    np.testing.assert_allclose(result.value_targets.numpy(), buffer.returns, rtol=1e-5, atol=1e-5)
    # The policy advantage r_t + γ·v_{t+1} − V(s_t) is GAE's advantage only for λ = 1.
    if lam == 1.0:
        np.testing.assert_allclose(result.advantages.numpy(), buffer.advantages, rtol=1e-5, atol=1e-5)
    else:
        assert not np.allclose(result.advantages.numpy(), buffer.advantages)


def test_episode_boundary_cuts_the_trace():
    """A reward after an episode end must not change the targets of the steps before it."""
    data = random_rollout(seed=3)
    data["dones"][:] = 0.0
    data["dones"][5] = 1.0
    data["next_values"][5] = 0.0  # terminated
    before = run_vtrace(data, data["log_rhos"]).value_targets.clone()
    data["rewards"][6:] += 100.0
    after = run_vtrace(data, data["log_rhos"]).value_targets
    th.testing.assert_close(before[:6], after[:6])
    assert not th.allclose(before[6:], after[6:])


def test_truncation_bootstraps_from_next_values():
    """After a truncation the target uses the given bootstrap value; after a termination, nothing."""
    data = random_rollout(seed=4)
    data["dones"][:] = 0.0
    data["dones"][T - 2] = 1.0
    lam_zero = {"gae_lambda": 0.0}
    data["next_values"][T - 2] = 0.0
    terminated = run_vtrace(data, np.zeros((T, N), dtype=np.float32), **lam_zero).value_targets[T - 2]
    data["next_values"][T - 2] = 10.0
    truncated = run_vtrace(data, np.zeros((T, N), dtype=np.float32), **lam_zero).value_targets[T - 2]
    th.testing.assert_close(truncated - terminated, th.full((N,), GAMMA * 10.0))


def test_stale_action_weights_are_truncated():
    """With ρ̄ = c̄ = 1, an action the learner likes far more than μ cannot scale the TD error beyond 1×."""
    data = random_rollout(seed=5)
    big = np.full((T, N), 5.0, dtype=np.float32)
    unit = run_vtrace(data, np.zeros((T, N), dtype=np.float32))
    truncated = run_vtrace(data, big)
    th.testing.assert_close(unit.value_targets, truncated.value_targets)
    untruncated = run_vtrace(data, big, rho_bar=1e6, c_bar=1e6)
    assert not th.allclose(unit.value_targets, untruncated.value_targets)
