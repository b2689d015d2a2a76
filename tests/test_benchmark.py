"""
Benchmark machinery (scripts/): grid construction, the grid runner on a 2-run CartPole grid (result files, resume
without retraining), and the analysis on its output (single seed: CIs n/a).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("rl_zoo3")
pytest.importorskip("rliable")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import analyze  # noqa: E402
import benchmark  # noqa: E402
from _bench_common import lag_sort_key, parse_lag  # noqa: E402

# 4 iterations of 8 envs x 32 steps (CartPole's zoo entry), evaluated at 512 and 1024 steps.
GRID_ARGS = [
    "--envs", "CartPole-v1",
    "--variants", "vaco", "lagged_ppo",
    "--lags", "0-2",
    "--seeds", "0",
    "--n-timesteps", "1024",
    "--eval-freq", "512",
    "--n-eval-episodes", "2",
    "--workers", "1",
]  # fmt: skip


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    completed = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed


@pytest.fixture(scope="module")
def grid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grid")
    run_script("benchmark.py", *GRID_ARGS, "--out", str(out))
    return out


def test_parse_variant() -> None:
    variant = benchmark.parse_variant("vaco:tv_threshold=0.05,tv_reference=learner")
    assert variant.name == "vaco+tv_threshold=0.05+tv_reference=learner"
    assert variant.algo == "vaco"
    assert variant.hyperparams == {"tv_threshold": 0.05, "tv_reference": "learner"}

    named = benchmark.parse_variant("wide_spo=spo:clip_range=0.3")
    assert (named.name, named.algo) == ("wide_spo", "vaco")
    assert named.hyperparams == {"policy_loss": "spo", "advantage_estimator": "gae", "clip_range": 0.3}

    assert benchmark.parse_variant("vaco:kl_coef=1e-3,realign_every_epoch=true").hyperparams == {
        "kl_coef": 0.001,
        "realign_every_epoch": True,
    }
    with pytest.raises(ValueError, match="Unknown variant"):
        benchmark.parse_variant("trpo")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        benchmark.parse_variant("vaco:tv_threshold")


@pytest.mark.parametrize(("text", "lag"), [("0", 0), ("16", 16), ("0-8", (0, 8)), ("3-3", (3, 3))])
def test_parse_lag(text: str, lag: int | tuple[int, int]) -> None:
    assert parse_lag(text) == lag


@pytest.mark.parametrize("text", ["8-0", "-1", "a", "1-b"])
def test_parse_lag_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_lag(text)


def test_lag_order() -> None:
    assert sorted(["16", "0-8", "4", "0"], key=lag_sort_key) == ["0", "4", "0-8", "16"]


def test_variant_hyperparams_from_zoo_yaml() -> None:
    align_only = benchmark.parse_variant("vaco_align_only")
    base = benchmark.parse_update("base")
    # PPO's tuned clip range of the env (lagged_ppo.yml): 0.1 on HalfCheetah; none in the InvertedPendulum entry.
    assert benchmark.variant_hyperparams(align_only, base, "HalfCheetah-v5") == {"policy_loss": "clip", "clip_range": 0.1}
    assert benchmark.variant_hyperparams(align_only, base, "InvertedPendulum-v5") == {"policy_loss": "clip"}
    assert "clip_range" not in benchmark.variant_hyperparams(benchmark.parse_variant("ppo_kl"), base, "Hopper-v5")

    # xF scales the YAML value (Hopper: n_epochs 5, batch_size 32), else the constructor default (n_epochs 10).
    update = benchmark.parse_update("faster:n_epochs=x2,batch_size=x0.5")
    vaco = benchmark.parse_variant("vaco")
    assert benchmark.variant_hyperparams(vaco, update, "Hopper-v5") == {"n_epochs": 10, "batch_size": 16}
    assert benchmark.variant_hyperparams(vaco, update, "InvertedPendulum-v5") == {"n_epochs": 20, "batch_size": 32}
    with pytest.raises(ValueError, match="not an integer"):
        benchmark.variant_hyperparams(vaco, benchmark.parse_update("odd:n_epochs=x0.3"), "Hopper-v5")


def test_grid_interleaves_seeds(tmp_path: Path) -> None:
    runs = benchmark.build_grid(
        envs=["InvertedPendulum-v5", "Hopper-v5"],
        variants=[benchmark.parse_variant("vaco"), benchmark.parse_variant("lagged_ppo")],
        lags=["0", "0-8"],
        updates=[benchmark.parse_update("base"), benchmark.parse_update("epochs2x:n_epochs=x2")],
        seeds=benchmark.parse_seeds(["0-1"]),
        out_dir=tmp_path,
        n_timesteps=None,
        eval_freq=10_000,
        n_eval_episodes=10,
        context={},
    )
    assert len(runs) == 2 * 2 * 2 * 2 * 2
    # Every cell's seed 0 runs before any seed 1.
    assert [run.seed for run in runs] == [0] * 16 + [1] * 16
    assert runs[0].run_id == "InvertedPendulum-v5/vaco/lag0/seed0"
    assert len({run.run_dir for run in runs}) == len(runs)
    ranged = next(run for run in runs if run.lag == "0-8" and run.algorithm == "lagged_ppo@epochs2x")
    assert ranged.hyperparams == {"n_epochs": 20, "policy_lag": [0, 8]}
    assert ranged.run_dir == tmp_path / "InvertedPendulum-v5" / "lagged_ppo@epochs2x" / "lag0-8" / "seed0"
    assert {run.n_timesteps for run in runs} == {1_000_000}  # the YAML entries' n_timesteps


def test_presets_build() -> None:
    for name, preset in benchmark.PRESETS.items():
        runs, out_dir = benchmark.grid_from_args(benchmark.parse_args(["--preset", name]))
        expected = len(preset.envs) * len(preset.variants) * len(preset.lags) * len(preset.seeds) * len(preset.updates)
        assert len(runs) == expected, name
        assert out_dir.name == name
    demo, _ = benchmark.grid_from_args(benchmark.parse_args(["--preset", "demo", "--seeds", "3"]))
    assert {run.seed for run in demo} == {3} and {run.n_timesteps for run in demo} == {50_000}


def test_stratified_bootstrap() -> None:
    rng = np.random.default_rng(0)
    single = analyze.stratified_bootstrap(np.mean, [np.array([[1.0, 2.0]])], reps=100, rng=rng)
    assert single.value == 1.5 and single.low is None and single.format() == "1.5 [n/a]"

    scores = rng.normal(size=(10, 3))
    interval = analyze.stratified_bootstrap(analyze.metrics.aggregate_iqm, [scores], reps=500, rng=rng)
    assert interval.low is not None and interval.high is not None
    assert interval.low <= interval.value <= interval.high
    # Resampling stays within each task (column): a constant column per task gives a degenerate CI.
    constant = np.tile([[1.0, 2.0, 3.0]], (5, 1))
    degenerate = analyze.stratified_bootstrap(analyze.metrics.aggregate_mean, [constant], reps=200, rng=rng)
    assert degenerate.low == degenerate.high == pytest.approx(2.0)
    # A clearly better sample wins every resample.
    better = analyze.stratified_bootstrap(
        analyze.metrics.probability_of_improvement, [scores + 100.0, scores], reps=200, rng=rng
    )
    assert better.value == better.low == better.high == 1.0


def test_lag_tick_labels_add_gradient_steps() -> None:
    # Measured means over iterations: 3.5 updates = 280 gradient steps, so 80 gradient steps per update.
    runs = pd.DataFrame({"lag": ["0", "4", "0-8"], "measured lag": [0.0, 3.5, 3.9], "lag in grad steps": [0.0, 280.0, 312.0]})
    assert analyze.lag_tick_labels(runs, ["0", "4", "16", "0-8"]) == ["0\n(0)", "4\n(320)", "16\n(1,280)", "0-8"]
    # Without lagged runs there is nothing to measure the steps per update from.
    assert analyze.lag_tick_labels(runs.iloc[:1], ["0"]) == ["0"]


def test_grid_results(grid_dir: Path) -> None:
    run_dirs = sorted(path.parent for path in grid_dir.rglob("result.json"))
    assert [path.relative_to(grid_dir).as_posix() for path in run_dirs] == [
        "CartPole-v1/lagged_ppo/lag0-2/seed0",
        "CartPole-v1/vaco/lag0-2/seed0",
    ]
    # Only the two small records per run: no model zips, monitors or scratch files.
    assert sorted({path.name for path in grid_dir.rglob("*") if path.is_file()}) == ["progress.csv", "result.json"]

    for run_dir in run_dirs:
        result = json.loads((run_dir / "result.json").read_text())
        assert result["env"] == "CartPole-v1" and result["lag"] == "0-2" and result["seed"] == 0
        assert result["policy_lag"] == [0, 2]
        assert result["num_timesteps"] == 1024
        assert result["eval"]["timesteps"] == [512, 1024]
        assert [len(returns) for returns in result["eval"]["returns"]] == [2, 2]
        assert result["final_score"] == result["eval"]["mean_return"][-1]
        assert result["auc_score"] == pytest.approx(np.mean(result["eval"]["mean_return"]))
        assert result["random_score"] > 0 and result["env_steps_per_s"] > 0
        assert 0 < result["learn_time_s"] < result["wall_time_s"] and result["cpu_time_s"] > 0
        # The zoo's CartPole entry (n_envs 8, n_steps 32) was used, with the run's overrides on top.
        assert result["hyperparams"]["zoo"]["n_envs"] == 8
        assert result["hyperparams"]["zoo"]["n_timesteps"] == 1024
        assert result["hyperparams"]["resolved"]["n_steps"] == 32
        assert result["hyperparams"]["resolved"]["policy_lag"] == [0, 2]
        assert {"stable_baselines3", "sb3_vaco", "torch", "gymnasium"} <= set(result["versions"])
        assert "scripts/benchmark.py" in result["command"]

        progress = pd.read_csv(run_dir / "progress.csv")
        assert progress["timesteps"].tolist() == [256, 512, 768, 1024]
        assert (progress["rollout/policy_lag_max"] <= 2).all()
        assert (progress["rollout/policy_lag_mean"].iloc[1:] > 0).any()
        # Every train() call is recorded with its own rollout, also across the evaluation's logger dump.
        assert progress["train/n_updates"].tolist() == [20, 40, 60, 80]
        assert progress["train/tv_behavior"].notna().all()

    vaco_progress = pd.read_csv(grid_dir / "CartPole-v1/vaco/lag0-2/seed0/progress.csv")
    assert {"train/tv_estimate", "train/filtered_fraction", "train/approx_kl"} <= set(vaco_progress.columns)


def test_rerun_skips_finished_runs(grid_dir: Path) -> None:
    results = sorted(grid_dir.rglob("result.json"))
    mtimes = [path.stat().st_mtime_ns for path in results]
    completed = run_script("benchmark.py", *GRID_ARGS, "--out", str(grid_dir))
    assert "2 of 2 runs already finished: skipped; 0 to run" in completed.stdout
    assert [path.stat().st_mtime_ns for path in results] == mtimes


def test_unfinished_run_is_listed_again(grid_dir: Path, tmp_path: Path) -> None:
    # A run without result.json (interrupted after writing progress.csv) counts as not done.
    copy = tmp_path / "grid"
    shutil.copytree(grid_dir, copy)
    (copy / "CartPole-v1/vaco/lag0-2/seed0/result.json").unlink()
    dry_run = run_script("benchmark.py", *GRID_ARGS, "--out", str(copy), "--dry-run").stdout
    assert "[todo] CartPole-v1/vaco/lag0-2/seed0" in dry_run
    assert "[done] CartPole-v1/lagged_ppo/lag0-2/seed0" in dry_run
    assert "2 runs, 1 done, 1 to run (1,024 env steps)" in dry_run


def test_analyze_single_seed(grid_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "analysis"
    run_script("analyze.py", str(grid_dir), "--out", str(out), "--reps", "200")
    report = (out / "results.md").read_text()
    assert "| CartPole-v1 | CartPole-v1 | 1,024 |" in report
    assert "[n/a]" in report  # one seed: no CIs
    assert "--n-timesteps 1024" in report  # the exact benchmark command
    assert "| vaco | lagged_ppo | 0-2 | 1 | 1 vs 1 |" in report  # probability of improvement row
    for name in ("score_vs_lag.png", "learning_curves.png", "aggregate_intervals.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs["algorithm"]) == ["lagged_ppo", "vaco"]
    assert runs[["final_norm", "auc_norm"]].notna().all().all()


def test_analysis_pools_grids_and_filters_envs(grid_dir: Path, tmp_path: Path) -> None:
    # One grid split in two folders, as a study's extra variants beside the main grid
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(grid_dir, first)
    shutil.copytree(grid_dir, second)
    shutil.rmtree(first / "CartPole-v1/vaco")
    shutil.rmtree(second / "CartPole-v1/lagged_ppo")
    runs, curves = analyze.load_runs([first, second])
    assert sorted(runs["algorithm"]) == ["lagged_ppo", "vaco"] and len(curves) == 2
    assert analyze.load_runs([first, second], envs=["Hopper-v5"])[0].empty
    assert analyze.load_runs([first, second], lags=["0-2"])[0]["lag"].tolist() == ["0-2", "0-2"]
    assert analyze.load_runs([first, second], lags=["4"])[0].empty
    with pytest.raises(SystemExit, match="appears twice"):
        analyze.load_runs([grid_dir, first])


def test_normalization() -> None:
    def run(algorithm: str, lag: str, final: float, random_score: float) -> dict:
        return {"env": "E", "algorithm": algorithm, "lag": lag, "final": final, "random_score": random_score}

    runs = pd.DataFrame(
        [run("lagged_ppo", "0", 100.0, 10.0), run("lagged_ppo", "0", 120.0, 14.0), run("vaco", "4", 300.0, 12.0)]
    )
    constants = analyze.normalize(runs, "lagged_ppo", "0").loc["E"]
    assert (constants["random"], constants["reference"], constants["n_reference"]) == (12.0, 110.0, 2)
    # Without the reference cell: the best cell's mean final score.
    constants = analyze.normalize(runs[runs["algorithm"] == "vaco"], "lagged_ppo", "0").loc["E"]
    assert constants["reference"] == 300.0 and "missing" in constants["source"]
    # Nothing beats random: scores are only shifted by the random score.
    constants = analyze.normalize(pd.DataFrame([run("vaco", "0", 5.0, 12.0)]), "lagged_ppo", "0").loc["E"]
    assert constants["reference"] - constants["random"] == 1.0


def test_study_plots_from_committed_results(tmp_path: Path) -> None:
    import study_plots

    assert study_plots.main(["--out", str(tmp_path), "--reps", "50"]) == 0
    assert (tmp_path / "score_vs_lag_variants.png").stat().st_size > 0 and (tmp_path / "delta_sensitivity.png").exists()
    points = pd.read_csv(tmp_path / "study_points.csv", dtype={"lag": str})
    by_lag = points[points["plot"] == "score_vs_lag_variants"].set_index(["env", "variant", "lag"])
    # The main grid's defaults at lag 4 on HalfCheetah-v5: 5 seeds, mean final 4451 (README), inside its CI.
    defaults = by_lag.loc[("HalfCheetah-v5", "vaco", "4")]
    assert defaults["n"] == 5 and round(defaults["mean"]) == 4451 and defaults["low"] < defaults["mean"] < defaults["high"]
    # A variant measured at one lag only has no line to draw; LaggedPPO is always drawn.
    assert ("HalfCheetah-v5", "vaco_kl", "4") not in by_lag.index and ("Hopper-v5", "lagged_ppo", "0") in by_lag.index
    # The δ plot keeps the 100k-step screen apart from the 300k-step runs of the same name.
    delta = points[points["plot"] == "delta_sensitivity"]
    screen_ppo = delta[(delta["panel"] == "Hopper-v5 (100k-step screen)") & (delta["variant"] == "lagged_ppo")]
    assert screen_ppo["n"].tolist() == [3] and round(screen_ppo["mean"].iloc[0]) == 995
