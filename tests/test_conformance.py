"""
SB3's contracts, kept by every public algorithm of the package (the ``any_algo`` fixture runs each test once per
class): spaces, parameters, checkpoints, the parent library's loaders, VecNormalize, tensorboard names, seeding.
"""

import io
import warnings
import zipfile

import numpy as np
import pytest
import torch as th
from sb3_contrib import TRPO
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import (
    IdentityEnv,
    IdentityEnvBox,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
    SimpleMultiObsEnv,
)
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.vec_env import VecNormalize

from sb3_vaco import LaggedPPO, LaggedTRPO
from sb3_vaco.common.checkpoint import LAG_STATE_MEMBER

SPACES = {
    "box": (lambda: IdentityEnvBox(ep_length=20), "MlpPolicy"),
    "discrete": (lambda: IdentityEnv(4), "MlpPolicy"),
    "multidiscrete": (lambda: IdentityEnvMultiDiscrete(3), "MlpPolicy"),
    "multibinary": (lambda: IdentityEnvMultiBinary(3), "MlpPolicy"),
    "dict": (SimpleMultiObsEnv, "MultiInputPolicy"),
}


def trained(algo, tiny, env_id="CartPole-v1", policy_lag=2, n_envs=2, steps=256, **kwargs):
    env = make_vec_env(env_id, n_envs=n_envs, seed=0)
    return algo("MlpPolicy", env, seed=0, policy_lag=policy_lag, **tiny(algo), **kwargs).learn(steps)


def same_actions(model, other, env) -> None:
    observations = env.reset()
    np.testing.assert_array_equal(
        model.predict(observations, deterministic=True)[0], other.predict(observations, deterministic=True)[0]
    )


def parent_of(algo) -> type:
    """The class of the library that the checkpoint is for: sb3-contrib's TRPO for LaggedTRPO, SB3's PPO for the rest."""
    return TRPO if issubclass(algo, LaggedTRPO) else PPO


@pytest.mark.parametrize("space", sorted(SPACES))
def test_learns_and_predicts_on_every_space(any_algo, tiny, space):
    make_env, policy = SPACES[space]
    env = make_vec_env(make_env, n_envs=2, seed=0)
    model = any_algo(policy, env, seed=0, policy_lag=1, **tiny(any_algo)).learn(128)
    assert all(th.all(th.isfinite(p)) for p in model.policy.parameters())
    action, _ = model.predict(env.reset())
    assert env.action_space.contains(action[0])


def test_parameters_are_the_policy_and_optimizer_state_dicts(any_algo, tiny):
    model = trained(any_algo, tiny)
    params = model.get_parameters()
    assert set(params) == {"policy", "policy.optimizer"}
    other = any_algo("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=1), seed=1, **tiny(any_algo))
    other.set_parameters(params, exact_match=True)
    same_actions(model, other, make_vec_env("CartPole-v1", n_envs=2, seed=5))
    with pytest.raises(ValueError, match=r"policy\.optimizer"):
        other.set_parameters({"policy": params["policy"]}, exact_match=True)
    other.set_parameters({"policy": params["policy"]}, exact_match=False)
    with pytest.raises(ValueError, match="invalid object name"):
        other.set_parameters({**params, "no_such_object": {}}, exact_match=True)


@pytest.mark.parametrize("with_env", [True, False])
def test_save_load_continue(any_algo, tiny, tmp_path, with_env):
    model = trained(any_algo, tiny)
    model.save(tmp_path / "model")
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    loaded = any_algo.load(tmp_path / "model", env=env if with_env else None)
    assert type(loaded) is any_algo and loaded.policy_lag == 2 and loaded.n_steps == model.n_steps
    same_actions(model, loaded, env)
    if not with_env:
        loaded.set_env(env)
    loaded.learn(64, reset_num_timesteps=False)
    assert loaded.num_timesteps == model.num_timesteps + 64


def test_the_parent_library_loads_the_checkpoint(any_algo, tiny, tmp_path):
    """
    A checkpoint loads with the parent library's own class (TRPO for LaggedTRPO, PPO for the rest) and acts the same;
    the policy alone loads into SB3's ActorCriticPolicy: deployment needs no sb3_vaco.
    """
    model = trained(any_algo, tiny)
    model.save(tmp_path / "model.zip")
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    parent = parent_of(any_algo).load(tmp_path / "model.zip", env=env)
    same_actions(model, parent, env)
    model.policy.save(tmp_path / "policy.pt")
    policy = ActorCriticPolicy.load(tmp_path / "policy.pt")
    observations = env.reset()
    actions = policy.predict(observations, deterministic=True)[0]
    np.testing.assert_array_equal(actions, parent.predict(observations, deterministic=True)[0])


@pytest.mark.parametrize("algo", [LaggedPPO, LaggedTRPO])
def test_lagged_host_checkpoint_trains_on_in_the_parent(algo, tiny, tmp_path):
    """LaggedPPO and LaggedTRPO are PPO and TRPO: their checkpoints go on training there, with the parent's buffer."""
    trained(algo, tiny).save(tmp_path / "model.zip")
    parent = parent_of(algo).load(tmp_path / "model.zip", env=make_vec_env("CartPole-v1", n_envs=2, seed=0))
    assert type(parent.rollout_buffer).__name__ == "RolloutBuffer"
    parent.learn(64)


def test_lag_state_is_a_member_of_its_own_and_optional(any_algo, tiny, tmp_path):
    model = trained(any_algo, tiny, policy_lag=4)
    model.save(tmp_path / "with.zip")
    model.save(tmp_path / "without.zip", include_lag_state=False)
    with zipfile.ZipFile(tmp_path / "with.zip") as archive:
        assert LAG_STATE_MEMBER in archive.namelist() and "_policy_lag.pth" not in archive.namelist()
    assert (tmp_path / "without.zip").stat().st_size < (tmp_path / "with.zip").stat().st_size
    with pytest.warns(UserWarning, match="starts the lag afresh"):
        any_algo.load(tmp_path / "without.zip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        any_algo.load(tmp_path / "with.zip")
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    loaded = any_algo.load(buffer)
    assert loaded._policy_lag.ring.versions == model._policy_lag.ring.versions


def test_vecnormalize_statistics_are_saved_and_restored(any_algo, tiny, tmp_path):
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = any_algo("MlpPolicy", env, seed=0, policy_lag=1, **tiny(any_algo)).learn(256)
    assert env.obs_rms.count > 256  # the lagged collection normalizes through the learner's VecNormalize
    model.save(tmp_path / "model.zip")
    env.save(str(tmp_path / "vecnormalize.pkl"))
    restored = VecNormalize.load(str(tmp_path / "vecnormalize.pkl"), make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    np.testing.assert_array_equal(restored.obs_rms.mean, env.obs_rms.mean)
    loaded = any_algo.load(tmp_path / "model.zip", env=restored)
    assert loaded.get_vec_normalize_env() is restored


def test_tensorboard_run_is_named_after_the_class(any_algo, tiny, tmp_path):
    trained(any_algo, tiny, steps=64, tensorboard_log=str(tmp_path))
    assert [path.name for path in tmp_path.iterdir()] == [f"{any_algo.__name__}_1"]


def test_same_seed_same_result(any_algo, tiny):
    first, second = (trained(any_algo, tiny, policy_lag=(0, 2)) for _ in range(2))
    for a, b in zip(first.policy.parameters(), second.policy.parameters(), strict=True):
        assert th.equal(a, b)
