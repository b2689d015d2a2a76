import gymnasium as gym
import numpy as np
import pytest
import torch as th
from conftest import TINY
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import (
    FakeImageEnv,
    IdentityEnv,
    IdentityEnvBox,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
    SimpleMultiObsEnv,
)
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecNormalize

from sb3_vaco import APPO, IMPALA, PPOKL, SPO, VACO, DecoupledPPO, LaggedPPO, VACOAlignOnly, VACOFilterOnly
from sb3_vaco.common.aligned import AlignedOnPolicyAlgorithm
from sb3_vaco.common.buffers import LaggedRolloutBufferSamples
from sb3_vaco.common.losses import total_variation


def params_of(model) -> list[th.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters()]


def assert_same_params(a, b) -> None:
    for pa, pb in zip(params_of(a), params_of(b), strict=True):
        assert th.equal(pa, pb)


@pytest.mark.parametrize("env_id, kwargs", [("CartPole-v1", {}), ("Pendulum-v1", {"use_sde": True, "sde_sample_freq": 4})])
def test_lagged_ppo_without_lag_is_sb3_ppo(env_id, kwargs):
    """LaggedPPO(policy_lag=0) makes exactly the same updates as SB3's PPO with the same seed."""
    models = []
    for algo in (PPO, LaggedPPO):
        env = make_vec_env(env_id, n_envs=2, seed=3)
        model = algo("MlpPolicy", env, seed=3, **TINY, **kwargs)
        models.append(model.learn(256))
    assert_same_params(*models)


class ClipWithGAE(VACOAlignOnly):
    """PPO's loss on GAE advantages inside the shared update loop: the align-only ablation without V-trace."""

    importance_corrected_advantages = False


def test_shared_update_loop_with_ppo_loss_and_gae_is_sb3_ppo_without_lag():
    """
    PPO's clipped loss on GAE advantages in the update loop all algorithms share is PPO at lag 0: the train-time
    bootstrap of the time-limit truncations (Pendulum-v1 truncates at 200 steps) equals SB3's collection-time one.
    The two return computations round differently, so the parameters agree to 1e-6 (measured: 3e-8), not bitwise;
    with lag they differ by 1e-2.
    """
    kwargs = dict(seed=3, learning_rate=1e-3, clip_range=0.2, **TINY)
    ppo = PPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=3), **kwargs).learn(512)
    for policy_lag, close in ((0, True), (2, False)):
        env = make_vec_env("Pendulum-v1", n_envs=2, seed=3)
        vaco = ClipWithGAE("MlpPolicy", env, policy_lag=policy_lag, **kwargs)
        vaco.learn(512)
        pairs = zip(params_of(ppo), params_of(vaco), strict=True)
        assert all(th.allclose(a, b, rtol=0.0, atol=1e-6) for a, b in pairs) == close


def test_lagged_ppo_with_lag_differs_from_ppo():
    models = [algo("MlpPolicy", "CartPole-v1", seed=3, **TINY).learn(256) for algo in (PPO, LaggedPPO)]
    lagged = LaggedPPO("MlpPolicy", "CartPole-v1", seed=3, policy_lag=2, **TINY).learn(256)
    assert_same_params(*models)
    assert not all(th.equal(a, b) for a, b in zip(params_of(models[0]), params_of(lagged), strict=True))


@pytest.mark.parametrize("algo", [VACO, LaggedPPO])
def test_seeded_runs_are_deterministic(algo):
    runs = [algo("MlpPolicy", "CartPole-v1", seed=7, policy_lag=(0, 2), **TINY).learn(256) for _ in range(2)]
    assert_same_params(*runs)


@pytest.mark.parametrize("algo", [VACO, LaggedPPO, PPOKL, SPO, VACOAlignOnly, VACOFilterOnly, DecoupledPPO, IMPALA, APPO])
def test_save_load_round_trip(algo, tmp_path):
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = algo("MlpPolicy", env, seed=0, policy_lag=2, **TINY).learn(256)
    model.save(tmp_path / "model")
    loaded = algo.load(tmp_path / "model", env=env)
    assert loaded.policy_lag == 2 and loaded.n_steps == TINY["n_steps"]
    if isinstance(model, VACO):
        assert loaded.tv_threshold(1.0) == model.tv_threshold(1.0) and loaded.tv_reference == model.tv_reference
    observations = env.reset()
    np.testing.assert_array_equal(
        model.predict(observations, deterministic=True)[0], loaded.predict(observations, deterministic=True)[0]
    )
    assert_same_params(model, loaded)
    loaded.learn(128, reset_num_timesteps=False)
    assert loaded.num_timesteps == model.num_timesteps + 128


ACTION_SPACE_ENVS = {
    "discrete": lambda: IdentityEnv(4),
    "box": lambda: IdentityEnvBox(ep_length=20),
    "multidiscrete": lambda: IdentityEnvMultiDiscrete(3),
    "multibinary": lambda: IdentityEnvMultiBinary(3),
}


@pytest.mark.parametrize("space", sorted(ACTION_SPACE_ENVS))
@pytest.mark.parametrize("policy_lag", [0, (0, 2)])
def test_every_action_space(space, policy_lag):
    env = make_vec_env(ACTION_SPACE_ENVS[space], n_envs=2, seed=0)
    model = VACO("MlpPolicy", env, seed=0, policy_lag=policy_lag, **TINY).learn(256)
    assert all(th.all(th.isfinite(p)) for p in model.policy.parameters())
    action, _ = model.predict(env.reset())
    assert env.action_space.contains(action[0])


@pytest.mark.parametrize("algo", [VACO, LaggedPPO])
def test_dict_observations(algo):
    env = make_vec_env(SimpleMultiObsEnv, n_envs=2, seed=0)
    model = algo("MultiInputPolicy", env, seed=0, policy_lag=1, **TINY).learn(256)
    assert type(model.rollout_buffer).__name__ == "LaggedDictRolloutBuffer"
    assert all(th.all(th.isfinite(p)) for p in model.policy.parameters())


def test_cnn_policy():
    env = make_vec_env(lambda: FakeImageEnv(screen_height=36, screen_width=36, n_channels=1), n_envs=1, seed=0)
    model = VACO("CnnPolicy", env, seed=0, policy_lag=1, n_steps=16, batch_size=8, n_epochs=1)
    model.learn(32)
    assert model.policy.features_extractor.__class__.__name__ == "NatureCNN"


def test_vecnormalize_and_gsde():
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = VACO("MlpPolicy", env, seed=0, policy_lag=(0, 2), use_sde=True, **TINY).learn(256)
    assert env.obs_rms.count > 256
    assert all(th.all(th.isfinite(p)) for p in model.policy.parameters())


def test_callbacks_and_logged_keys(tmp_path):
    class StopAfter(BaseCallback):
        def _on_step(self) -> bool:
            return self.num_timesteps < 100

    model = VACO("MlpPolicy", "CartPole-v1", seed=0, policy_lag=2, **TINY)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=1)
    model.learn(1000, callback=[EvalCallback(eval_env, eval_freq=64, n_eval_episodes=2, log_path=str(tmp_path)), StopAfter()])
    assert model.num_timesteps == 100, "returning False from a callback must stop training"
    assert (tmp_path / "evaluations.npz").exists()
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    for key in (
        "rollout/policy_lag_mean",
        "rollout/policy_lag_max",
        "rollout/policy_lag_grad_steps_mean",
        "train/tv_behavior",
        "train/tv_estimate",
        "train/filtered_fraction",
        "train/filter_active_fraction",
        "train/approx_kl",
        "train/value_loss",
        "train/explained_variance",
    ):
        assert key in header, key


def test_everything_filtered_never_gives_nan():
    """A budget so small that the filter is always on: updates stay finite, nothing blows up."""
    model = VACO("MlpPolicy", "CartPole-v1", seed=0, tv_threshold=1e-9, policy_lag=(0, 3), learning_rate=1e-2, **TINY)
    model.learn(512)
    assert model.logger.name_to_value["train/filter_active_fraction"] > 0.5
    assert model.logger.name_to_value["train/skipped_minibatches"] == 0
    assert all(th.all(th.isfinite(p)) for p in model.policy.parameters())


@pytest.mark.parametrize(
    "algo, kwargs",
    [
        (VACO, {"tv_reference": "behavior"}),
        (VACO, {"tv_behavior_limit": None}),
        (VACO, VACO.PAPER),
        (VACOAlignOnly, {"clip_range": 0.1}),
        (VACOFilterOnly, {}),
        (SPO, {}),
        (PPOKL, {"kl_coef": 0.1}),
    ],
)
def test_baselines_and_options_train(algo, kwargs):
    model = algo("MlpPolicy", "CartPole-v1", seed=0, policy_lag=1, **kwargs, **TINY).learn(256)
    assert all(th.all(th.isfinite(p)) for p in model.policy.parameters())
    assert 0.0 <= model.logger.name_to_value["train/tv_data"] < 1.0


def test_baselines_change_one_part_each():
    """Each named baseline swaps exactly one part of the shared update: the advantages, the policy loss or both."""
    assert VACO.importance_corrected_advantages and VACOAlignOnly.importance_corrected_advantages
    for algo in (VACOFilterOnly, SPO, PPOKL):
        assert not algo.importance_corrected_advantages
    for algo in (VACO, VACOAlignOnly, SPO, PPOKL):
        assert issubclass(algo, AlignedOnPolicyAlgorithm)
    assert VACOFilterOnly._policy_loss is VACO._policy_loss


def test_ratio_bound_is_logged_and_only_tightens_the_filter():
    kwargs = dict(seed=0, policy_lag=1, tv_threshold=10.0, tv_behavior_limit=None, learning_rate=1e-2, **TINY)
    model = VACO("MlpPolicy", "CartPole-v1", ratio_bound=1e-4, **kwargs).learn(256)
    # With an unreachable budget the bound is the only reason to drop a sample.
    values = model.logger.name_to_value
    assert values["train/filter_active_fraction"] == 0.0
    assert values["train/bound_fraction"] > 0.0
    assert values["train/filtered_fraction"] == pytest.approx(values["train/bound_fraction"])
    unbounded = VACO("MlpPolicy", "CartPole-v1", ratio_bound=None, **kwargs).learn(256)
    assert "train/bound_fraction" not in unbounded.logger.name_to_value
    assert unbounded.logger.name_to_value["train/filtered_fraction"] == 0.0


def test_realignment_at_zero_lag_is_sb3_gae_with_the_learner_critic():
    """
    Closed form on real collected data: without lag, the realigned targets are the TD(λ) returns SB3 would
    compute with the learner's critic, time-limit truncations bootstrapped by the learner's V(terminal obs).
    """
    env = make_vec_env(lambda: gym.make("CartPole-v1", max_episode_steps=12), n_envs=2, seed=0)
    model = VACO("MlpPolicy", env, seed=0, n_steps=40, batch_size=20, gae_lambda=0.9, policy_kwargs=dict(net_arch=[16]))
    model.learn(80)  # one update, so the critic is not the initial one
    model._setup_learn(80, None, reset_num_timesteps=False)
    model.collect_rollouts(model.env, model._init_callback(None), model.rollout_buffer, model.n_steps)
    buffer = model.rollout_buffer
    assert len(buffer.truncation_observations) > 0

    def value(obs) -> np.ndarray:
        with th.no_grad():
            return model.policy.predict_values(obs_as_tensor(np.asarray(obs), model.device)).flatten().numpy()

    n_steps, n_envs = buffer.buffer_size, buffer.n_envs
    reference = RolloutBuffer(
        n_steps, env.observation_space, env.action_space, gamma=model.gamma, gae_lambda=0.9, n_envs=n_envs
    )
    reference.values = value(buffer.observations.reshape(n_steps * n_envs, -1)).reshape(n_steps, n_envs)
    reference.rewards = buffer.rewards.copy()
    for (step, env_idx), terminal_obs in buffer.truncation_observations.items():
        reference.rewards[step, env_idx] += model.gamma * value(terminal_obs[None])[0]
    reference.episode_starts = buffer.episode_starts.copy()
    reference.compute_returns_and_advantage(th.as_tensor(value(buffer.last_observations)), buffer.last_dones)

    tv_behavior, ess_fraction = model._realign()
    assert tv_behavior == pytest.approx(0.0, abs=1e-5)
    assert ess_fraction == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(buffer.returns, reference.returns, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(buffer.values, reference.values, rtol=1e-5, atol=1e-5)
    # The same after the buffer was flattened by `get()`.
    next(buffer.get(batch_size=8))
    model._realign()
    np.testing.assert_allclose(buffer.time_major("returns"), reference.returns, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"tv_threshold": 0.0}, "tv_threshold"),
        ({"tv_threshold": -0.1}, "tv_threshold"),
        ({"vtrace_rho_bar": 0.0}, "vtrace_rho_bar"),
        ({"vtrace_c_bar": -1.0}, "vtrace_c_bar"),
        ({"ratio_bound": 0.0}, "ratio_bound"),
        ({"tv_behavior_limit": 0.0}, "tv_behavior_limit"),
        ({"tv_reference": "stale"}, "tv_reference"),
        ({"tv_reference": "learner"}, "tv_reference"),
        ({"tv_behavior_limit": -0.1}, "tv_behavior_limit"),
        ({"value_target": "mc"}, "value_target"),
        ({"batch_size": 4096}, "batch_size"),
        ({"batch_size": 1}, "batch_size"),
        ({"batch_size": 16.5}, "batch_size"),
        ({"n_steps": "64"}, "n_steps"),
        ({"n_steps": True}, "n_steps"),
        ({"gae_lambda": 1.5}, "gae_lambda"),
        ({"n_epochs": 0}, "n_epochs"),
        ({"n_epochs": 2.5}, "n_epochs"),
        ({"policy_lag": (4, 2)}, "policy_lag"),
    ],
)
def test_invalid_hyperparameters_name_the_parameter(kwargs, parameter):
    with pytest.raises(ValueError, match=parameter):
        VACO("MlpPolicy", "CartPole-v1", **kwargs)


@pytest.mark.parametrize(
    "algo, kwargs", [(VACOAlignOnly, {"clip_range": 0.0}), (SPO, {"clip_range": -1}), (PPOKL, {"kl_coef": -1.0})]
)
def test_invalid_baseline_hyperparameters_name_the_parameter(algo, kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        algo("MlpPolicy", "CartPole-v1", **kwargs)


@pytest.mark.parametrize("kwargs", [{"n_steps": "64"}, {"batch_size": 16.5}, {"n_epochs": 2.5}])
def test_lagged_ppo_rejects_non_integer_sizes(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        LaggedPPO("MlpPolicy", "CartPole-v1", **kwargs)


def test_truncated_last_minibatch_warns_as_in_ppo():
    with pytest.warns(UserWarning, match="truncated mini-batch"):
        VACO("MlpPolicy", "CartPole-v1", n_steps=30, batch_size=16)


def test_unsupported_observation_space_gets_sb3_error():
    class TupleObsEnv(IdentityEnv):
        def __init__(self) -> None:
            super().__init__(2)
            self.observation_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(2)))

    with pytest.raises(NotImplementedError):
        VACO("MlpPolicy", TupleObsEnv())


def test_behavior_limited_budget_shrinks_with_the_measured_lag():
    """``tv_behavior_limit = τ``: the logged budget is δ·max(0, 1 − TV(π_T, μ)/τ), δ itself without lag."""
    kwargs = dict(seed=0, tv_threshold=0.2, learning_rate=1e-2, tv_behavior_limit=0.5, **TINY)
    model = VACO("MlpPolicy", "Pendulum-v1", policy_lag=3, **kwargs).learn(TINY["n_steps"] * 6)
    values = model.logger.name_to_value
    assert 0.0 < values["train/tv_behavior"] < 0.5
    assert values["train/tv_threshold"] == pytest.approx(0.2 * (1 - values["train/tv_behavior"] / 0.5))
    no_lag = VACO("MlpPolicy", "Pendulum-v1", **kwargs).learn(TINY["n_steps"] * 2)
    assert no_lag.logger.name_to_value["train/tv_threshold"] == pytest.approx(0.2)
    unlimited = VACO("MlpPolicy", "Pendulum-v1", policy_lag=3, **{**kwargs, "tv_behavior_limit": None})
    assert unlimited.learn(TINY["n_steps"] * 6).logger.name_to_value["train/tv_threshold"] == pytest.approx(0.2)


def test_default_budget_stops_the_learner_far_from_its_data():
    """
    The default limit τ = 0.1: once the learner is more than τ from its data the budget is 0, and every minibatch
    after the update's first gradient step (where π_θ = π_T and the TV estimate is 0) is filtered.
    """
    model = VACO("MlpPolicy", "Pendulum-v1", seed=0, policy_lag=8, learning_rate=0.3, **TINY)
    assert model.tv_behavior_limit == 0.1 and VACO.PAPER["tv_behavior_limit"] is None
    model.learn(TINY["n_steps"] * 12)
    values = model.logger.name_to_value
    assert values["train/tv_behavior"] > 0.1
    assert values["train/tv_threshold"] == 0.0
    minibatches = TINY["n_epochs"] * TINY["n_steps"] // TINY["batch_size"]
    assert values["train/filter_active_fraction"] == pytest.approx(1 - 1 / minibatches)


def test_ess_fraction_is_kish_effective_sample_size():
    model = VACO("MlpPolicy", "Pendulum-v1", seed=0, policy_lag=2, learning_rate=1e-2, **TINY)
    model.learn(TINY["n_steps"] * 5)
    _, ess_fraction = model._realign()
    buffer = model.rollout_buffer
    rhos = np.exp(buffer.time_major("learner_log_probs") - buffer.time_major("log_probs")).astype(np.float64)
    assert ess_fraction == pytest.approx(rhos.sum() ** 2 / (rhos.size * (rhos**2).sum()), rel=1e-4)
    assert ess_fraction < 1.0


def test_value_target_splits_the_realignment_between_policy_and_critic():
    """``value_target`` picks the critic's targets; the policy's advantages follow the class (V-trace or GAE)."""
    model = VACO("MlpPolicy", "Pendulum-v1", seed=0, policy_lag=2, **TINY)
    assert model.value_target == "gae"  # the variant study's default (docs/study.md)
    model.learn(TINY["n_steps"] * 5)  # the last rollout was collected 2 updates behind the learner

    def realign(advantage_estimator: str, value_target: str) -> tuple[np.ndarray, np.ndarray]:
        model.importance_corrected_advantages = advantage_estimator == "vtrace"  # type: ignore[misc]
        model.value_target = value_target
        assert model._realign()[0] > 1e-4  # the data is off-policy, so V-trace and GAE differ
        return model.rollout_buffer.returns.copy(), model.rollout_buffer.advantages.copy()

    vtrace_returns, vtrace_advantages = realign("vtrace", "vtrace")
    gae_returns, gae_advantages = realign("gae", "gae")
    assert not np.allclose(vtrace_returns, gae_returns) and not np.allclose(vtrace_advantages, gae_advantages)
    returns, advantages = realign("vtrace", "gae")
    np.testing.assert_array_equal(returns, gae_returns)
    np.testing.assert_array_equal(advantages, vtrace_advantages)
    returns, advantages = realign("gae", "vtrace")
    np.testing.assert_array_equal(returns, vtrace_returns)
    np.testing.assert_array_equal(advantages, gae_advantages)


def test_value_target_makes_no_difference_without_lag():
    """With π_T = μ the V-trace targets are the GAE targets: the default and the paper's rule coincide at lag 0."""
    # learning_rate=0: the learner stays the policy that collected the last rollout
    model = VACO("MlpPolicy", "Pendulum-v1", seed=0, learning_rate=0.0, **TINY).learn(TINY["n_steps"] * 2)

    def realigned_targets(value_target: str) -> np.ndarray:
        model.value_target = value_target
        assert model._realign()[0] < 1e-5  # on-policy up to rounding
        return model.rollout_buffer.returns.copy()

    np.testing.assert_allclose(realigned_targets("vtrace"), realigned_targets("gae"), rtol=1e-5, atol=1e-5)


def test_behavior_kl_penalty_is_logged_and_zero_weight_changes_nothing():
    """β = 0 makes exactly the updates of no penalty; β > 0 logs KL(μ‖π_θ) ≥ 0 and changes the updates under lag."""
    kwargs = dict(seed=0, policy_lag=2, learning_rate=1e-2, **TINY)
    plain = VACO("MlpPolicy", "Pendulum-v1", **kwargs).learn(TINY["n_steps"] * 4)
    zero = VACO("MlpPolicy", "Pendulum-v1", behavior_kl_coef=0.0, **kwargs).learn(TINY["n_steps"] * 4)
    assert_same_params(plain, zero)
    assert "train/behavior_kl" not in plain.logger.name_to_value
    assert zero.logger.name_to_value["train/behavior_kl"] > 0.0  # the learner has moved away from the lagged actor
    pulled = VACO("MlpPolicy", "Pendulum-v1", behavior_kl_coef=10.0, **kwargs).learn(TINY["n_steps"] * 4)
    assert any(not th.equal(a, b) for a, b in zip(params_of(plain), params_of(pulled), strict=True))
    with pytest.raises(ValueError, match="behavior_kl_coef"):
        VACO("MlpPolicy", "Pendulum-v1", behavior_kl_coef=-1.0)


def lagged_minibatch(log_x: th.Tensor) -> LaggedRolloutBufferSamples:
    """A Pendulum-v1 minibatch whose learner at the start of the update is ``log(π_T/μ) = log_x`` from its data."""
    n = len(log_x)
    learner_log_prob = th.linspace(-2.0, -0.5, n)
    return LaggedRolloutBufferSamples(
        observations=th.zeros(n, 3), actions=th.zeros(n, 1), old_values=th.zeros(n), old_log_prob=learner_log_prob - log_x,
        advantages=th.zeros(n), returns=th.zeros(n), learner_log_prob=learner_log_prob,
    )


def anchor_loss_grad(
    form: str, log_x: th.Tensor, beta: float = 0.3, step: float = 0.0, tv_threshold: float = 1.0,
    direction: str = "forward",
) -> tuple[th.Tensor, th.Tensor]:
    """VACO's policy loss and its gradient in log π_θ, log(π_T/μ) = log_x, log(π_θ/π_T) = step (0: start of the update)."""
    model = VACO("MlpPolicy", "Pendulum-v1", behavior_kl_coef=beta, behavior_kl_form=form, tv_threshold=tv_threshold,
                 ratio_bound=None, tv_behavior_limit=None, behavior_kl_direction=direction, **TINY)
    data = lagged_minibatch(log_x)
    log_prob = (data.learner_log_prob + step).requires_grad_(True)
    advantages = th.linspace(-1.0, 1.0, len(log_x))
    loss, _ = model._policy_loss(log_prob, data, advantages)
    (grad,) = th.autograd.grad(loss, log_prob)
    return loss.detach(), grad


def test_anchor_in_the_advantage_is_the_penalty_to_first_order_and_nothing_without_lag():
    """The "advantage" form lowers each advantage by β·log(π_T/μ): the penalty's gradient to first order, 0 at π_T = μ."""
    small = th.tensor([-2e-3, -1e-3, 1e-3, 2e-3])
    _, in_loss = anchor_loss_grad("loss", small)
    _, in_advantage = anchor_loss_grad("advantage", small)
    _, without = anchor_loss_grad("loss", th.zeros(4), beta=0.0)
    # The anchor's own part of the gradient, β·(π_T/μ − 1) per sample for both forms, up to O(log²)
    th.testing.assert_close(in_advantage - without, in_loss - without, rtol=5e-3, atol=1e-9)
    assert th.all(th.sign(in_advantage - without) == th.sign(small))  # pushes π_θ back towards μ
    # Without lag (π_T = μ) the advantage form changes nothing, bit for bit
    loss_plain, grad_plain = anchor_loss_grad("advantage", th.zeros(4), beta=0.0)
    loss_anchor, grad_anchor = anchor_loss_grad("advantage", th.zeros(4), beta=0.3)
    assert th.equal(loss_plain, loss_anchor) and th.equal(grad_plain, grad_anchor)
    plain = VACO("MlpPolicy", "Pendulum-v1", seed=0, **TINY).learn(TINY["n_steps"] * 4)
    anchored = VACO("MlpPolicy", "Pendulum-v1", seed=0, behavior_kl_coef=0.3, behavior_kl_form="advantage", **TINY)
    assert_same_params(plain, anchored.learn(TINY["n_steps"] * 4))
    lagged = [VACO("MlpPolicy", "Pendulum-v1", seed=0, policy_lag=2, behavior_kl_coef=beta, behavior_kl_form="advantage",
                   **TINY).learn(TINY["n_steps"] * 4) for beta in (0.0, 0.3)]
    assert any(not th.equal(a, b) for a, b in zip(*map(params_of, lagged), strict=True))  # under lag it acts
    with pytest.raises(ValueError, match="behavior_kl_form"):
        VACO("MlpPolicy", "Pendulum-v1", behavior_kl_form="reward")


def test_bounded_anchor_pulls_until_the_update_has_moved_the_budget():
    """The "bounded" form is the penalty in the loss until the update has moved the learner δ from π_T, then nothing."""
    log_x = th.tensor([-0.3, -0.1, 0.1, 0.3])
    at_start = [anchor_loss_grad(form, log_x, tv_threshold=0.1) for form in ("bounded", "loss")]
    th.testing.assert_close(at_start[0], at_start[1], rtol=0.0, atol=0.0)  # π_θ = π_T: not moved yet
    # log(π_θ/π_T) = 0.5 on every sample: TV(π_θ, π_T) = ½·mean(π_T/μ)·(e^0.5 − 1) ≈ 0.33 > δ = 0.1
    moved = [anchor_loss_grad("bounded", log_x, step=0.5, tv_threshold=0.1),
             anchor_loss_grad("loss", log_x, beta=0.0, step=0.5, tv_threshold=0.1),
             anchor_loss_grad("loss", log_x, step=0.5, tv_threshold=0.1)]
    th.testing.assert_close(moved[0], moved[1], rtol=0.0, atol=0.0)  # the pull has stopped
    assert not th.equal(moved[0][1], moved[2][1])  # where the unbounded anchor still pulls
    # Just inside the budget it still pulls: log(π_θ/π_T) = 0.1 gives TV ≈ 0.05 < δ
    th.testing.assert_close(anchor_loss_grad("bounded", log_x, step=0.1, tv_threshold=0.1),
                            anchor_loss_grad("loss", log_x, step=0.1, tv_threshold=0.1), rtol=0.0, atol=0.0)


def test_reverse_anchor_is_the_reverse_kl_penalty():
    """``behavior_kl_direction="reverse"`` adds β·KL(π_θ‖μ) in place of β·KL(μ‖π_θ): its gradient is β·r·log r per
    sample (mean over the minibatch), r = π_θ/μ, where the forward anchor's is β·(r − 1)."""
    log_x = th.tensor([-0.6, -0.2, 0.2, 0.6])
    _, without = anchor_loss_grad("loss", log_x, beta=0.0)
    for direction, per_sample in (("reverse", log_x.exp() * log_x), ("forward", log_x.exp() - 1)):
        _, grad = anchor_loss_grad("loss", log_x, beta=0.3, direction=direction)
        th.testing.assert_close(grad - without, 0.3 * per_sample / len(log_x))
    with pytest.raises(ValueError, match="behavior_kl_direction"):
        VACO("MlpPolicy", "Pendulum-v1", behavior_kl_coef=1.0, behavior_kl_direction="backward")
    with pytest.raises(ValueError, match="behavior_kl_direction"):
        VACO("MlpPolicy", "Pendulum-v1", behavior_kl_coef=1.0, behavior_kl_form="advantage", behavior_kl_direction="reverse")


def filter_stats(tv_reference: str, log_x: th.Tensor, step: float) -> dict[str, float]:
    """The filter's diagnostics for a minibatch with ``log(π_T/μ) = log_x`` after the learner moved ``log(π_θ/π_T) = step``."""
    model = VACO("MlpPolicy", "Pendulum-v1", tv_reference=tv_reference, tv_threshold=0.05, ratio_bound=None,
                 tv_behavior_limit=None, **TINY)
    data = lagged_minibatch(log_x)
    advantages = th.linspace(-1.0, 1.0, len(log_x))
    _, stats = model._policy_loss(data.learner_log_prob + step * th.sign(advantages), data, advantages)
    return stats


def test_relative_budget_counts_from_the_distance_at_the_start_of_the_update():
    """
    ``"behavior_relative"``: ``D̂ = ½·mean|π_θ/μ − 1|`` as in ``"behavior"``, but the filter acts only once it exceeds δ
    plus its value at π_θ = π_T. Here ``π_T/μ`` is e^{±0.5} (``TV(π_T, μ)`` ≈ 0.26 > δ = 0.05): at the start of the update
    the paper's filter is already active, the relative one is not; a move of the learner further from μ that takes
    ``D̂`` more than δ further (each sample's probability × e^{±0.2} along its advantage) activates both.
    """
    log_x = 0.5 * th.tensor([-1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0])  # π_T moved from μ along the advantages
    start_tv = total_variation(log_x).item()
    assert start_tv > 0.05
    assert filter_stats("behavior", log_x, 0.0)["filter_active_fraction"] == 1.0
    assert filter_stats("behavior_relative", log_x, 0.0)["filter_active_fraction"] == 0.0
    moved = filter_stats("behavior_relative", log_x, 0.2)
    assert moved["tv_estimate"] > start_tv + 0.05 and moved["filter_active_fraction"] == 1.0
    # Without lag the relative budget is δ itself: the same filter as the other two references
    for step in (0.01, 0.2):
        stats = [filter_stats(reference, th.zeros(8), step) for reference in ("behavior", "decoupled", "behavior_relative")]
        assert stats[0] == stats[1] == stats[2]


def test_relative_budget_is_the_paper_filter_without_lag():
    kwargs = dict(seed=0, tv_threshold=0.02, learning_rate=1e-2, ratio_bound=None, tv_behavior_limit=None, **TINY)
    behavior = VACO("MlpPolicy", "Pendulum-v1", tv_reference="behavior", **kwargs).learn(TINY["n_steps"] * 4)
    relative = VACO("MlpPolicy", "Pendulum-v1", tv_reference="behavior_relative", **kwargs).learn(TINY["n_steps"] * 4)
    assert_same_params(behavior, relative)
    lagged = [VACO("MlpPolicy", "Pendulum-v1", tv_reference=reference, policy_lag=3, **kwargs).learn(TINY["n_steps"] * 6)
              for reference in ("behavior", "behavior_relative")]
    assert any(not th.equal(a, b) for a, b in zip(*map(params_of, lagged), strict=True))
