"""
The benchmark lab (``vaco_lab``, ``scripts/benchmark.py``, ``scripts/analyze.py``): parsing, grid construction
and the grids file's checks, the grid runner on a 2-run CartPole grid (result files, resume without retraining), and
the analysis on its output (single seed: CIs n/a) and on synthetic scores.
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

from sb3_vaco.zoo import ZOO_ALGOS
from vaco_lab import analysis, runner, study
from vaco_lab.common import lag_sort_key, parse_lag, parse_seeds, zoo_entry
from vaco_lab.grids import (
    Cell,
    Grid,
    GridFileError,
    load_grid_file,
    parse_update,
    parse_variant,
    select,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
GRIDS = load_grid_file(SCRIPTS / "grids.yml")
VARIANTS = GRIDS.variants

# 4 iterations of 8 envs x 32 steps (CartPole's zoo entry), evaluated at 512 and 1024 steps.
TINY_GRID = """
variants:
  vaco: {algo: vaco}
  lagged_ppo: {algo: lagged_ppo}
grids:
  tiny:
    description: two CartPole runs
    out: OUT
    envs: [CartPole-v1]
    variants: [vaco, lagged_ppo]
    lags: [0-2]
    seeds: 0
    n_timesteps: 1024
    eval_freq: 512
    n_eval_episodes: 2
"""
# The same grid on the command line, without the grids file's name.
AD_HOC_ARGS = [
    "--envs", "CartPole-v1",
    "--variants", "vaco", "lagged_ppo",
    "--lags", "0-2",
    "--seeds", "0",
    "--n-timesteps", "1024",
    "--eval-freq", "512",
    "--n-eval-episodes", "2",
    "--workers", "1",
]  # fmt: skip


def run_script(script: str, *args: str, returncode: int = 0) -> subprocess.CompletedProcess:
    completed = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert completed.returncode == returncode, completed.stdout + completed.stderr
    return completed


def write_grids(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grids.yml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def grid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("grid")
    out = folder / "out"
    grids_file = write_grids(folder, TINY_GRID.replace("OUT", str(out)))
    run_script("benchmark.py", "--grids-file", str(grids_file), "--grid", "tiny", "--workers", "1")
    return out


def test_parse_variant() -> None:
    variant = parse_variant("vaco:tv_threshold=0.05,tv_reference=behavior", VARIANTS)
    assert variant.name == "vaco+tv_threshold=0.05+tv_reference=behavior"
    assert variant.algo == "vaco"
    assert variant.hyperparams == {"tv_threshold": 0.05, "tv_reference": "behavior"}

    named = parse_variant("wide_spo=spo:clip_range=0.3", VARIANTS)
    assert (named.name, named.algo, named.hyperparams) == ("wide_spo", "spo", {"clip_range": 0.3})
    # A named variant of the file keeps its hyperparameters under the extra ones.
    paper = parse_variant("paper01=vaco_paper:tv_threshold=0.1", VARIANTS)
    assert paper.hyperparams == {**VARIANTS["vaco_paper"].hyperparams, "tv_threshold": 0.1}
    assert parse_variant("vaco_tvl20", VARIANTS) == VARIANTS["vaco_tvl20"]

    assert parse_variant("vaco:tv_threshold=1e-3,ratio_bound=null", VARIANTS).hyperparams == {
        "tv_threshold": 0.001,
        "ratio_bound": None,
    }
    with pytest.raises(ValueError, match="Unknown variant"):
        parse_variant("trpo", VARIANTS)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_variant("vaco:tv_threshold", VARIANTS)
    with pytest.raises(ValueError, match="folder names"):
        parse_variant("a/b=vaco", VARIANTS)


@pytest.mark.parametrize(("text", "lag"), [("0", 0), ("16", 16), ("0-8", (0, 8)), ("3-3", (3, 3))])
def test_parse_lag(text: str, lag: int | tuple[int, int]) -> None:
    assert parse_lag(text) == lag


@pytest.mark.parametrize("text", ["8-0", "-1", "a", "1-b"])
def test_parse_lag_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_lag(text)


def test_parse_seeds() -> None:
    assert parse_seeds(["0-2", "7"]) == (0, 1, 2, 7)
    assert parse_seeds("3-4") == (3, 4) and parse_seeds(2) == (2,) and parse_seeds([0, 1]) == (0, 1)
    for bad in (["0-1", "1"], ["a"], [True], []):
        with pytest.raises(ValueError):
            parse_seeds(bad)


def test_lag_order() -> None:
    assert sorted(["16", "0-8", "4", "0"], key=lag_sort_key) == ["0", "4", "0-8", "16"]


def test_variant_hyperparams_from_zoo_yaml() -> None:
    align_only, base = VARIANTS["vaco_align_only"], parse_update("base")
    # A variant adds only its own hyperparameters; the algo's YAML entry (with PPO's tuned clip range, 0.1 on
    # HalfCheetah-v5, for the clip-based baselines) is the zoo's to apply.
    assert runner.variant_hyperparams(align_only, base, "HalfCheetah-v5") == {}
    assert zoo_entry("vaco_align_only", "HalfCheetah-v5")["clip_range"] == 0.1
    assert "clip_range" not in zoo_entry("vaco_align_only", "InvertedPendulum-v5")
    assert "clip_range" not in zoo_entry("ppo_kl", "Hopper-v5")

    # xF scales the YAML value (Hopper: n_epochs 5, batch_size 32), else the constructor default (n_epochs 10, 64).
    update = parse_update("faster:n_epochs=x2,batch_size=x0.5")
    vaco = VARIANTS["vaco"]
    assert runner.variant_hyperparams(vaco, update, "Hopper-v5") == {"n_epochs": 10, "batch_size": 16}
    assert runner.variant_hyperparams(vaco, update, "InvertedPendulum-v5") == {"n_epochs": 20, "batch_size": 32}
    with pytest.raises(ValueError, match="not an integer"):
        runner.variant_hyperparams(vaco, parse_update("odd:n_epochs=x0.3"), "Hopper-v5")


def test_grid_interleaves_seeds(tmp_path: Path) -> None:
    runs = runner.build_grid(
        envs=["InvertedPendulum-v5", "Hopper-v5"],
        variants=[VARIANTS["vaco"], VARIANTS["lagged_ppo"]],
        lags=["0", "0-8"],
        updates=[parse_update("base"), parse_update("epochs2x:n_epochs=x2")],
        seeds=parse_seeds(["0-1"]),
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


def _cell(out: str, seeds: tuple[int, ...], variant: str = "vaco", n_timesteps: int = 1000) -> Cell:
    return Cell(Path(out), ("Hopper-v5",), (VARIANTS[variant],), ("4",), seeds, n_timesteps, 500)


def test_grid_runs_are_seed_major_across_cells_and_run_once(tmp_path: Path) -> None:
    grid = Grid("g", "", (_cell("a", (0, 1, 2)), _cell("b", (1,), "lagged_ppo"), _cell("a", (0, 1))))
    runs = runner.grid_runs(grid, tmp_path, {})
    # Seed-major over the cells; the third cell's runs are the first cell's, run once.
    assert [(run.out_dir.name, run.variant, run.seed) for run in runs] == [
        ("a", "vaco", 0),
        ("a", "vaco", 1),
        ("b", "lagged_ppo", 1),
        ("a", "vaco", 2),
    ]
    conflicting = Grid("g", "", (_cell("a", (0,)), _cell("a", (0,), n_timesteps=2000)))
    with pytest.raises(ValueError, match="twice, differently"):
        runner.grid_runs(conflicting, tmp_path, {})


def test_select_filters_and_overrides() -> None:
    lag_axis = GRIDS.grid("lag_axis")
    part = select(lag_axis, envs=["Hopper-v5"], lags=["4"], seeds=[7])
    # Only the cells that have Hopper-v5 at lag 4, with the given seeds
    assert [(str(cell.out), cell.envs, cell.lags, cell.seeds) for cell in part.cells] == [
        ("results/study/kl", ("Hopper-v5",), ("4",), (7,))
    ]
    with pytest.raises(ValueError, match="Walker2d-v5 not in grid 'lag_axis'"):
        select(lag_axis, envs=["Walker2d-v5"])
    with pytest.raises(ValueError, match="several folders"):
        select(lag_axis, out=Path("/tmp/x"))
    demo = select(GRIDS.grid("demo"), out=Path("/tmp/demo"), n_timesteps=1000)
    assert {(cell.out, cell.n_timesteps) for cell in demo.cells} == {(Path("/tmp/demo"), 1000)}


def test_grids_file_builds_with_todays_options() -> None:
    # Every grid builds (its hyperparameter names exist), and every variant passes its algorithm's own checks.
    for grid in GRIDS.grids.values():
        assert runner.grid_runs(grid, REPO, {}), grid.name
    classes = ZOO_ALGOS
    for variant in VARIANTS.values():
        classes[variant.algo]("MlpPolicy", None, _init_setup_model=False, **variant.hyperparams)


def test_grid_folders_and_run_names_are_kept() -> None:
    # Committed results and interrupted grids are found by these folders and names.
    # Every committed run of the robustness screen whose variant still runs (options retired since leave their runs
    # committed) is a run of its grid, so rerunning the grid resumes it
    robust = runner.grid_runs(GRIDS.grid("robust_screen"), REPO, {})
    assert {run.out_dir for run in robust} == {REPO / "results" / "robust"}
    committed = {
        path.parent.relative_to(REPO / "results" / "robust")
        for path in (REPO / "results" / "robust").glob("*/*/*/*/result.json")
        if path.parents[2].name in VARIANTS
    }
    assert committed and committed <= {Path(run.run_id) for run in robust}
    assert {run.hyperparams["tv_behavior_limit"] for run in robust if run.variant == "vaco_tvl20"} == {0.2}
    update_freq = {run.algorithm for run in runner.grid_runs(GRIDS.grid("update_freq"), REPO, {})}
    assert update_freq == {f"{v}{u}" for v in ("vaco", "lagged_ppo") for u in ("", "@epochs2x", "@batch_half")}


GOOD_CELL = "{out: o, envs: [Hopper-v5], variants: [vaco], lags: [0], seeds: 0, n_timesteps: 10, eval_freq: 5}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("grids: [1, 2]", "'grids' must be a non-empty mapping"),
        ("grid: {}", "unknown key.*'grid'"),
        ("grids: {g: {description: d, cells: [" + GOOD_CELL.replace("seeds", "seed") + "]}}", "cell 1: unknown key.*'seed'"),
        ("grids: {g: {description: d, cells: [{envs: [Hopper-v5]}]}}", "cell 1: missing key.*'out'"),
        ("grids: {g: {cells: [" + GOOD_CELL + "]}}", "'description'.*required"),
        ("grids: {g: {description: d, cells: [" + GOOD_CELL.replace("[vaco]", "[nope]") + "]}}", "Unknown variant 'nope'"),
        ("grids: {g: {description: d, cells: [" + GOOD_CELL.replace("[0]", "[8-0]") + "]}}", "K_min <= K_max"),
        ("grids: {g: {description: d, cells: [" + GOOD_CELL.replace("10,", "0,") + "]}}", "'n_timesteps' must be a positive"),
        ("grids: {g: {description: d, cells: [" + GOOD_CELL.replace("[0]", "[0, 0]") + "]}}", "repeated entry in 'lags'"),
        ("variants: {v: {algo: trpo}}\ngrids: {g: {description: d, cells: [" + GOOD_CELL + "]}}", "'algo' must be one of"),
        ("variants: {v: {algo: vaco, hyperparams: {policy_lag: 2}}}\ngrids: {}", "set by a cell's 'lags'"),
        ("variants: {v: {algo: vaco, params: {}}}\ngrids: {}", "variant 'v': unknown key.*'params'"),
        ("grids: {g: {description: d, cells: [" + GOOD_CELL + "]}", "not valid YAML"),
    ],
)
def test_grid_file_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(GridFileError, match=message):
        text = text if text.startswith("variants") else "variants: {vaco: {algo: vaco}}\n" + text
        load_grid_file(write_grids(tmp_path, text))


def test_unknown_hyperparameter_fails_before_running(tmp_path: Path) -> None:
    text = "variants: {old: {algo: vaco, hyperparams: {tv_ess_scaling: true}}}\ngrids: {g: {description: d, cells: ["
    grids_file = write_grids(tmp_path, text + GOOD_CELL.replace("[vaco]", "[old]") + "]}}")
    completed = run_script("benchmark.py", "--grids-file", str(grids_file), "--grid", "g", returncode=2)
    assert "variant 'old': tv_ess_scaling is not a hyperparameter of vaco" in completed.stderr


def test_demo_grid_dry_run(tmp_path: Path) -> None:
    # scripts/main_job.sh's grid, into a fresh folder
    dry_run = run_script("benchmark.py", "--grid", "demo", "--out", str(tmp_path), "--dry-run").stdout
    env = "InvertedPendulum-v5"
    assert f"[todo] {env}/lagged_ppo/lag0/seed0" in dry_run and f"[todo] {env}/vaco/lag16/seed2" in dry_run
    assert f"{env}/vaco/lag0/" not in dry_run  # PPO alone gives the lag-0 reference
    assert "9 runs, 0 done, 9 to run (1,080,000 env steps)" in dry_run
    one_seed = run_script("benchmark.py", "--grid", "demo", "--seeds", "3", "--out", str(tmp_path), "--dry-run").stdout
    assert "seed3" in one_seed and "seed0" not in one_seed and "3 runs, 0 done, 3 to run (360,000 env steps)" in one_seed
    assert "demo" in run_script("benchmark.py", "--list").stdout
    assert "No grid 'nope'" in run_script("benchmark.py", "--grid", "nope", returncode=2).stderr


def test_grid_results(grid_dir: Path) -> None:
    run_dirs = sorted(path.parent for path in grid_dir.rglob("result.json"))
    assert [path.relative_to(grid_dir).as_posix() for path in run_dirs] == [
        "CartPole-v1/lagged_ppo/lag0-2/seed0",
        "CartPole-v1/vaco/lag0-2/seed0",
    ]
    # Only the two small records per run: no model zips, monitors or scratch files.
    assert sorted({path.name for path in grid_dir.rglob("*") if path.is_file()}) == ["progress.csv.gz", "result.json"]

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
        assert "scripts/benchmark.py" in result["command"] and result["grid"] == "tiny"

        progress = pd.read_csv(run_dir / "progress.csv.gz")
        assert progress["timesteps"].tolist() == [256, 512, 768, 1024]
        assert (progress["rollout/policy_lag_max"] <= 2).all()
        assert (progress["rollout/policy_lag_mean"].iloc[1:] > 0).any()
        # Every train() call is recorded with its own rollout, also across the evaluation's logger dump.
        assert progress["train/n_updates"].tolist() == [20, 40, 60, 80]
        assert progress["train/tv_behavior"].notna().all()

    vaco_progress = pd.read_csv(grid_dir / "CartPole-v1/vaco/lag0-2/seed0/progress.csv.gz")
    assert {"train/tv_estimate", "train/filtered_fraction", "train/approx_kl"} <= set(vaco_progress.columns)


def test_grid_results_record_eval_wall_clock(grid_dir: Path) -> None:
    # Every evaluation is timed: seconds from the start of learn() to its start, and seconds spent in the ones before.
    for path in sorted(grid_dir.rglob("result.json")):
        result = json.loads(path.read_text())
        evaluations = result["eval"]
        wall, spent = np.array(evaluations["wall_s"]), np.array(evaluations["eval_time_s"])
        assert len(wall) == len(spent) == len(evaluations["timesteps"]) == 2
        assert 0 < wall[0] < wall[1] <= result["learn_time_s"]
        assert spent[0] == 0 and spent[1] > 0 and (np.diff(wall - spent) > 0).all()


def test_rerun_skips_finished_runs(grid_dir: Path) -> None:
    # The same grid given on the command line finds the grid's runs: same folders and names.
    results = sorted(grid_dir.rglob("result.json"))
    mtimes = [path.stat().st_mtime_ns for path in results]
    completed = run_script("benchmark.py", *AD_HOC_ARGS, "--out", str(grid_dir))
    assert "2 of 2 runs already finished: skipped; 0 to run" in completed.stdout
    assert [path.stat().st_mtime_ns for path in results] == mtimes


def test_unfinished_run_is_listed_again(grid_dir: Path, tmp_path: Path) -> None:
    # A run without result.json (interrupted after writing progress.csv) counts as not done.
    copy = tmp_path / "grid"
    shutil.copytree(grid_dir, copy)
    (copy / "CartPole-v1/vaco/lag0-2/seed0/result.json").unlink()
    grids_file = write_grids(tmp_path, TINY_GRID.replace("OUT", str(copy)))
    dry_run = run_script("benchmark.py", "--grids-file", str(grids_file), "--grid", "tiny", "--dry-run").stdout
    assert "[todo] CartPole-v1/vaco/lag0-2/seed0" in dry_run
    assert "[done] CartPole-v1/lagged_ppo/lag0-2/seed0" in dry_run
    assert "2 runs, 1 done, 1 to run (1,024 env steps)" in dry_run


def test_analyze_single_seed(grid_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "analysis"
    run_script("analyze.py", str(grid_dir), "--out", str(out), "--reps", "200")
    report = (out / "results.md").read_text()
    assert "| CartPole-v1 | CartPole-v1 | 1,024 |" in report
    assert "[n/a]" in report  # one seed: no CIs
    assert "--grid tiny" in report  # the exact benchmark command
    assert "| vaco | lagged_ppo | 0-2 | 1 | 1 vs 1 |" in report  # probability of improvement row
    for name in ("score_vs_lag.png", "learning_curves.png", "aggregate_intervals.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs["algorithm"]) == ["lagged_ppo", "vaco"]
    assert runs[["final_norm", "auc_norm"]].notna().all().all()
    # --versus: the peers table, here with LaggedPPO as the only peer; --algorithms keeps only the ones named
    versus = tmp_path / "versus"
    run_script("analyze.py", str(grid_dir), "--out", str(versus), "--reps", "50", "--versus", "vaco")
    peers = pd.read_csv(versus / "peers.csv")
    assert set(peers["best peer"]) == {"lagged_ppo"} and {"vaco", "vaco / best peer low"} <= set(peers.columns)
    alone = tmp_path / "alone"
    run_script("analyze.py", str(grid_dir), "--out", str(alone), "--reps", "50", "--algorithms", "vaco")
    assert set(pd.read_csv(alone / "runs.csv")["algorithm"]) == {"vaco"}


def test_analysis_pools_grids_and_filters_envs(grid_dir: Path, tmp_path: Path) -> None:
    # One grid split in two folders, as a study's extra variants beside the main grid
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(grid_dir, first)
    shutil.copytree(grid_dir, second)
    shutil.rmtree(first / "CartPole-v1/vaco")
    shutil.rmtree(second / "CartPole-v1/lagged_ppo")
    runs, curves = analysis.load_runs([first, second])
    assert sorted(runs["algorithm"]) == ["lagged_ppo", "vaco"] and len(curves) == 2
    assert analysis.load_runs([first, second], envs=["Hopper-v5"])[0].empty
    assert analysis.load_runs([first, second], lags=["0-2"])[0]["lag"].tolist() == ["0-2", "0-2"]
    assert analysis.load_runs([first, second], lags=["4"])[0].empty
    with pytest.raises(SystemExit, match="appears twice"):
        analysis.load_runs([grid_dir, first])


def test_run_diagnostics_summarize_progress(grid_dir: Path) -> None:
    # Mean lag over the iterations, the largest lag of the run, and a running count's last value
    runs, _ = analysis.load_runs([grid_dir])
    for run in runs.itertuples(index=False):
        progress = pd.read_csv(Path(run.path) / "progress.csv.gz")
        row = runs.set_index("path").loc[run.path]
        assert row["measured lag"] == pytest.approx(progress["rollout/policy_lag_mean"].mean())
        assert row["max lag"] == progress["rollout/policy_lag_max"].max() <= 2
        assert np.isnan(row["segments dropped"])  # no actors: no such column


def test_stratified_bootstrap() -> None:
    rng = np.random.default_rng(0)
    single = analysis.stratified_bootstrap(np.mean, [np.array([[1.0, 2.0]])], reps=100, rng=rng)
    assert single.value == 1.5 and single.low is None and single.format() == "1.5 [n/a]"

    scores = rng.normal(size=(10, 3))
    interval = analysis.stratified_bootstrap(analysis.metrics.aggregate_iqm, [scores], reps=500, rng=rng)
    assert interval.low is not None and interval.high is not None
    assert interval.low <= interval.value <= interval.high
    # Resampling stays within each task (column): a constant column per task gives a degenerate CI.
    constant = np.tile([[1.0, 2.0, 3.0]], (5, 1))
    degenerate = analysis.stratified_bootstrap(analysis.metrics.aggregate_mean, [constant], reps=200, rng=rng)
    assert degenerate.low == degenerate.high == pytest.approx(2.0)
    # A clearly better sample wins every resample.
    better = analysis.stratified_bootstrap(
        analysis.metrics.probability_of_improvement, [scores + 100.0, scores], reps=200, rng=rng
    )
    assert better.value == better.low == better.high == 1.0


def test_bootstrap_interval_covers_the_mean() -> None:
    # The 95% percentile CI of a mean of 20 normal draws covers the true mean about 95% of the time.
    rng = np.random.default_rng(1)
    covered = []
    for _ in range(200):
        interval = analysis.stratified_bootstrap(np.mean, [rng.normal(3.0, 2.0, size=(20, 1))], reps=200, rng=rng)
        assert interval.low is not None and interval.high is not None
        covered.append(interval.low <= 3.0 <= interval.high)
    assert 0.85 <= np.mean(covered) <= 0.99


def test_lag_tick_labels_add_gradient_steps() -> None:
    # Measured means over iterations: 3.5 updates = 280 gradient steps, so 80 gradient steps per update.
    runs = pd.DataFrame({"lag": ["0", "4", "0-8"], "measured lag": [0.0, 3.5, 3.9], "lag in grad steps": [0.0, 280.0, 312.0]})
    assert analysis.lag_tick_labels(runs, ["0", "4", "16", "0-8"]) == ["0\n(0)", "4\n(320)", "16\n(1,280)", "0-8"]
    # Without lagged runs there is nothing to measure the steps per update from.
    assert analysis.lag_tick_labels(runs.iloc[:1], ["0"]) == ["0"]


def test_normalization() -> None:
    def run(algorithm: str, lag: str, final: float, random_score: float) -> dict:
        return {"env": "E", "algorithm": algorithm, "lag": lag, "final": final, "random_score": random_score}

    runs = pd.DataFrame(
        [run("lagged_ppo", "0", 100.0, 10.0), run("lagged_ppo", "0", 120.0, 14.0), run("vaco", "4", 300.0, 12.0)]
    )
    constants = analysis.normalize(runs, "lagged_ppo", "0").loc["E"]
    assert (constants["random"], constants["reference"], constants["n_reference"]) == (12.0, 110.0, 2)
    # Without the reference cell: the best cell's mean final score.
    constants = analysis.normalize(runs[runs["algorithm"] == "vaco"], "lagged_ppo", "0").loc["E"]
    assert constants["reference"] == 300.0 and "missing" in constants["source"]
    # Nothing beats random: scores are only shifted by the random score.
    constants = analysis.normalize(pd.DataFrame([run("vaco", "0", 5.0, 12.0)]), "lagged_ppo", "0").loc["E"]
    assert constants["reference"] - constants["random"] == 1.0


def test_study_lag_points() -> None:
    # A variant measured at one lag only has no line to draw; LaggedPPO is always drawn; ranges are left out.
    rows = [
        ("vaco", "0", 0, 10.0),
        ("vaco", "0", 1, 12.0),
        ("vaco", "4", 0, 8.0),
        ("vaco_kl", "4", 0, 9.0),
        ("lagged_ppo", "0", 0, 11.0),
        ("vaco", "0-8", 0, 7.0),
    ]
    runs = pd.DataFrame(
        [{"env": "Hopper-v5", "algorithm": a, "lag": lag, "seed": seed, "final": final} for a, lag, seed, final in rows]
    )
    points = study.lag_points(runs, reps=50, rng=np.random.default_rng(0)).set_index(["variant", "lag"])
    assert sorted(points.index) == [("lagged_ppo", "0"), ("vaco", "0"), ("vaco", "4")]
    assert points.loc[("vaco", "0"), "n"] == 2 and points.loc[("vaco", "0"), "mean"] == 11.0


def test_robustness_table_flags_envs_worse_than_the_baseline() -> None:
    """IQM ratios to the baseline and to lag 0 in closed form, and the env whose ratio CI lies below 1 is named."""
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(5):
        jitter = 0.001 * seed
        for env, vaco_score in (("A", 2.0), ("B", 0.5)):
            rows.append({"env": env, "algorithm": "lagged_ppo", "lag": "4", "seed": seed, "final_norm": 1.0 + jitter})
            rows.append({"env": env, "algorithm": "vaco", "lag": "4", "seed": seed, "final_norm": vaco_score + jitter})
            rows.append({"env": env, "algorithm": "vaco", "lag": "0", "seed": seed, "final_norm": 1.0 + jitter})
    runs = pd.DataFrame(rows)
    runs["auc_norm"] = runs["best_norm"] = runs["final_norm"]
    runs["fell"] = analysis.fell(runs)
    versus_reference, _ = analysis.ratio_tables(runs, ["lagged_ppo", "vaco"], "lagged_ppo", 200, rng)
    table = analysis.robustness_table(runs, ["lagged_ppo", "vaco"], "lagged_ppo", versus_reference, 200, rng)
    lag4 = table[table["lag"] == "4"].iloc[0]
    scores = np.array([[2.0 + 0.001 * s, 0.5 + 0.001 * s] for s in range(5)])
    baseline = np.array([[1.0 + 0.001 * s] * 2 for s in range(5)])
    from rliable import metrics

    assert lag4["IQM / baseline"].value == pytest.approx(metrics.aggregate_iqm(scores) / metrics.aggregate_iqm(baseline))
    assert lag4["IQM / own lag 0"].value == pytest.approx(metrics.aggregate_iqm(scores) / metrics.aggregate_iqm(baseline))
    assert lag4["envs worse (CI < 1)"] == "B"
    assert table[table["lag"] == "0"].iloc[0]["envs worse (CI < 1)"] == "none"


def test_falls_are_counted_against_the_baseline() -> None:
    """A run falls when it reached half of the reference's score and ends below half of its best evaluation; the
    robustness table counts an algorithm's falls at each lag beside the baseline's on the same envs."""
    rows = []
    for seed, (final, best) in enumerate([(0.9, 1.0), (0.4, 1.0), (0.26, 0.5), (0.24, 0.5), (0.0, 0.49)]):
        rows.append({"env": "A", "algorithm": "vaco", "lag": "4", "seed": seed, "final_norm": final, "best_norm": best})
        rows.append({"env": "A", "algorithm": "lagged_ppo", "lag": "4", "seed": seed, "final_norm": 1.0, "best_norm": 1.0})
    rows.append({"env": "B", "algorithm": "lagged_ppo", "lag": "4", "seed": 0, "final_norm": 0.1, "best_norm": 1.0})
    runs = pd.DataFrame(rows)
    runs["auc_norm"] = runs["final_norm"]
    runs["fell"] = analysis.fell(runs)
    assert runs[runs["algorithm"] == "vaco"]["fell"].tolist() == [False, True, False, True, False]
    rng = np.random.default_rng(0)
    versus_reference, _ = analysis.ratio_tables(runs, ["lagged_ppo", "vaco"], "lagged_ppo", 50, rng)
    row = analysis.robustness_table(runs, ["lagged_ppo", "vaco"], "lagged_ppo", versus_reference, 50, rng).iloc[0]
    # The baseline's fall on env B, where VACO has no run, is left out of the comparison.
    assert (row["falls"], row["baseline's falls"]) == ("2 of 5", "0 of 5")


def test_dips_are_falls_counted_at_every_evaluation() -> None:
    """Evaluations after the curve first reaches half of the reference's score dip when below half of the best so far;
    the last one dips exactly when the run fell; the dip table compares the per-run rates with the baseline's."""
    curve = np.array([0.2, 0.6, 0.25, 0.9, 0.4, 0.9])  # reaches 0.5 at the second evaluation; dips at 0.25 and 0.4
    assert analysis.dips(curve) == (4, 2)
    assert analysis.dips(np.array([0.4, 0.45, 0.1])) == (0, 0)  # never learned: nothing to fall from
    for ending in (0.44, 0.46):
        ended = np.append(curve, ending)
        fell = analysis.fell(pd.DataFrame({"best_norm": [ended.max()], "final_norm": [ending]})).item()
        assert fell == (ending < 0.45) == (analysis.dips(ended)[1] == 3)
    rows = []
    for seed in range(4):
        rows.append({"env": "A", "algorithm": "vaco", "lag": "8", "seed": seed, "evals_learned": 10, "dips": 2 + seed})
        rows.append({"env": "A", "algorithm": "lagged_ppo", "lag": "8", "seed": seed, "evals_learned": 10, "dips": 0})
    rows.append({"env": "A", "algorithm": "lagged_ppo", "lag": "8", "seed": 4, "evals_learned": 0, "dips": 0})
    runs = pd.DataFrame(rows)
    runs["dip_rate"] = runs["dips"] / runs["evals_learned"].where(runs["evals_learned"] > 0)
    row = analysis.dip_table(runs, ["lagged_ppo", "vaco"], "lagged_ppo", 200, np.random.default_rng(0)).iloc[0]
    assert (row["dips"], row["baseline's dips"], row["n"]) == ("14 of 40", "0 of 40", "4 vs 5")
    assert row["dip rate − baseline's"].value == pytest.approx(0.35)  # the run that never learned is left out
    assert row["verdict"] == "more dips"


def test_peer_table_names_the_best_peer_and_what_the_ci_says() -> None:
    """Per env the best other algorithm is named and the focus's IQM ratio to it is in closed form; the aggregate
    row is over the envs every algorithm has."""
    rows = []
    scores = {("A", "vaco"): 2.0, ("A", "appo"): 1.0, ("A", "ppo_kl"): 1.5, ("B", "vaco"): 0.5, ("B", "appo"): 1.0}
    scores[("B", "ppo_kl")] = 0.8
    for (env, algorithm), score in scores.items():
        for seed in range(5):
            rows.append({"env": env, "algorithm": algorithm, "lag": "16", "seed": seed, "final_norm": score + 0.01 * seed})
    rows.append({"env": "C", "algorithm": "vaco", "lag": "16", "seed": 0, "final_norm": 1.0})  # no peer on C
    table = analysis.peer_table(pd.DataFrame(rows), "vaco", ["vaco", "appo", "ppo_kl"], 200, np.random.default_rng(0))
    cells = table.set_index("env")
    assert list(cells.index) == ["A", "B", "IQM over 2 envs"]
    assert cells.loc["A", "best peer"] == "ppo_kl" and cells.loc["B", "best peer"] == "appo"
    assert cells.loc["A", "vaco / best peer"].value == pytest.approx(2.02 / 1.52)
    assert (cells.loc["A", "verdict"], cells.loc["B", "verdict"]) == ("better", "worse")
    from rliable import metrics

    both = {name: np.array([[scores[("A", name)] + 0.01 * s, scores[("B", name)] + 0.01 * s] for s in range(5)])
            for name in ("vaco", "appo", "ppo_kl")}  # fmt: skip
    best = max(("appo", "ppo_kl"), key=lambda name: metrics.aggregate_iqm(both[name]))
    assert cells.loc["IQM over 2 envs", "best peer"] == best
    expected = metrics.aggregate_iqm(both["vaco"]) / metrics.aggregate_iqm(both[best])
    assert cells.loc["IQM over 2 envs", "vaco / best peer"].value == pytest.approx(expected)
