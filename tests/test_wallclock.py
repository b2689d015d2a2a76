"""
Wall-clock to a return : the latency wrapper, the zoo's actors stepping the zoo's wrapped env, the runner's
eval timing with actors, the ``wallclock`` grid, and the wall-clock analysis on synthetic results.
"""

import json
import time
from pathlib import Path

import cloudpickle
import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

pytest.importorskip("rl_zoo3")
pytest.importorskip("rliable")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

import analyze as analyze_script
from sb3_vaco.actors.base import ActorSettings
from sb3_vaco.common.wrappers import LatencyWrapper, WrappedEnvFactory
from vaco_lab import runner, wallclock
from vaco_lab.common import zoo_entry
from vaco_lab.grids import Variant, load_grid_file, parse_update

REPO = Path(__file__).resolve().parent.parent
GRIDS = load_grid_file(REPO / "scripts" / "grids.yml")
LATENCY_UPDATE = "lat1ms:env_wrapper={sb3_vaco.common.wrappers.LatencyWrapper: {latency: 0.001}}"


def unwrap_to(env: gym.Env, cls: type) -> gym.Env | None:
    """The first wrapper of type ``cls`` in ``env``'s chain, or None."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, cls):
            return env
        env = env.env
    return None


def test_latency_wrapper_adds_at_least_its_latency() -> None:
    env = LatencyWrapper(gym.make("CartPole-v1"), latency=0.005)
    env.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while steps < 20:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        steps += 1
        if terminated or truncated:
            env.reset()
    assert time.perf_counter() - start >= 20 * 0.005  # a lower bound only
    with pytest.raises(ValueError, match="latency"):
        LatencyWrapper(gym.make("CartPole-v1"), latency=-1.0)
    # The factory the actors get pickles and builds the same wrapped env
    factory = cloudpickle.loads(cloudpickle.dumps(WrappedEnvFactory("CartPole-v1", _latency_1ms)))
    built = factory()
    wrapper = unwrap_to(built, LatencyWrapper)
    assert wrapper is not None and wrapper.latency == 0.001 and built.spec is not None and built.spec.id == "CartPole-v1"


def _latency_1ms(env: gym.Env) -> gym.Env:
    return LatencyWrapper(env, latency=0.001)


def test_zoo_gives_actors_the_zoo_env(tmp_path: Path) -> None:
    # The zoo hands the model a VecEnv; with actors, the manager tells them to build the env id inside the entry's
    # env_wrapper (no actor is started here).
    import argparse

    from sb3_vaco.zoo import config_file, register_algos
    from sb3_vaco.zoo.exp_manager import VACOExperimentManager

    register_algos()
    hyperparams = {
        "n_actors": 2,
        "n_steps": 32,
        "batch_size": 64,
        "actor_backend_kwargs": {"max_pending_segments": 2},
        "env_wrapper": {"sb3_vaco.common.wrappers.LatencyWrapper": {"latency": 0.001}},
        "n_timesteps": 64,
    }
    manager = VACOExperimentManager(
        argparse.Namespace(algo="vaco", env="CartPole-v1", seed=0),
        "vaco",
        "CartPole-v1",
        log_folder=str(tmp_path),
        eval_freq=-1,
        hyperparams=hyperparams,
        seed=0,
        device="cpu",
        config=str(config_file("vaco")),
    )
    setup = manager.setup_experiment()
    assert setup is not None
    model, saved = setup
    env_fn = model.actor_backend_kwargs["env_fn"]
    assert isinstance(env_fn, WrappedEnvFactory) and env_fn.env_id == "CartPole-v1"
    assert model._actors.env_fn(model.env) is env_fn  # what the actors are started with
    built = cloudpickle.loads(cloudpickle.dumps(env_fn))()
    wrapper = unwrap_to(built, LatencyWrapper)
    assert wrapper is not None and wrapper.latency == 0.001
    # the learner's own env is the same wrapped env; the saved config stays as written
    learner_env = model.env.envs[0] if hasattr(model.env, "envs") else model.env.venv.envs[0]
    assert unwrap_to(learner_env, LatencyWrapper) is not None
    assert saved["actor_backend_kwargs"] == {"max_pending_segments": 2}
    model.env.close()


def test_actor_run_records_timed_evaluations(tmp_path: Path) -> None:
    # A real run of 2 process actors through the runner, behind 1 ms per step: evaluations every eval_freq env steps
    # (not eval_freq * n_actors), each timed, and the lag recorded.
    hyperparams = {"n_actors": 2, "n_steps": 32, "batch_size": 64, "n_epochs": 1, "policy_kwargs": "dict(net_arch=[16])"}
    variant = Variant("lagged_ppo_actors2", "lagged_ppo", {**hyperparams, "actor_backend_kwargs": {"max_pending_segments": 2}})
    [spec] = runner.build_grid(
        ["CartPole-v1"], [variant], ["0"], [parse_update(LATENCY_UPDATE)], [0], tmp_path, 256, 128, 1, {}
    )
    outcome = runner.run_in_scratch(spec)
    assert outcome.ok, (spec.run_dir / runner.ERROR_FILE).read_text()
    result = json.loads(spec.result_path.read_text())
    evaluations = result["eval"]
    assert evaluations["timesteps"] == [128, 256]
    wall, spent = np.array(evaluations["wall_s"]), np.array(evaluations["eval_time_s"])
    assert len(wall) == len(spent) == 2 and spent[0] == 0 and (np.diff(spent) > 0).all()
    assert 0 < wall[0] < wall[1] <= result["learn_time_s"] and (np.diff(wall - spent) > 0).all()
    progress = pd.read_csv(spec.run_dir / "progress.csv.gz")
    assert (progress["rollout/policy_lag_mean"] >= 0).all() and "rollout/actor_wait_time" in progress
    assert "LatencyWrapper" in result["hyperparams"]["resolved"]["actor_backend_kwargs"]["env_fn"]


def test_wallclock_grid() -> None:
    grid = GRIDS.grid("wallclock")
    runs = runner.grid_runs(grid, REPO, {})
    assert {run.out_dir for run in runs} == {REPO / "results" / "actors" / "wallclock"}
    assert len(runs) == 2 * 2 * 5 * 3 and {run.seed for run in runs} == {0, 1, 2} and {run.lag for run in runs} == {"0"}
    assert {run.algorithm for run in runs} == {
        f"{variant}{update}"
        for variant in ("lagged_ppo", "lagged_ppo_actors4", "vaco_actors4", "lagged_ppo_actors4_p1", "vaco_actors4_p1")
        for update in ("", "@lat1ms")
    }
    assert "--workers 1" in grid.description
    for run in runs:
        latency = run.hyperparams.get("env_wrapper")
        assert (latency is not None) == (run.update == "lat1ms")
        if latency is not None:
            assert latency == {"sb3_vaco.common.wrappers.LatencyWrapper": {"latency": 0.001}}
        if "n_actors" in run.hyperparams:
            # the actors' batch is the synchronous run's: n_steps per actor x actors = the entry's n_steps x n_envs
            entry = zoo_entry(run.algo, run.env)
            batch = run.hyperparams["n_steps"] * run.hyperparams["n_actors"]
            assert batch == entry["n_steps"] * entry.get("n_envs", 1)
            default_pending = ActorSettings.__dataclass_fields__["max_pending_segments"].default
            pending = run.hyperparams.get("actor_backend_kwargs", {}).get("max_pending_segments", default_pending)
            # the default (about one version of lag) in the *_p1 cells, several versions of lag in the others
            assert pending == 1 if run.variant.endswith("_p1") else pending >= 3
        else:
            assert run.variant == "lagged_ppo"


def write_run(
    root: Path, env: str, algorithm: str, seed: int, returns: list[float], step_s: float, timed: bool = True, lag: float = 0.0
) -> None:
    """A synthetic result.json (+ progress.csv): evaluations every 10k steps, each after ``step_s`` more training seconds."""
    timesteps = [10_000 * (index + 1) for index in range(len(returns))]
    evaluations: dict = {"timesteps": timesteps, "mean_return": returns, "std_return": [0.0] * len(returns)}
    evaluations.update(mean_ep_length=[1000.0] * len(returns), returns=[[value] for value in returns])
    if timed:
        spent = [float(index) for index in range(len(returns))]  # one second per evaluation before
        evaluations["eval_time_s"] = spent
        evaluations["wall_s"] = [step_s * (index + 1) + spent[index] for index in range(len(returns))]
    record = {
        "env": env,
        "env_spec": env,
        "algorithm": algorithm,
        "lag": "0",
        "seed": seed,
        "n_timesteps": timesteps[-1],
        "eval_freq": 10_000,
        "n_eval_episodes": 5,
        "random_score": 0.0,
        "env_steps_per_s": 1000.0,
        "wall_time_s": 100.0,
        "cpu_time_s": 100.0,
        "command": "python scripts/benchmark.py --grid wallclock --workers 1",
        "git": "abc",
        "final_score": returns[-1],
        "auc_score": float(np.mean(returns)),
        "eval": evaluations,
        "versions": {"sb3_vaco": "0"},
    }
    run_dir = root / env / algorithm / "lag0" / f"seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps(record))
    (run_dir / "progress.csv").write_text(f"iteration,rollout/policy_lag_mean\n1,{lag}\n2,{lag}\n")


def test_wallclock_analysis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "wallclock"
    for seed in range(3):
        for update, slow in (("", 0.0), ("@lat1ms", 10.0)):
            # synchronous PPO: 10 s per 10k steps (20 with latency), final return 1000 -> thresholds 500 and 800
            write_run(results, "Hopper-v5", f"lagged_ppo{update}", seed, [600, 900, 1000, 1000], 10.0 + slow)
            # VACO on actors: slower per step in returns, faster per second
            write_run(results, "Hopper-v5", f"vaco_actors4{update}", seed, [300, 600, 850, 1000], 5.0, lag=4.0)
            # LaggedPPO on actors: reaches 800 in one seed of three
            final = 850 if seed == 0 else 700
            write_run(results, "Hopper-v5", f"lagged_ppo_actors4{update}", seed, [300, 500, 650, final], 5.0, lag=4.0)
    write_run(results, "Hopper-v5", "lagged_ppo", 9, [600, 900, 1000, 1000], 10.0, timed=False)  # an old record

    out = tmp_path / "analysis"
    assert analyze_script.main([str(results), "--out", str(out), "--reps", "20", "--wallclock"]) == 0
    assert "1 run(s) without eval timing" in capsys.readouterr().out

    assert (out / "wallclock_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    reach = pd.read_csv(out / "wallclock.csv")
    assert len(reach) == 3 * 6 * 2 and set(reach["fraction"]) == {0.5, 0.8}
    # threshold from the synchronous runs' final mean (seed 9 is left out: untimed)
    assert set(reach["threshold"].round(6)) == {500.0, 800.0}

    def times(method: str, setting: str, fraction: float) -> list[float]:
        rows = reach[(reach["method"] == method) & (reach["setting"] == setting) & (reach["fraction"] == fraction)]
        return rows.sort_values("seed")["train_s_to_threshold"].tolist()

    # training time = wall_s - eval_time_s: 10 s per evaluation interval for PPO, 20 s with latency, 5 s on actors
    assert times("lagged_ppo", "base", 0.8) == [20.0] * 3
    assert times("lagged_ppo", "lat1ms", 0.8) == [40.0] * 3
    assert times("vaco_actors4", "lat1ms", 0.8) == [15.0] * 3
    assert times("lagged_ppo_actors4", "base", 0.8) == [20.0, np.inf, np.inf]

    report = (out / "wallclock.md").read_text()
    assert "1 runs without eval timing" in report
    assert "| Hopper-v5 | lat1ms | vaco_actors4 | 800 | 3/3 | 15 | 2.67x | 30,000 |" in report
    assert "| Hopper-v5 | base | lagged_ppo_actors4 | 800 | 1/3 | not reached | – | not reached |" in report
    assert "| Hopper-v5 | base | vaco_actors4 | 500 | 3/3 | 10 | 1.00x | 20,000 |" in report
    assert "4.00" in report  # the measured lag
    assert "not started with `--workers 1`" not in report
    assert (out / "results.md").exists()  # the standard analysis ran too


def test_wallclock_analysis_without_timed_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "old", "Hopper-v5", "lagged_ppo", 0, [600, 900], 10.0, timed=False)
    assert wallclock.analyze_wallclock([tmp_path / "old"], tmp_path / "analysis") is None
    assert "no run with eval timing" in capsys.readouterr().out
    assert not (tmp_path / "analysis").exists()
