"""
Wall-clock to a return (``scripts/analyze.py --wallclock``): return against training time and against env steps,
and the time each method takes to reach a threshold return, from the evaluations' timing that the runner records
(``eval["wall_s"]`` and ``eval["eval_time_s"]`` in ``result.json``).

* **Training time** of an evaluation: ``wall_s − eval_time_s``, the seconds from the start of ``learn()`` to the start
  of that evaluation less the seconds spent in the evaluations before it. Evaluations cost what the episodes cost
  (longer for a policy that survives, and 1 ms per step with the latency wrapper): they are the protocol's, not the
  method's, and are left out.
* **Methods** are the grid's variants (``lagged_ppo``, ``vaco_actors4``, ...), a run at an injected lag other than
  the reference's shown as ``variant lag L``; **settings** are the update labels (``base``, ``lat1ms``: the part of
  the algorithm label after ``@``). The reference (default ``lagged_ppo`` at lag 0: synchronous PPO) is taken in the
  same setting.
* **Threshold** of an env: ``random + f · (reference − random)``, with ``reference`` the mean final return of the
  reference's runs of that env over all settings (the latency does not change what synchronous PPO learns per env
  step, so both settings are compared at one return), ``random`` the mean return of uniform random actions, and
  ``f`` each of the threshold fractions (default 0.5 and 0.8). A run reaches it at its first evaluation whose mean
  return is at least the threshold; one that never does counts as infinitely slow, so the median over seeds is
  finite only when more than half of them reached it.

Writes ``wallclock.md`` (tables, one per fraction), ``wallclock.csv`` (one row per run and fraction) and
``wallclock_curves.png`` (per env and setting: return vs training time, and vs env steps, mean over seeds with the
seeds' curves, thresholds dashed). Runs without eval timing (recorded before it existed) are left out, with a message.
"""

import json
import shlex
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from vaco_lab.analysis import load_runs, markdown_table, palette_colors
from vaco_lab.common import RESULT_FILE, atomic_write_text

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DEFAULT_FRACTIONS = (0.5, 0.8)
BASE_SETTING = "base"
TIME_LABEL = "training wall-clock (s, evaluations excluded)"


def method_and_setting(algorithm: str, lag: str, reference_lag: str) -> tuple[str, str]:
    """``vaco_actors4@lat1ms`` at lag 0 → ``("vaco_actors4", "lat1ms")``; another lag than the reference's is named."""
    variant, _, update = algorithm.partition("@")
    return (variant if lag == reference_lag else f"{variant} lag {lag}"), (update or BASE_SETTING)


def load_timed_runs(
    results_dirs: Sequence[Path],
    reference_lag: str = "0",
    envs: Sequence[str] | None = None,
    lags: Sequence[str] | None = None,
) -> tuple[pd.DataFrame, dict[tuple[str, str, str, int], pd.DataFrame], list[str]]:
    """
    The finished runs whose evaluations are timed, with their curves; and the runs left out (no ``eval["wall_s"]``).

    :return: the runs table (:func:`~vaco_lab.analysis.load_runs`'s, plus ``method``, ``setting``,
        ``train_s`` and ``train_steps_per_s``), each run's curve (``timesteps``, ``return``, ``wall_s``,
        ``train_s``) keyed by ``(env, algorithm, lag, seed)``, and the left-out runs' folders
    """
    runs, _ = load_runs(results_dirs, envs, lags)
    if runs.empty:
        return runs, {}, []
    keep, skipped, curves = [], [], {}
    for index, row in runs.iterrows():
        evaluations = json.loads((Path(row["path"]) / RESULT_FILE).read_text())["eval"]
        if "wall_s" not in evaluations:
            skipped.append(str(row["path"]))
            continue
        curve = pd.DataFrame(
            {
                "timesteps": evaluations["timesteps"],
                "return": evaluations["mean_return"],
                "wall_s": evaluations["wall_s"],
                "train_s": np.subtract(evaluations["wall_s"], evaluations.get("eval_time_s", 0.0)),
            }
        )
        curves[(row["env"], row["algorithm"], row["lag"], row["seed"])] = curve
        keep.append(index)
    timed = runs.loc[keep].copy()
    if timed.empty:
        return timed, curves, skipped
    labels = [method_and_setting(a, lag, reference_lag) for a, lag in zip(timed["algorithm"], timed["lag"], strict=True)]
    timed["method"] = [method for method, _ in labels]
    timed["setting"] = [setting for _, setting in labels]
    last = [curves[key].iloc[-1] for key in zip(timed["env"], timed["algorithm"], timed["lag"], timed["seed"], strict=True)]
    timed["train_s"] = [float(point["train_s"]) for point in last]
    timed["train_steps_per_s"] = [
        float(point["timesteps"] / point["train_s"]) if point["train_s"] > 0 else np.nan for point in last
    ]
    return timed.reset_index(drop=True), curves, skipped


def thresholds(runs: pd.DataFrame, reference: str, fractions: Sequence[float]) -> pd.DataFrame:
    """Per env and fraction: ``random + f · (reference's mean final return − random)`` (see the module docstring)."""
    rows = []
    for env, env_runs in runs.groupby("env"):
        reference_runs = env_runs[env_runs["method"] == reference]
        if reference_runs.empty:
            continue
        floor, top = float(env_runs["random_score"].mean()), float(reference_runs["final"].mean())
        for fraction in fractions:
            rows.append(
                {
                    "env": env,
                    "fraction": fraction,
                    "threshold": floor + fraction * (top - floor),
                    "random": floor,
                    "reference final": top,
                    "n_reference": len(reference_runs),
                }
            )
    return pd.DataFrame(rows)


def first_reach(curve: pd.DataFrame, threshold: float) -> tuple[float, float, float]:
    """Training seconds, env steps and wall seconds at the first evaluation at or above ``threshold`` (inf: never)."""
    reached = curve[curve["return"] >= threshold]
    if reached.empty:
        return np.inf, np.inf, np.inf
    point = reached.iloc[0]
    return float(point["train_s"]), float(point["timesteps"]), float(point["wall_s"])


def time_to_threshold(
    runs: pd.DataFrame, curves: dict[tuple[str, str, str, int], pd.DataFrame], limits: pd.DataFrame
) -> pd.DataFrame:
    """One row per run and threshold fraction: when the run first reached the threshold (inf: never)."""
    rows = []
    for run in runs.rename(columns={"measured lag": "measured_lag"}).itertuples(index=False):
        curve = curves[(run.env, run.algorithm, run.lag, run.seed)]
        for limit in limits[limits["env"] == run.env].itertuples(index=False):
            train_s, steps, wall_s = first_reach(curve, limit.threshold)
            rows.append(
                {
                    "env": run.env,
                    "setting": run.setting,
                    "method": run.method,
                    "algorithm": run.algorithm,
                    "lag": run.lag,
                    "seed": run.seed,
                    "fraction": limit.fraction,
                    "threshold": limit.threshold,
                    "train_s_to_threshold": train_s,
                    "steps_to_threshold": steps,
                    "wall_s_to_threshold": wall_s,
                    "final": run.final,
                    "train_s": run.train_s,
                    "train_steps_per_s": run.train_steps_per_s,
                    "measured_lag": run.measured_lag,
                }
            )
    return pd.DataFrame(rows)


def _median(values: pd.Series) -> float:
    return float(np.median(values.to_numpy(dtype=float))) if len(values) else np.nan


def _seconds(value: float) -> str:
    return "not reached" if np.isinf(value) else "–" if np.isnan(value) else f"{value:.0f}"


def summary_table(reach: pd.DataFrame, reference: str, fraction: float, methods: Sequence[str]) -> pd.DataFrame:
    """Per env, setting and method: median time and steps to the threshold, speed-up over the reference, lag, rate."""
    rows = []
    part = reach[reach["fraction"] == fraction]
    order = {method: index for index, method in enumerate(methods)}
    for (env, setting), cell in part.groupby(["env", "setting"]):
        reference_runs = cell[cell["method"] == reference]
        reference_time = _median(reference_runs["train_s_to_threshold"]) if len(reference_runs) else np.nan
        for method in sorted(cell["method"].unique(), key=lambda name: order.get(name, len(order))):
            runs = cell[cell["method"] == method]
            time_s = _median(runs["train_s_to_threshold"])
            speedup = reference_time / time_s if np.isfinite(time_s) and np.isfinite(reference_time) else np.nan
            steps = _median(runs["steps_to_threshold"])
            final_sd = f" ± {runs['final'].std():.0f}" if len(runs) > 1 else ""
            lag = runs["measured_lag"].mean()
            rows.append(
                {
                    "env": env,
                    "setting": setting,
                    "method": method,
                    "threshold": f"{runs['threshold'].iloc[0]:.0f}",
                    "reached": f"{int(np.isfinite(runs['train_s_to_threshold']).sum())}/{len(runs)}",
                    "median s to threshold": _seconds(time_s),
                    f"speed-up vs {reference}": "–" if np.isnan(speedup) else f"{speedup:.2f}x",
                    "median steps to threshold": "not reached" if np.isinf(steps) else f"{steps:,.0f}",
                    "training steps/s": f"{runs['train_steps_per_s'].median():.0f}",
                    "measured lag": "–" if np.isnan(lag) else f"{lag:.2f}",
                    "final (mean ± sd)": f"{runs['final'].mean():.0f}{final_sd}",
                }
            )
    table = pd.DataFrame(rows)
    if not table.empty:
        settings = sorted(table["setting"].unique(), key=lambda s: (s != BASE_SETTING, s))
        table["_order"] = [(e, settings.index(s)) for e, s in zip(table["env"], table["setting"], strict=True)]
        table = table.sort_values("_order", kind="stable").drop(columns="_order")
    return table


def _mean_curve(curves: Sequence[pd.DataFrame], column: str) -> tuple[np.ndarray, np.ndarray]:
    """The seeds' mean return on a common grid of ``column`` (up to where every seed has data)."""
    end = min(float(curve[column].iloc[-1]) for curve in curves)
    start = max(float(curve[column].iloc[0]) for curve in curves)
    grid = np.linspace(start, end, 200) if end > start else np.array([end])
    return grid, np.mean([np.interp(grid, curve[column], curve["return"]) for curve in curves], axis=0)


def plot_wallclock(
    runs: pd.DataFrame,
    curves: dict[tuple[str, str, str, int], pd.DataFrame],
    limits: pd.DataFrame,
    methods: Sequence[str],
    path: Path,
) -> None:
    """Per env and setting (rows): return vs training time and vs env steps (columns), mean over seeds and each seed."""
    panels = sorted(
        {(env, setting) for env, setting in zip(runs["env"], runs["setting"], strict=True)},
        key=lambda panel: (panel[0], panel[1] != BASE_SETTING, panel[1]),
    )
    colors = palette_colors(methods)
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.3 * len(panels)), squeeze=False)
    for row, (env, setting) in enumerate(panels):
        cell = runs[(runs["env"] == env) & (runs["setting"] == setting)]
        for column, (x, label) in enumerate((("train_s", TIME_LABEL), ("timesteps", "env steps"))):
            ax = axes[row, column]
            for method in methods:
                own = cell[cell["method"] == method]
                if own.empty:
                    continue
                run_curves = [curves[key] for key in zip(own["env"], own["algorithm"], own["lag"], own["seed"], strict=True)]
                for curve in run_curves:
                    ax.plot(curve[x], curve["return"], color=colors[method], alpha=0.25, linewidth=0.8)
                grid, mean = _mean_curve(run_curves, x)
                ax.plot(grid, mean, color=colors[method], linewidth=2, label=f"{method} (n={len(run_curves)})")
            for limit in limits[limits["env"] == env].itertuples(index=False):
                ax.axhline(limit.threshold, color="grey", linestyle="--", linewidth=0.8)
                ax.annotate(f"{limit.fraction:g}", (1.0, limit.threshold), xycoords=("axes fraction", "data"),
                            fontsize="x-small", color="grey", ha="right", va="bottom")  # fmt: skip
            ax.set_title(f"{env}, {setting}", fontsize="medium")
            ax.set_xlabel(label)
            ax.set_ylabel("eval return")
            ax.grid(alpha=0.3)
        axes[row, 0].legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _workers_one(command: str) -> bool:
    """Whether a benchmark command ran with ``--workers 1`` (the default is 2)."""
    words = shlex.split(command) if command else []
    return any(
        word == "--workers=1" or (word == "--workers" and index + 1 < len(words) and words[index + 1] == "1")
        for index, word in enumerate(words)
    )


def write_wallclock_report(
    out_dir: Path,
    results_dirs: Sequence[Path],
    runs: pd.DataFrame,
    limits: pd.DataFrame,
    tables: dict[float, pd.DataFrame],
    reference: str,
    skipped: Sequence[str],
) -> None:
    """``wallclock.md``: what was measured, the thresholds, one table per fraction, the plot."""
    commands = sorted(runs["command"].dropna().unique())
    shared = [command for command in commands if not _workers_one(command)]
    limit_table = limits.copy()
    for column in ("threshold", "random", "reference final"):
        limit_table[column] = limit_table[column].map(lambda value: f"{value:.0f}")
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    sections = [
        f"# Wall-clock to a return: {' + '.join(f'`{results_dir.name}`' for results_dir in results_dirs)}",
        "",
        f"{len(runs)} timed runs; generated {generated} by:",
        "",
        "```",
        shlex.join(["python", *sys.argv]),
        "```",
        "",
    ]
    if skipped:
        sections += [f"{len(skipped)} runs without eval timing (`eval.wall_s`) are left out.", ""]
    if shared:
        sections += [
            "**Some runs were not started with `--workers 1`: they may have shared the cores with other runs, and their "
            "times say little about speed.**",
            "",
        ]
    sections += [
        "Time is **training wall-clock**: seconds from the start of `learn()` to the start of an evaluation, less the "
        "seconds spent in the evaluations before it (`eval.wall_s − eval.eval_time_s`); actor start-up is included. "
        f"Threshold of an env: `random + f · ({reference} final − random)`, `{reference} final` = the mean final return "
        f"of {reference}'s runs (all settings), `random` = uniform random actions. A run reaches it at its first "
        "evaluation at or above it (resolution: the evaluation interval); medians over seeds count a run that never "
        f"reached it as infinitely slow. Speed-up: {reference}'s median time in the same setting over the method's. "
        "Training steps/s: env steps over training time of the whole run. Measured lag: mean policy versions behind the "
        "learner (`rollout/policy_lag_mean`).",
        "",
        markdown_table(limit_table[["env", "fraction", "threshold", "random", "reference final", "n_reference"]]),
    ]
    for fraction, table in tables.items():
        sections += [f"## Threshold {fraction:g}", "", markdown_table(table)]
    sections += [
        "## Curves",
        "",
        "![return vs wall-clock and env steps](wallclock_curves.png)",
        "",
        "Benchmark command(s):",
        "",
        "```",
        *commands,
        "```",
        "",
    ]
    atomic_write_text(out_dir / "wallclock.md", "\n".join(sections))


def analyze_wallclock(
    results_dirs: Sequence[Path],
    out_dir: Path,
    reference: str = "lagged_ppo",
    reference_lag: str = "0",
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    envs: Sequence[str] | None = None,
    lags: Sequence[str] | None = None,
) -> pd.DataFrame | None:
    """
    Write ``wallclock.md``, ``wallclock.csv`` and ``wallclock_curves.png`` into ``out_dir``; return the per-run
    table, or None (with a message) when no run has eval timing or no env has reference runs.
    """
    runs, curves, skipped = load_timed_runs(results_dirs, reference_lag, envs, lags)
    if skipped:
        print(
            f"Wall-clock analysis: {len(skipped)} run(s) without eval timing (eval.wall_s, which older records lack) "
            f"left out, e.g. {skipped[0]}"
        )
    if runs.empty:
        print("Wall-clock analysis: no run with eval timing (eval.wall_s): nothing written")
        return None
    limits = thresholds(runs, reference, fractions)
    missing = sorted(set(runs["env"]) - set(limits["env"] if not limits.empty else []))
    if missing:
        print(f"Wall-clock analysis: no timed {reference} run (lag {reference_lag}) on {', '.join(missing)}: left out")
        runs = runs[~runs["env"].isin(missing)].reset_index(drop=True)
    if runs.empty:
        print("Wall-clock analysis: no env with reference runs: nothing written")
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(runs["method"]))
    methods = sorted(names, key=lambda name: (name != reference, names.index(name)))  # the reference first
    reach = time_to_threshold(runs, curves, limits)
    tables = {fraction: summary_table(reach, reference, fraction, methods) for fraction in fractions}
    write_wallclock_report(out_dir, results_dirs, runs, limits, tables, reference, skipped)
    plot_wallclock(runs, curves, limits, methods, out_dir / "wallclock_curves.png")
    atomic_write_text(out_dir / "wallclock.csv", reach.to_csv(index=False))
    return reach
