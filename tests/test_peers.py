"""The peers VACO is measured against: their losses in closed form, and each one's equivalence without lag."""

import numpy as np
import pytest
import torch as th
from conftest import TINY_NET
from sb3_contrib import TRPO, MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from sb3_vaco import APPO, IMPALA, DecoupledPPO, LaggedMaskablePPO, LaggedTRPO
from sb3_vaco.common.losses import appo_surrogate, clipped_surrogate, vtrace_policy_gradient_loss

NET = dict(policy_kwargs=TINY_NET)


def params_of(model) -> list[th.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters()]


def max_param_difference(a, b) -> float:
    return max(float(th.max(th.abs(pa - pb))) for pa, pb in zip(params_of(a), params_of(b), strict=True))


# ----- losses, closed form -----------------------------------------------------------------------------------------


def test_weighted_clipped_surrogate():
    ratio = th.tensor([0.5, 1.0, 1.5, 1.5], requires_grad=True)
    advantages = th.tensor([1.0, -2.0, 1.0, -1.0])
    weights = th.tensor([2.0, 1.0, 0.5, 1.0])
    loss = clipped_surrogate(ratio, advantages, 0.2, weights)
    # min(r·A, clip(r)·A): 0.5, −2.0, 1.2 (clipped), −1.5 (unclipped, the pessimistic side)
    expected = -(2.0 * 0.5 + 1.0 * -2.0 + 0.5 * 1.2 + 1.0 * -1.5) / 4
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    assert ratio.grad is not None
    # Zero gradient exactly for the sample clipped on the optimistic side; the others get −w·A/n.
    np.testing.assert_allclose(ratio.grad.numpy(), [-2.0 * 1.0 / 4, 2.0 / 4, 0.0, 1.0 / 4])
    assert clipped_surrogate(ratio, advantages, 0.2).item() == pytest.approx(-(0.5 - 2.0 + 1.2 - 1.5) / 4)


def test_vtrace_policy_gradient_is_rho_weighted_advantage_times_score():
    log_prob = th.tensor([-1.0, -0.5, -2.0], requires_grad=True)
    advantages = th.tensor([1.0, -3.0, 2.0])
    pg_rhos = th.tensor([1.0, 0.5, 0.25])
    vtrace_policy_gradient_loss(log_prob, advantages, pg_rhos).backward()
    assert log_prob.grad is not None
    np.testing.assert_allclose(log_prob.grad.numpy(), -(pg_rhos * advantages).numpy() / 3)


def test_appo_surrogate_is_the_clip_around_the_target_policy():
    log_prob = th.log(th.tensor([0.30, 0.50, 0.20], requires_grad=True))
    target = th.log(th.tensor([0.25, 0.50, 0.40]))
    advantages = th.tensor([1.0, -1.0, 1.0])
    # μ/π_target ≤ 2 everywhere: APPO's ratio is π_θ/π_target
    behavior = th.log(th.tensor([0.40, 0.60, 0.30]))
    expected = clipped_surrogate(th.exp(log_prob - target), advantages, 0.1)
    assert appo_surrogate(log_prob, target, behavior, advantages, 0.1).item() == pytest.approx(expected.item())
    # μ/π_target = 0.9/0.25 > 2 for the first sample: its ratio is 2·π_θ/μ, not π_θ/π_target
    behavior = th.log(th.tensor([0.90, 0.60, 0.30]))
    ratio = th.stack([2.0 * th.exp(log_prob[0] - behavior[0]), *th.exp(log_prob[1:] - target[1:])])
    expected = clipped_surrogate(ratio, advantages, 0.1)
    assert appo_surrogate(log_prob, target, behavior, advantages, 0.1).item() == pytest.approx(expected.item())


# ----- equivalences without lag ------------------------------------------------------------------------------------


def test_impala_without_lag_is_a2c_with_adam():
    """One pass over the whole batch, ρ = 1, λ = 1: IMPALA's update is A2C's (with Adam) on the TD(1) advantages."""
    kwargs = dict(seed=3, n_steps=16, learning_rate=1e-3, ent_coef=0.01, vf_coef=0.25, max_grad_norm=40.0, **NET)
    a2c = A2C("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=3), use_rms_prop=False, **kwargs).learn(512)
    for policy_lag, close in ((0, True), (2, False)):
        env = make_vec_env("Pendulum-v1", n_envs=2, seed=3)
        impala = IMPALA("MlpPolicy", env, policy_lag=policy_lag, **kwargs).learn(512)
        assert (max_param_difference(a2c, impala) < 1e-5) == close


@pytest.mark.parametrize("algo", [DecoupledPPO, APPO])
def test_clipped_peers_without_lag_are_sb3_ppo(algo):
    """
    π_prox = π_target = μ without lag: decoupled PPO's weights and APPO's IS ratio are 1, and both are PPO (with λ = 1,
    where V-trace's policy advantage r_t + γ·v_{t+1} − V(s_t), APPO's, equals GAE's).
    """
    kwargs = dict(seed=3, n_steps=32, batch_size=16, n_epochs=2, learning_rate=1e-3, gae_lambda=1.0, **NET)
    ppo = PPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=3), **kwargs).learn(512)
    for policy_lag, close in ((0, True), (2, False)):
        env = make_vec_env("Pendulum-v1", n_envs=2, seed=3)
        peer = algo("MlpPolicy", env, policy_lag=policy_lag, **kwargs).learn(512)
        assert (max_param_difference(ppo, peer) < 1e-5) == close


@pytest.mark.parametrize("env_id, kwargs", [("CartPole-v1", {}), ("Pendulum-v1", {"use_sde": True, "sde_sample_freq": 4})])
def test_lagged_trpo_without_lag_is_sb3_contrib_trpo(env_id, kwargs):
    models = []
    for algo in (TRPO, LaggedTRPO):
        env = make_vec_env(env_id, n_envs=2, seed=3)
        models.append(algo("MlpPolicy", env, seed=3, n_steps=32, batch_size=16, **NET, **kwargs).learn(256))
    assert max_param_difference(*models) == 0.0
    env = make_vec_env(env_id, n_envs=2, seed=3)
    lagged = LaggedTRPO("MlpPolicy", env, seed=3, n_steps=32, batch_size=16, policy_lag=2, **NET, **kwargs).learn(256)
    assert max_param_difference(models[0], lagged) > 0.0


# ----- what each peer does under lag -------------------------------------------------------------------------------


def logged_after(algo, policy_lag, **kwargs) -> dict[str, float]:
    model = algo("MlpPolicy", "CartPole-v1", seed=0, policy_lag=policy_lag, n_steps=32, **NET, **kwargs)
    model.set_logger(configure(None, [""]))
    model.learn(32 * 6)
    return dict(model.logger.name_to_value)


def test_impala_truncates_its_importance_weights_only_under_lag():
    assert logged_after(IMPALA, 0)["train/pg_rho_mean"] == pytest.approx(1.0, abs=1e-5)
    assert logged_after(IMPALA, 3, learning_rate=1e-2)["train/pg_rho_mean"] < 0.999


def test_decoupled_ppo_caps_the_weights_to_the_behavior_policy():
    assert logged_after(DecoupledPPO, 0, batch_size=16)["train/weight_capped_fraction"] == 0.0
    logged = logged_after(DecoupledPPO, 3, batch_size=16, learning_rate=3e-2, weight_cap=1.0)
    assert logged["train/weight_capped_fraction"] > 0.0


def test_appo_kl_coefficient_adapts_as_rllib(tmp_path):
    """An update whose mean KL to the target stays below kl_target/2 halves β (RLlib's rule), every update; a saved
    model goes on from its adapted β."""
    model = APPO("MlpPolicy", "CartPole-v1", seed=0, n_steps=32, batch_size=32, n_epochs=1, learning_rate=1e-6,
                 use_kl_loss=True, kl_coef=1.0, kl_target=0.01, **NET)
    model.learn(32 * 4)
    assert 0.0 <= model.logger.name_to_value["train/kl"] < 0.005
    assert model._kl_coef_now == pytest.approx(0.5**4)
    model.save(tmp_path / "appo")
    loaded = APPO.load(tmp_path / "appo", env=model.get_env())
    assert loaded._kl_coef_now == pytest.approx(0.5**4)
    loaded.learn(32, reset_num_timesteps=False)
    assert loaded._kl_coef_now == pytest.approx(0.5**5)


@pytest.mark.parametrize(
    "algo, kwargs, parameter",
    [
        (DecoupledPPO, {"weight_cap": 0.0}, "weight_cap"),
        (DecoupledPPO, {"clip_range": -0.1}, "clip_range"),
        (IMPALA, {"pg_rho_bar": float("nan")}, "pg_rho_bar"),
        (APPO, {"is_ratio_clip": -1.0}, "is_ratio_clip"),
        (APPO, {"kl_target": 0}, "kl_target"),
    ],
)
def test_invalid_peer_hyperparameters_name_the_parameter(algo, kwargs, parameter):
    with pytest.raises(ValueError, match=parameter):
        algo("MlpPolicy", "CartPole-v1", **kwargs)


# ----- sb3-contrib's MaskablePPO under lag ---------------------------------------------------------------------------


def masked_env(seed: int = 0):
    return make_vec_env(lambda: InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10), n_envs=2, seed=seed)


def test_lagged_maskable_ppo_without_lag_is_maskable_ppo():
    kwargs = dict(n_steps=32, batch_size=16, n_epochs=2, seed=3, **NET)
    models = [algo("MlpPolicy", masked_env(3), **kwargs).learn(256) for algo in (MaskablePPO, LaggedMaskablePPO)]
    assert max_param_difference(*models) == 0.0
    lagged = LaggedMaskablePPO("MlpPolicy", masked_env(3), policy_lag=2, **kwargs).learn(256)
    assert max_param_difference(models[0], lagged) > 0.0


class RecordMaskedRollouts(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.rollouts: list[dict[str, np.ndarray]] = []

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        self.rollouts.append({name: getattr(buffer, name).copy() for name in ("actions", "action_masks", "behavior_versions")})

    def _on_step(self) -> bool:
        return True


def test_stale_policies_act_with_the_action_masks(tmp_path):
    """Under lag the stale policies act with each step's masks, the buffer keeps them, and MaskablePPO loads the model."""
    model = LaggedMaskablePPO("MlpPolicy", masked_env(), policy_lag=3, n_steps=32, batch_size=16, seed=0, **NET)
    recorder = RecordMaskedRollouts()
    model.learn(32 * 2 * 8, callback=recorder)
    last = recorder.rollouts[-1]
    assert int(last["behavior_versions"].max()) == len(recorder.rollouts) - 1 - 3  # acted by the version 3 updates back
    for rollout in recorder.rollouts:
        actions = rollout["actions"].astype(int).reshape(-1)
        masks = rollout["action_masks"].reshape(len(actions), -1)
        assert masks[np.arange(len(actions)), actions].all(), "a stale policy took a masked action"
        assert (masks.sum(axis=1) == 10).all()  # the env's masks were stored, not the buffer's all-ones default
    assert 0.0 < model.logger.name_to_value["train/tv_behavior"] < 1.0
    model.save(tmp_path / "model.zip")
    parent = MaskablePPO.load(tmp_path / "model.zip")
    observations, masks = model.get_env().reset(), get_action_masks(model.get_env())
    np.testing.assert_array_equal(
        model.predict(observations, action_masks=masks, deterministic=True)[0],
        parent.predict(observations, action_masks=masks, deterministic=True)[0],
    )
    loaded = LaggedMaskablePPO.load(tmp_path / "model.zip", env=masked_env())
    assert loaded._policy_lag.ring.versions == model._policy_lag.ring.versions


def test_lagged_maskable_ppo_refuses_actors():
    with pytest.raises(ValueError, match="n_actors"):
        LaggedMaskablePPO("MlpPolicy", masked_env(), n_actors=2)
