import copy

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from sb3_vaco import VACO, LaggedPPO
from sb3_vaco.common.lag import PolicyLag, parse_policy_lag

TINY = dict(n_steps=16, batch_size=16, n_epochs=2, learning_rate=1e-2, policy_kwargs=dict(net_arch=[16]), seed=0)


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


@pytest.mark.parametrize("algo", [VACO, LaggedPPO])
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
    assert len(model._policy_lag.snapshots) == 0 and model._policy_lag._behavior_pool == []


def test_ring_keeps_only_the_needed_snapshots():
    model, _ = train_recorded(LaggedPPO, 2, n_rollouts=7)
    assert [version for version, _, _ in model._policy_lag.snapshots] == [4, 5, 6]


def test_version_does_not_advance_without_an_update():
    lag = PolicyLag(2, seed=0)
    model = VACO("MlpPolicy", "CartPole-v1", **TINY)
    for _ in range(3):
        lag.start_rollout(model.policy, n_updates=0, n_envs=1)
    assert lag.version == 0 and len(lag.snapshots) == 1


@pytest.mark.parametrize("policy_lag", [-1, (3, 1), (-1, 2), (1, 2, 3), 1.5, "4", None, True])
def test_invalid_policy_lag_is_rejected(policy_lag):
    with pytest.raises(ValueError, match="policy_lag"):
        parse_policy_lag(policy_lag)
    with pytest.raises(ValueError, match="policy_lag"):
        VACO("MlpPolicy", "CartPole-v1", policy_lag=policy_lag)
    with pytest.raises(ValueError, match="policy_lag"):
        LaggedPPO("MlpPolicy", "CartPole-v1", policy_lag=policy_lag)
