"""Learning sanity (slow: run with `pytest -m slow`). The default suite excludes it; results: README, "Results"."""

import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.utils import LinearSchedule

from sb3_vaco import VACO

# rl-zoo3's tuned PPO settings for CartPole-v1, with VACO's defaults (decoupled TV filter, δ = 0.05).
CARTPOLE = dict(
    n_steps=32,
    batch_size=256,
    gae_lambda=0.8,
    gamma=0.98,
    n_epochs=20,
    ent_coef=0.0,
    learning_rate=LinearSchedule(1e-3, 0.0, 1.0),
)
BUDGET = 100_000


@pytest.mark.slow
@pytest.mark.parametrize("policy_lag", [0, 4])
def test_vaco_solves_cartpole(policy_lag):
    # The median over 3 seeds: at lag 4 a single seed can fail (with the defaults seed 0 ended at 203, seeds 1-4 at
    # 492-500; LaggedPPO at 500 in all five): the check is that VACO learns, not that every seed does.
    returns = []
    for seed in (0, 1, 2):
        env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
        model = VACO("MlpPolicy", env, policy_lag=policy_lag, seed=seed, **CARTPOLE).learn(BUDGET)
        mean_return, _ = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=100), n_eval_episodes=10)
        returns.append(float(mean_return))
    assert float(np.median(returns)) >= 475, f"lag {policy_lag}: mean returns {returns} after {BUDGET} steps"
