import copy
import random

import numpy as np
import pytest
import torch as th
from conftest import TINY as SHARED_TINY
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from sb3_vaco import APPO, IMPALA, VACO, DecoupledPPO, LaggedPPO, LaggedTRPO
from sb3_vaco.common.lag_spec import parse_policy_lag
from sb3_vaco.common.policy_lag import PolicyLag
from sb3_vaco.common.ring import SnapshotRing

# One minibatch per rollout and a large step, so that consecutive policy versions differ clearly
TINY = {**SHARED_TINY, "n_steps": 16, "learning_rate": 1e-2, "seed": 0}


class RecordRollouts(BaseCallback):
    """Keeps, per rollout, the learner's parameters at its start and what the buffer stored."""

    def __init__(self) -> None:
        super().__init__()
        self.learner_params: list[dict[str, th.Tensor]] = []
        self.rollouts: list[dict[str, np.ndarray]] = []
        self.logged: list[dict[str, float]] = []

    def _on_rollout_start(self) -> None:
        self.learner_params.append(copy.deepcopy(self.model.policy.state_dict()))

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        self.rollouts.append(
            {
                "observations": buffer.observations.copy(),
                "actions": buffer.actions.copy(),
                "log_probs": buffer.log_probs.copy(),
                "versions": buffer.behavior_versions.copy(),
            }
        )
        self.logged.append(dict(self.model.logger.name_to_value))

    def _on_step(self) -> bool:
        return True


def log_probs_under(model, params: dict[str, th.Tensor], observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
    policy = model.policy.__class__(**model.policy._get_constructor_parameters())
    policy.load_state_dict(params)
    obs = th.as_tensor(observations.reshape(-1, *observations.shape[2:]))
    acts = th.as_tensor(actions.reshape(-1, *actions.shape[2:])).long().flatten()
    with th.no_grad():
        _, log_prob, _ = policy.evaluate_actions(obs, acts)
    return log_prob.numpy().reshape(observations.shape[:2])


def train_recorded(algo, policy_lag, n_envs: int = 1, n_rollouts: int = 6) -> tuple[object, RecordRollouts]:
    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0)
    model = algo("MlpPolicy", env, policy_lag=policy_lag, **TINY)
    model.set_logger(configure(None, [""]))
    recorder = RecordRollouts()
    model.learn(TINY["n_steps"] * n_envs * n_rollouts, callback=recorder)
    return model, recorder


@pytest.mark.parametrize("algo", [VACO, LaggedPPO, DecoupledPPO, IMPALA, APPO])
@pytest.mark.parametrize("lag", [0, 1, 3])
def test_behavior_log_probs_come_from_the_snapshot_k_updates_earlier(algo, lag):
    model, recorder = train_recorded(algo, lag)
    for iteration, rollout in enumerate(recorder.rollouts):
        behavior_version = max(iteration - lag, 0)
        assert np.all(rollout["versions"] == behavior_version)
        expected = log_probs_under(
            model, recorder.learner_params[behavior_version], rollout["observations"], rollout["actions"]
        )
        np.testing.assert_allclose(rollout["log_probs"], expected, rtol=1e-5, atol=1e-5)
        if lag > 0 and iteration >= lag:
            # ... and not from the learner that was current when the rollout was collected.
            learner = log_probs_under(model, recorder.learner_params[iteration], rollout["observations"], rollout["actions"])
            assert not np.allclose(rollout["log_probs"], learner)
        logged_lag = recorder.logged[iteration]["rollout/policy_lag_mean"]
        assert logged_lag == iteration - behavior_version


def test_per_env_staleness_ranges_mix_versions_in_one_batch():
    min_lag, max_lag, n_envs = 1, 3, 6
    model, recorder = train_recorded(VACO, (min_lag, max_lag), n_envs=n_envs, n_rollouts=8)
    mixed = 0
    for iteration, rollout in enumerate(recorder.rollouts):
        versions = rollout["versions"]
        assert np.all(versions == versions[0]), "an env keeps one version for the whole rollout"
        staleness = iteration - versions[0]
        assert np.all(staleness >= 0) and np.all(staleness <= max_lag)
        if iteration >= max_lag:
            assert np.all(staleness >= min_lag)
        mixed += len(np.unique(versions[0])) > 1
        for env_idx, version in enumerate(versions[0]):
            expected = log_probs_under(
                model,
                recorder.learner_params[version],
                rollout["observations"][:, [env_idx]],
                rollout["actions"][:, [env_idx]],
            )
            np.testing.assert_allclose(rollout["log_probs"][:, env_idx], expected[:, 0], rtol=1e-5, atol=1e-5)
        assert recorder.logged[iteration]["rollout/policy_lag_max"] == staleness.max()
    assert mixed >= 4, "most batches should mix several policy versions"


def test_lag_zero_copies_nothing():
    model, _ = train_recorded(VACO, 0)
    assert len(model._policy_lag.ring) == 0 and model._policy_lag._behavior_pool == []


def test_ring_keeps_only_the_needed_snapshots():
    model, _ = train_recorded(LaggedPPO, 2, n_rollouts=7)
    assert model._policy_lag.ring.versions == [4, 5, 6]


def test_version_does_not_advance_without_an_update():
    model = VACO("MlpPolicy", "CartPole-v1", **TINY)
    lag = PolicyLag(2, model.policy, seed=0)
    for _ in range(3):
        lag.start_rollout(n_updates=0, n_envs=1)
    assert lag.version == 0 and len(lag.ring) == 1


def test_snapshot_ring():
    """The one ring of the package (SB3 algorithms and the LLM trainer): select, drop_before, capacity, device."""
    model = th.nn.Linear(2, 1)
    ring = SnapshotRing(device="cpu")
    for version in (0, 4, 8):
        with th.no_grad():
            model.weight.fill_(version)
        ring.push(version, model)
    assert ring[4]["weight"].eq(4).all() and not model.weight.eq(4).all()  # copies, not the live parameters
    version, params = ring.select(-3)  # nothing that old: the oldest
    assert version == 0 and params["weight"].eq(0).all()
    version, params = ring.select(6)
    assert version == 4 and params["weight"].eq(4).all()
    assert ring.versions == [0, 4, 8], "select() drops nothing"
    ring.drop_before(version)
    assert ring.versions == [4, 8]

    bounded = SnapshotRing(capacity=2)
    for version in range(4):
        bounded.push(version, model)
    assert bounded.versions == [2, 3]
    restored = SnapshotRing(capacity=1)
    restored.load_state_dict(bounded.state_dict())
    assert restored.versions == [3] and th.equal(restored[3]["bias"], model.bias)


@pytest.mark.parametrize("algo", [VACO, LaggedPPO])
@pytest.mark.parametrize("policy_lag", [2, (0, 2)])
def test_resumed_run_continues_under_the_same_lag(algo, policy_lag, tmp_path):
    """save → load → learn(reset_num_timesteps=False) makes the updates of uninterrupted training: the ring is saved."""
    n_envs, steps = 2, TINY["n_steps"] * 2

    def trained():
        model = algo("MlpPolicy", make_vec_env("CartPole-v1", n_envs=n_envs, seed=0), policy_lag=policy_lag, **TINY)
        model.set_logger(configure(None, [""]))
        return model.learn(4 * steps)

    uninterrupted = trained().learn(3 * steps, reset_num_timesteps=False)

    model = trained()
    model.save(tmp_path / "model")
    # load() reseeds the global RNGs (SB3's _setup_model) and initializes a policy: give them back the state they had,
    # as the uninterrupted run has them, so that what is compared is the model's own state.
    global_rngs = th.get_rng_state(), np.random.get_state(), random.getstate()
    resumed = algo.load(tmp_path / "model", env=model.get_env(), force_reset=False)
    th.set_rng_state(global_rngs[0])
    np.random.set_state(global_rngs[1])
    random.setstate(global_rngs[2])
    assert resumed._policy_lag.ring.versions == model._policy_lag.ring.versions == [1, 2, 3]
    resumed.set_logger(configure(None, [""]))
    resumed.learn(3 * steps, reset_num_timesteps=False)

    assert resumed.num_timesteps == uninterrupted.num_timesteps
    assert resumed._policy_lag.version == uninterrupted._policy_lag.version
    np.testing.assert_array_equal(resumed.rollout_buffer.behavior_versions, uninterrupted.rollout_buffer.behavior_versions)
    for a, b in zip(uninterrupted.policy.state_dict().values(), resumed.policy.state_dict().values(), strict=True):
        assert th.equal(a, b)


@pytest.mark.parametrize("policy_lag", [-1, (3, 1), (-1, 2), (1, 2, 3), 1.5, "4", None, True])
def test_invalid_policy_lag_is_rejected(policy_lag):
    with pytest.raises(ValueError, match="policy_lag"):
        parse_policy_lag(policy_lag)
    with pytest.raises(ValueError, match="policy_lag"):
        VACO("MlpPolicy", "CartPole-v1", policy_lag=policy_lag)
    with pytest.raises(ValueError, match="policy_lag"):
        LaggedPPO("MlpPolicy", "CartPole-v1", policy_lag=policy_lag)


@pytest.mark.parametrize("algo, steps_per_version", [(LaggedPPO, 2 * 2), (VACO, 2 * 2), (LaggedTRPO, 1)])
def test_lag_in_gradient_steps_counts_the_policy_steps(algo, steps_per_version, tiny):
    """n_epochs × minibatches per version for the PPO family (32 steps in minibatches of 16, 2 epochs), one for TRPO,
    whose batch_size is the critic's minibatch."""
    lag = 3
    model = algo("MlpPolicy", "CartPole-v1", seed=0, policy_lag=lag, **tiny(algo))
    recorder = RecordRollouts()
    model.learn(SHARED_TINY["n_steps"] * (lag + 2), callback=recorder)
    logged = recorder.logged[-1]
    assert logged["rollout/policy_lag_mean"] == lag
    assert logged["rollout/policy_lag_grad_steps_mean"] == lag * steps_per_version
