"""
Aggregate benchmark grids written by :mod:`vaco_lab.runner`: rliable metrics (IQM, mean, median, optimality
gap) with stratified-bootstrap 95% confidence intervals, probability of improvement over a reference algorithm at
each lag, score ratios, learning curves and score-vs-lag plots, and a markdown report (:func:`analyze`).

Works on a partly finished grid (every number states its n) and on a single seed (CIs shown as n/a). Writes
``results.md``, ``runs.csv``, ``aggregate.csv``, ``robustness.csv``, ``score_vs_lag.png``, ``learning_curves.png`` and
``aggregate_intervals.png``; ``docs/benchmarks.md`` explains the scores and their normalization.
"""

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from rliable import metrics

from vaco_lab.common import PLAIN_PROGRESS_FILE, PROGRESS_FILE, RESULT_FILE, atomic_write_text, lag_sort_key

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SCORES = {"final": "final eval", "auc": "area under the eval curve"}
AGGREGATE_METRICS: dict[str, Callable[[np.ndarray], float]] = {
    "IQM": metrics.aggregate_iqm,
    "mean": metrics.aggregate_mean,
    "median": metrics.aggregate_median,
    "optimality gap": metrics.aggregate_optimality_gap,
}
# Per-iteration statistics summarized per run, as named in progress.csv, with how: the mean over the run's
# iterations, the maximum, or the last value (a running count).
DIAGNOSTICS = {
    "measured lag": ("rollout/policy_lag_mean", "mean"),
    "max lag": ("rollout/policy_lag_max", "max"),
    "lag in grad steps": ("rollout/policy_lag_grad_steps_mean", "mean"),
    "segments dropped": ("rollout/actor_segments_dropped", "last"),
    "TV(π_T, μ)": ("train/tv_behavior", "mean"),
    "TV est.": ("train/tv_estimate", "mean"),
    "filtered": ("train/filtered_fraction", "mean"),
    "approx KL": ("train/approx_kl", "mean"),
    "clip frac.": ("train/clip_fraction", "mean"),
}
CI_LEVEL = 0.95
# A run "fell" when its best evaluation reached LEARNED (normalized: 1 = the reference, 0 = random) and its final
# score is below FALL_FRACTION of that best.
LEARNED = 0.5
FALL_FRACTION = 0.5


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap CI (None when there are too few runs to resample: n < 2)."""

    value: float
    low: float | None = None
    high: float | None = None

    def verdict(self, higher: str = "better", lower: str = "worse", null: float = 1.0) -> str:
        """What the CI says: ``higher`` above ``null`` (1 for a ratio), ``lower`` below it, else no significant
        difference."""
        if self.low is None or self.high is None:
            return "n/a (one run)"
        if self.low > null:
            return higher
        if self.high < null:
            return lower
        return "no significant difference"

    def format(self, digits: int = 3) -> str:
        point = f"{self.value:.{digits}g}"
        if self.low is None or self.high is None:
            return f"{point} [n/a]"
        return f"{point} [{self.low:.{digits}g}, {self.high:.{digits}g}]"


def load_runs(
    results_dirs: Sequence[Path], envs: Sequence[str] | None = None, lags: Sequence[str] | None = None
) -> tuple[pd.DataFrame, dict[tuple[str, str, str, int], pd.DataFrame]]:
    """
    One row per finished run (scores, timing, provenance, diagnostics averaged over the run) and each run's eval curve.

    :param results_dirs: grids to pool (a run may appear in only one of them)
    :param envs: keep only these envs; None: all
    :param lags: keep only these lag settings (labels as in the results: ``"4"``, ``"0-8"``); None: all
    :return: the runs table and the eval curves keyed by ``(env, algorithm, lag, seed)``
    """
    rows, curves = [], {}
    paths = [path for results_dir in results_dirs for path in sorted(results_dir.rglob(RESULT_FILE))]
    for path in paths:
        record = json.loads(path.read_text())
        if (envs is not None and record["env"] not in envs) or (lags is not None and record["lag"] not in lags):
            continue
        row: dict[str, Any] = {
            key: record[key]
            for key in (
                "env",
                "env_spec",
                "algorithm",
                "lag",
                "seed",
                "n_timesteps",
                "eval_freq",
                "n_eval_episodes",
                "random_score",
                "env_steps_per_s",
                "wall_time_s",
                "command",
                "git",
            )
        }
        row.update(final=record["final_score"], auc=record["auc_score"], cpu_time_s=record.get("cpu_time_s", np.nan))
        row["best"] = max(record["eval"]["mean_return"])
        row["path"] = str(path.parent)
        row.update({f"version {name}": version for name, version in record["versions"].items()})
        progress_paths = [path.parent / name for name in (PROGRESS_FILE, PLAIN_PROGRESS_FILE) if (path.parent / name).exists()]
        progress = pd.read_csv(progress_paths[0]) if progress_paths else pd.DataFrame()
        for name, (column, reduction) in DIAGNOSTICS.items():
            values = progress[column].dropna() if column in progress else pd.Series(dtype=float)
            row[name] = float(values.iloc[-1] if reduction == "last" else values.agg(reduction)) if len(values) else np.nan
        key = (row["env"], row["algorithm"], row["lag"], row["seed"])
        if key in curves:
            raise SystemExit(f"Run {'/'.join(map(str, key))} appears twice: {path.parent} and another folder")
        rows.append(row)
        curves[key] = pd.DataFrame({"timesteps": record["eval"]["timesteps"], "return": record["eval"]["mean_return"]})
    return pd.DataFrame(rows), curves


def normalize(runs: pd.DataFrame, reference: str, reference_lag: str) -> pd.DataFrame:
    """
    Per env: ``(score − random) / (reference − random)``, with ``random`` the mean return of uniform random actions
    (measured by each run) and ``reference`` the mean final score of ``reference`` at ``reference_lag`` in these
    results. Without that cell (or when it does not beat random), the best cell's mean final score is used.
    Final and AUC scores share the constants, so 1 = the reference's final score and 0 = random.

    :return: the normalization constants per env (``random``, ``reference``, ``source``)
    """
    constants = []
    for env, env_runs in runs.groupby("env"):
        floor = float(env_runs["random_score"].mean())
        reference_runs = env_runs[(env_runs["algorithm"] == reference) & (env_runs["lag"] == reference_lag)]
        top, source = (
            float(reference_runs["final"].mean()) if len(reference_runs) else np.nan,
            f"{reference} lag {reference_lag}",
        )
        if not top > floor:
            best = env_runs.groupby(["algorithm", "lag"])["final"].mean()
            top, source = (
                float(best.max()),
                f"best cell ({'/'.join(map(str, best.idxmax()))}), {reference} lag {reference_lag} missing",
            )
        if not top > floor:
            top, source = floor + 1.0, "none beats random: score − random (unscaled)"
        constants.append({"env": env, "random": floor, "reference": top, "n_reference": len(reference_runs), "source": source})
    return pd.DataFrame(constants).set_index("env")


def fell(runs: pd.DataFrame) -> pd.Series:
    """
    Whether each run fell off what it had learned: its best evaluation reached ``LEARNED`` and its final score is
    below ``FALL_FRACTION`` of that best, both normalized (``best_norm``, ``final_norm``; 1 = the reference, 0 = random).
    """
    return (runs["best_norm"] >= LEARNED) & (runs["final_norm"] < FALL_FRACTION * runs["best_norm"])


def _falls_text(cell: pd.DataFrame) -> str:
    return f"{int(cell['fell'].sum())} of {len(cell)}"


def dips(curve: np.ndarray) -> tuple[int, int]:
    """
    A fall counted at every evaluation, not at the last only: of a run's normalized eval curve, the evaluations after
    the first one that reached ``LEARNED``, and how many of them *dipped*, ending below ``FALL_FRACTION`` of the best
    evaluation so far. The last evaluation dips exactly when the run :func:`fell`.

    :return: ``(evaluations after reaching LEARNED, dips among them)``
    """
    best = np.maximum.accumulate(curve)
    after = np.concatenate([[False], best[:-1] >= LEARNED])
    return int(after.sum()), int((after & (curve < FALL_FRACTION * best)).sum())


def _dips_text(cell: pd.DataFrame) -> str:
    return f"{int(cell['dips'].sum())} of {int(cell['evals_learned'].sum())}"


def _difference_of_means(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(x) - np.mean(y))


def dip_table(
    runs: pd.DataFrame, algorithms: Sequence[str], reference: str, reps: int, rng: np.random.Generator
) -> pd.DataFrame:
    """
    Per env and lag, each algorithm's dips (:func:`dips`) beside the reference's at the same lag: the counts, and the
    difference of the mean dip rates per run (dips over evaluations after reaching ``LEARNED``; runs that never
    reached it left out) with its bootstrap CI over the runs and the verdict it supports.
    """
    rows = []
    for env in sorted(runs["env"].unique()):
        env_runs = runs[runs["env"] == env]
        for algorithm in algorithms:
            baseline = reference_for(algorithm, reference)
            if algorithm == baseline:
                continue
            for lag in ordered_lags(env_runs):
                at_lag = env_runs[env_runs["lag"] == lag]
                cell, other = (at_lag[at_lag["algorithm"] == name] for name in (algorithm, baseline))
                if cell.empty or other.empty:
                    continue
                row: dict[str, Any] = {"env": env, "algorithm": algorithm, "lag": lag, "n": f"{len(cell)} vs {len(other)}"}
                row["dips"], row["baseline's dips"] = _dips_text(cell), _dips_text(other)
                learned = [frame.loc[frame["evals_learned"] > 0, ["dip_rate"]].to_numpy() for frame in (cell, other)]
                if min(len(rates) for rates in learned):
                    row["dip rate − baseline's"] = difference = stratified_bootstrap(_difference_of_means, learned, reps, rng)
                    row["verdict"] = difference.verdict("more dips", "fewer dips", null=0.0)
                rows.append(row)
    return pd.DataFrame(rows)


def stratified_bootstrap(
    statistic: Callable[..., float], samples: Sequence[np.ndarray], reps: int, rng: np.random.Generator
) -> Interval:
    """
    Percentile CI of ``statistic(*samples)``, each sample a ``(runs, tasks)`` matrix whose runs are resampled with
    replacement within each task, independently per sample (rliable's StratifiedBootstrap / StratifiedIndependentBootstrap).
    No CI when a sample has fewer than 2 runs.
    """
    value = float(statistic(*samples))
    if min(len(sample) for sample in samples) < 2:
        return Interval(value)
    replicates = np.empty(reps)
    indices = [rng.integers(0, len(sample), size=(reps, *sample.shape)) for sample in samples]
    for rep in range(reps):
        replicates[rep] = statistic(
            *(np.take_along_axis(sample, index[rep], axis=0) for sample, index in zip(samples, indices, strict=True))
        )
    tail = 100 * (1 - CI_LEVEL) / 2
    low, high = np.nanpercentile(replicates, [tail, 100 - tail])
    return Interval(value, float(low), float(high))


def score_matrix(cell: pd.DataFrame, column: str, envs: Sequence[str]) -> np.ndarray:
    """``(n, len(envs))`` scores, n the fewest runs of any env; each env keeps its lowest seeds."""
    per_env = [cell[cell["env"] == env].sort_values("seed")[column].to_numpy() for env in envs]
    n = min(len(scores) for scores in per_env)
    return np.stack([scores[:n] for scores in per_env], axis=1)


def ordered_lags(runs: pd.DataFrame) -> list[str]:
    return sorted(runs["lag"].unique(), key=lag_sort_key)


def lag_tick_labels(runs: pd.DataFrame, lags: Sequence[str]) -> list[str]:
    """Tick labels for one env's lags: the lag in updates and, below it, in gradient steps (the issue reports both).

    Gradient steps per update are measured, as the ratio of the logged lag in gradient steps to the lag in updates
    (both are means over a run's iterations); a random range ``"0-8"`` keeps its label only.
    """
    lagged = runs["measured lag"] > 0
    steps_per_update = float((runs["lag in grad steps"][lagged] / runs["measured lag"][lagged]).median())
    if not np.isfinite(steps_per_update):
        return list(lags)
    return [f"{lag}\n({round(int(lag) * steps_per_update):,})" if str(lag).isdigit() else str(lag) for lag in lags]


def ordered_algorithms(runs: pd.DataFrame, reference: str) -> list[str]:
    """The reference first, then the others in order of first appearance."""
    names = list(dict.fromkeys(runs["algorithm"]))
    return sorted(names, key=lambda name: (name.split("@")[0] != reference, names.index(name)))


def reference_for(algorithm: str, reference: str) -> str:
    """The reference under the same update setting: ``vaco@epochs2x`` is compared with ``lagged_ppo@epochs2x``."""
    _, sep, update = algorithm.partition("@")
    return f"{reference}{sep}{update}"


def aggregate_table(runs: pd.DataFrame, algorithms: Sequence[str], reps: int, rng: np.random.Generator) -> pd.DataFrame:
    """rliable aggregates of the normalized scores over envs, per algorithm, lag and score, with their CIs."""
    rows = []
    for algorithm in algorithms:
        for lag in ordered_lags(runs):
            cell = runs[(runs["algorithm"] == algorithm) & (runs["lag"] == lag)]
            if cell.empty:
                continue
            envs = sorted(cell["env"].unique())
            for score in SCORES:
                matrix = score_matrix(cell, f"{score}_norm", envs)
                row: dict[str, Any] = {"algorithm": algorithm, "lag": lag, "score": score, "envs": len(envs)}
                row["n"] = len(matrix)
                row["runs"] = len(cell)
                for name, function in AGGREGATE_METRICS.items():
                    row[name] = stratified_bootstrap(function, [matrix], reps, rng)
                rows.append(row)
    return pd.DataFrame(rows)


def improvement_table(
    runs: pd.DataFrame, algorithms: Sequence[str], reference: str, reps: int, rng: np.random.Generator
) -> pd.DataFrame:
    """Probability of improvement of each algorithm over the reference at the same lag, over the envs both ran."""
    rows = []
    for algorithm in algorithms:
        baseline = reference_for(algorithm, reference)
        if algorithm == baseline:
            continue
        for lag in ordered_lags(runs):
            cell_x = runs[(runs["algorithm"] == algorithm) & (runs["lag"] == lag)]
            cell_y = runs[(runs["algorithm"] == baseline) & (runs["lag"] == lag)]
            envs = sorted(set(cell_x["env"]) & set(cell_y["env"]))
            if not envs:
                continue
            row: dict[str, Any] = {"algorithm": algorithm, "baseline": baseline, "lag": lag, "envs": len(envs)}
            for score in SCORES:
                x, y = score_matrix(cell_x, f"{score}_norm", envs), score_matrix(cell_y, f"{score}_norm", envs)
                row["n"] = f"{len(x)} vs {len(y)}"
                row[score] = stratified_bootstrap(metrics.probability_of_improvement, [x, y], reps, rng)
            rows.append(row)
    return pd.DataFrame(rows)


def _ratio_of_means(x: np.ndarray, y: np.ndarray) -> float:
    denominator = float(np.mean(y))
    return float(np.mean(x)) / denominator if denominator != 0 else np.nan


def ratio_tables(
    runs: pd.DataFrame, algorithms: Sequence[str], reference: str, reps: int, rng: np.random.Generator
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """
    Per env and lag, ratios of mean normalized scores (= of mean ``score − random``), with bootstrap CIs:
    each algorithm over the reference at the same lag, and each algorithm at lag L over itself at lag 0.
    """
    versus_reference: list[dict[str, Any]] = []
    versus_lag0: list[dict[str, Any]] = []
    lags = ordered_lags(runs)
    for env in sorted(runs["env"].unique()):
        env_runs = runs[runs["env"] == env]
        for algorithm in algorithms:
            own = env_runs[env_runs["algorithm"] == algorithm]
            baseline = env_runs[env_runs["algorithm"] == reference_for(algorithm, reference)]
            for lag in lags:
                cell = own[own["lag"] == lag]
                if cell.empty:
                    continue
                pairs = []
                if algorithm != reference_for(algorithm, reference):
                    pairs.append((versus_reference, baseline[baseline["lag"] == lag]))
                if lag != "0":
                    pairs.append((versus_lag0, own[own["lag"] == "0"]))
                for table, other in pairs:
                    if other.empty:
                        continue
                    row: dict[str, Any] = {"env": env, "algorithm": algorithm, "lag": lag, "n": f"{len(cell)} vs {len(other)}"}
                    for score in SCORES:
                        x, y = (frame[[f"{score}_norm"]].to_numpy() for frame in (cell, other))
                        row[score] = stratified_bootstrap(_ratio_of_means, [x, y], reps, rng)
                    if table is versus_reference:
                        row["verdict (final)"] = row["final"].verdict()
                    else:
                        row["keeps (final)"] = row["final"].verdict("gains", "loses")
                    table.append(row)
    return pd.DataFrame(versus_reference), pd.DataFrame(versus_lag0)


def _iqm_ratio(x: np.ndarray, y: np.ndarray) -> float:
    denominator = float(metrics.aggregate_iqm(y))
    return float(metrics.aggregate_iqm(x)) / denominator if denominator != 0 else np.nan


def robustness_table(
    runs: pd.DataFrame,
    algorithms: Sequence[str],
    reference: str,
    versus_reference: pd.DataFrame,
    reps: int,
    rng: np.random.Generator,
) -> pd.DataFrame:
    """
    Per algorithm and lag, on final scores: the aggregate IQM over envs relative to the reference's at the same lag
    and to the algorithm's own at lag 0 (each over the envs both cells have, stratified independent bootstrap), and
    the envs whose per-env ratio to the reference has its CI's upper bound below 1 (worse than the reference); and how
    many of its runs and of the baseline's on those envs fell (:func:`fell`).
    """
    rows = []
    for algorithm in algorithms:
        baseline = reference_for(algorithm, reference)
        if algorithm == baseline:
            continue
        own = runs[runs["algorithm"] == algorithm]
        for lag in ordered_lags(own):
            cell = own[own["lag"] == lag]
            row: dict[str, Any] = {"algorithm": algorithm, "baseline": baseline, "lag": lag}
            for column, other in (
                ("IQM / baseline", runs[(runs["algorithm"] == baseline) & (runs["lag"] == lag)]),
                ("IQM / own lag 0", own[own["lag"] == "0"] if lag != "0" else own.iloc[:0]),
            ):
                envs = sorted(set(cell["env"]) & set(other["env"]))
                if column == "IQM / baseline":
                    row["envs"] = len(envs)
                if envs:
                    matrices = [score_matrix(frame, "final_norm", envs) for frame in (cell, other)]
                    row[column] = stratified_bootstrap(_iqm_ratio, matrices, reps, rng)
            ratios = versus_reference
            if not ratios.empty:
                ratios = ratios[(ratios["algorithm"] == algorithm) & (ratios["lag"] == lag)]
            worse = [env for env, ratio in zip(ratios.get("env", []), ratios.get("final", []), strict=True)
                     if ratio.high is not None and ratio.high < 1.0]  # fmt: skip
            row["envs worse (CI < 1)"] = ", ".join(worse) or "none"
            baseline_cell = runs[(runs["algorithm"] == baseline) & (runs["lag"] == lag) & runs["env"].isin(cell["env"])]
            row["falls"] = _falls_text(cell)
            row["baseline's falls"] = _falls_text(baseline_cell)
            rows.append(row)
    return pd.DataFrame(rows)


def peer_table(runs: pd.DataFrame, focus: str, algorithms: Sequence[str], reps: int, rng: np.random.Generator) -> pd.DataFrame:
    """
    ``focus`` against the best of the other algorithms (its peers), per env and lag and over envs per lag.

    Each cell's score is the IQM of its normalized final scores (over seeds; over envs × seeds for the aggregate rows,
    on the envs every algorithm of the row has). The best peer is the one with the highest point IQM; the ratio
    ``IQM(focus) / IQM(best peer)`` has a stratified independent bootstrap CI and the verdict it supports.
    """
    rows = []
    for lag in ordered_lags(runs):
        at_lag = runs[runs["lag"] == lag]
        envs = sorted(at_lag["env"].unique())
        for env in [*envs, None]:
            names = [a for a in algorithms if (at_lag["algorithm"] == a).any()]
            if env is None:  # the aggregate over the envs every algorithm at this lag has
                cell_envs = sorted(set.intersection(*(set(at_lag[at_lag["algorithm"] == a]["env"]) for a in names)))
            else:
                names = [a for a in names if ((at_lag["algorithm"] == a) & (at_lag["env"] == env)).any()]
                cell_envs = [env]
            if focus not in names or len(names) < 2 or not cell_envs:  # no peer to compare with
                continue
            matrices = {name: score_matrix(at_lag[at_lag["algorithm"] == name], "final_norm", cell_envs) for name in names}
            row: dict[str, Any] = {"env": env or f"IQM over {len(cell_envs)} envs", "lag": lag}
            row["n"] = ", ".join(str(len(matrices[name])) for name in names)
            iqms = {name: stratified_bootstrap(metrics.aggregate_iqm, [matrices[name]], reps, rng) for name in names}
            for name in algorithms:
                row[name] = iqms.get(name, np.nan)
            best = max((name for name in names if name != focus), key=lambda name: iqms[name].value)
            row["best peer"] = best
            ratio = stratified_bootstrap(_iqm_ratio, [matrices[focus], matrices[best]], reps, rng)
            row[f"{focus} / best peer"] = ratio
            row["verdict"] = ratio.verdict()
            rows.append(row)
    return pd.DataFrame(rows)


def cell_table(runs: pd.DataFrame, algorithms: Sequence[str]) -> pd.DataFrame:
    """Raw scores and diagnostics per env, algorithm and lag (mean ± sd over seeds)."""
    rows = []
    for (env, algorithm, lag), cell in runs.groupby(["env", "algorithm", "lag"]):
        row: dict[str, Any] = {"env": env, "algorithm": algorithm, "lag": lag, "n": len(cell)}
        for score in SCORES:
            sd = cell[score].std() if len(cell) > 1 else np.nan
            row[f"{score} (mean ± sd)"] = (
                f"{cell[score].mean():.1f} ± {sd:.1f}" if len(cell) > 1 else f"{cell[score].mean():.1f}"
            )
        row["final (norm.)"] = f"{cell['final_norm'].mean():.3g}"
        row["falls"] = _falls_text(cell)
        row["dips"] = _dips_text(cell)
        for name in DIAGNOSTICS:
            row[name] = f"{cell[name].mean():.3g}" if cell[name].notna().any() else "–"
        row["steps/s"] = f"{cell['env_steps_per_s'].mean():.0f}"
        rows.append(row)
    table = pd.DataFrame(rows)
    order = {name: index for index, name in enumerate(algorithms)}
    table["_order"] = [
        (env, lag_sort_key(lag), order[algorithm]) for env, lag, algorithm in table[["env", "lag", "algorithm"]].to_numpy()
    ]
    return table.sort_values("_order").drop(columns="_order")


def _cell_text(value: Any) -> str:
    if isinstance(value, Interval):
        return value.format()
    return "–" if isinstance(value, float) and np.isnan(value) else str(value)


def markdown_table(table: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (Interval cells formatted with their CI)."""
    if table.empty:
        return "_(no data)_\n"
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    lines = [header, "|" + "---|" * len(table.columns)]
    for values in table.itertuples(index=False):
        cells = [_cell_text(value) for value in values]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def palette_colors(algorithms: Sequence[str]) -> dict[str, Any]:
    palette = plt.get_cmap("tab10")
    return {algorithm: palette(index % 10) for index, algorithm in enumerate(algorithms)}


def plot_score_vs_lag(
    runs: pd.DataFrame, aggregate: pd.DataFrame, algorithms: Sequence[str], path: Path, reps: int, rng: np.random.Generator
) -> None:
    """Mean score (95% CI of the mean) against the lag per env, and the aggregate normalized IQM; final and AUC rows."""
    envs, lags, colors = sorted(runs["env"].unique()), ordered_lags(runs), palette_colors(algorithms)
    fig, axes = plt.subplots(2, len(envs) + 1, figsize=(4 * (len(envs) + 1), 6.5), squeeze=False)
    offsets = np.linspace(-0.15, 0.15, len(algorithms)) if len(algorithms) > 1 else [0.0]
    for row, score in enumerate(SCORES):
        for column, env in enumerate([*envs, None]):
            ax = axes[row, column]
            for offset, algorithm in zip(offsets, algorithms, strict=True):
                points = []
                for position, lag in enumerate(lags):
                    if env is None:
                        match = aggregate[
                            (aggregate["algorithm"] == algorithm) & (aggregate["lag"] == lag) & (aggregate["score"] == score)
                        ]
                        interval = match["IQM"].iloc[0] if len(match) else None
                    else:
                        cell = runs[(runs["env"] == env) & (runs["algorithm"] == algorithm) & (runs["lag"] == lag)]
                        interval = stratified_bootstrap(np.mean, [cell[[score]].to_numpy()], reps, rng) if len(cell) else None
                    if interval is not None:
                        points.append((position + offset, interval))
                if not points:
                    continue
                x = [p for p, _ in points]
                y = np.array([i.value for _, i in points])
                low = np.array([i.value - i.low if i.low is not None else 0.0 for _, i in points])
                high = np.array([i.high - i.value if i.high is not None else 0.0 for _, i in points])
                ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, color=colors[algorithm], label=algorithm)
            if env is None:
                ax.set_xticks(range(len(lags)), lags)
                ax.set_xlabel("policy lag (updates)")
            else:
                ax.set_xticks(range(len(lags)), lag_tick_labels(runs[runs["env"] == env], lags))
                ax.set_xlabel("policy lag: updates (gradient steps)")
            ax.set_title(f"{env or 'aggregate IQM (normalized)'}: {score}")
            ax.grid(alpha=0.3)
        axes[row, 0].set_ylabel(f"return ({SCORES[score]})")
    axes[0, -1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_learning_curves(
    runs: pd.DataFrame, curves: dict[tuple[str, str, str, int], pd.DataFrame], algorithms: Sequence[str], path: Path
) -> None:
    """Eval return against env steps per env (rows) and lag (columns): mean over seeds, ± sd shaded."""
    envs, lags, colors = sorted(runs["env"].unique()), ordered_lags(runs), palette_colors(algorithms)
    fig, axes = plt.subplots(len(envs), len(lags), figsize=(3.8 * len(lags), 3 * len(envs)), squeeze=False)
    for (row, env), (column, lag) in ((r, c) for r in enumerate(envs) for c in enumerate(lags)):
        ax = axes[row, column]
        for algorithm in algorithms:
            cell = runs[(runs["env"] == env) & (runs["algorithm"] == algorithm) & (runs["lag"] == lag)]
            if cell.empty:
                continue
            run_curves = [curves[(env, algorithm, lag, seed)] for seed in cell["seed"]]
            grid = max((curve["timesteps"].to_numpy() for curve in run_curves), key=len)
            returns = np.stack([np.interp(grid, curve["timesteps"], curve["return"]) for curve in run_curves])
            mean = returns.mean(axis=0)
            ax.plot(grid, mean, color=colors[algorithm], label=f"{algorithm} (n={len(returns)})")
            if len(returns) > 1:
                sd = returns.std(axis=0)
                ax.fill_between(grid, mean - sd, mean + sd, color=colors[algorithm], alpha=0.2)
        ax.set_title(f"{env}, lag {lag}", fontsize="medium")
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a (env, lag) cell without runs stays an empty panel
            ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_aggregate_intervals(aggregate: pd.DataFrame, algorithms: Sequence[str], path: Path) -> None:
    """rliable-style interval plot: each metric's point estimate and 95% CI per algorithm and lag; final and AUC rows."""
    colors = palette_colors(algorithms)
    entries = aggregate[aggregate["score"] == "final"][["algorithm", "lag"]].to_numpy().tolist()
    fig, axes = plt.subplots(2, len(AGGREGATE_METRICS), figsize=(3.6 * len(AGGREGATE_METRICS), 1.0 + 0.35 * len(entries) * 2))
    for row, score in enumerate(SCORES):
        table = aggregate[aggregate["score"] == score]
        for column, metric in enumerate(AGGREGATE_METRICS):
            ax = axes[row, column]
            for position, (algorithm, lag) in enumerate(entries):
                interval = table[(table["algorithm"] == algorithm) & (table["lag"] == lag)][metric].iloc[0]
                if interval.low is not None:
                    ax.plot(
                        [interval.low, interval.high], [position, position], color=colors[algorithm], linewidth=6, alpha=0.5
                    )
                ax.plot([interval.value], [position], "|", color="black", markersize=12)
            ax.set_yticks(
                range(len(entries)), [f"{algorithm}, lag {lag}" for algorithm, lag in entries] if column == 0 else []
            )
            ax.invert_yaxis()
            ax.set_title(f"{metric} ({score})")
            ax.grid(axis="x", alpha=0.3)
    fig.supxlabel("normalized score (1 = reference's final score, 0 = random)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def setup_section(runs: pd.DataFrame, constants: pd.DataFrame) -> str:
    """Envs, steps, seeds, versions and exact commands of the runs, and the normalization constants."""
    lines = [
        "| env | env spec | steps per run | eval every (episodes) | algorithms | lags | runs | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env, env_runs in runs.groupby("env"):
        steps = ", ".join(f"{steps:,}" for steps in sorted(env_runs["n_timesteps"].unique()))
        evals = ", ".join(
            f"{f:,} ({e})" for f, e in sorted(set(zip(env_runs["eval_freq"], env_runs["n_eval_episodes"], strict=True)))
        )
        lags = ", ".join(sorted(env_runs["lag"].unique(), key=lag_sort_key))
        seeds = ", ".join(map(str, sorted(env_runs["seed"].unique())))
        lines.append(
            f"| {env} | {', '.join(sorted(env_runs['env_spec'].unique()))} | {steps} | {evals} | "
            f"{env_runs['algorithm'].nunique()} | {lags} | {len(env_runs)} | {seeds} |"
        )
    versions = {
        column.removeprefix("version "): ", ".join(sorted(map(str, runs[column].dropna().unique())))
        for column in runs.columns
        if column.startswith("version ") and column != "version platform"
    }
    commands = "\n".join(sorted(runs["command"].dropna().unique()))
    gits = ", ".join(sorted(map(str, runs["git"].dropna().unique()))) or "unknown"
    normalization = constants.reset_index()
    normalization["random"] = normalization["random"].map(lambda v: f"{v:.1f}")
    normalization["reference"] = normalization["reference"].map(lambda v: f"{v:.1f}")
    return "\n".join(
        [
            *lines,
            "",
            "Versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()) + f"; git {gits}.",
            "",
            "Benchmark command(s):",
            "",
            "```",
            commands,
            "```",
            "",
            "Normalization per env: `(score − random) / (reference − random)`, `random` = mean return of uniform random "
            "actions (10 episodes per run, averaged over the env's runs), `reference` = the mean final score of the "
            "source below. Final and AUC scores share the constants: 1 = the reference's final score, 0 = random.",
            "",
            markdown_table(normalization[["env", "random", "reference", "n_reference", "source"]]),
        ]
    )


def write_report(
    out_dir: Path,
    results_dirs: Sequence[Path],
    runs: pd.DataFrame,
    constants: pd.DataFrame,
    tables: dict[str, pd.DataFrame],
    reference: str,
    reps: int,
) -> None:
    """``results.md``: setup, scores, every table, links to the plots."""

    def aggregate_view(score: str) -> pd.DataFrame:
        table = tables["aggregate"]
        return table[table["score"] == score].drop(columns="score")

    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    sections = [
        f"# Benchmark results: {' + '.join(f'`{results_dir.name}`' for results_dir in results_dirs)}",
        "",
        f"{len(runs)} finished runs in {', '.join(f'`{results_dir}`' for results_dir in results_dirs)}; "
        f"generated {generated} by:",
        "",
        "```",
        shlex.join(["python", *sys.argv]),
        "```",
        "",
        "## Setup",
        "",
        setup_section(runs, constants),
        "## Scores",
        "",
        "Score of a run: **final** = mean return of the last evaluation (deterministic episodes); **AUC** = mean of the "
        "evaluations over training (area under the eval curve, divided by its length). Aggregates are over envs "
        f"(normalized scores) with {int(CI_LEVEL * 100)}% stratified-bootstrap CIs ({reps} resamples of the runs within "
        "each env); `[n/a]` = fewer than 2 runs. `n` = runs per env used (the lowest seeds, as many as the env with the "
        "fewest runs has); `runs` = all runs of the cell. Optimality gap: mean shortfall below 1 (the reference).",
        "",
        "### Aggregate, final score (normalized)",
        "",
        markdown_table(aggregate_view("final")),
        "### Aggregate, AUC (normalized)",
        "",
        markdown_table(aggregate_view("auc")),
        f"### Probability of improvement over {reference} at the same lag",
        "",
        "P(X > Y) for a random run of each on the same env (Mann-Whitney), averaged over envs; 0.5 = no difference.",
        "",
        markdown_table(tables["improvement"]),
        f"### Ratio to {reference} at the same lag, per env",
        "",
        "Ratio of mean normalized scores (= of mean `score − random`); 1 = same as the reference.",
        "",
        markdown_table(tables["versus_reference"]),
        "### Relative to the same algorithm at lag 0, per env",
        "",
        "Ratio of mean normalized scores at lag L to lag 0: how much of its lag-0 score an algorithm keeps.",
        "",
        markdown_table(tables["versus_lag0"]),
        f"### Robustness: aggregate IQM relative to {reference} and to lag 0 (final score)",
        "",
        "IQM over envs of the normalized final scores, as a ratio to the baseline's IQM at the same lag and to the same "
        "algorithm's IQM at lag 0, with CIs; and the envs at that lag where the per-env ratio to the baseline has its CI "
        "entirely below 1; `falls`: runs that reached half of the reference's score and ended below half of their best "
        "evaluation, of the algorithm's runs at that lag and of the baseline's on the same envs.",
        "",
        markdown_table(tables["robustness"]),
        f"### Dips: falls at every evaluation, against {reference} at the same lag",
        "",
        "A fall counted at every evaluation: `dips` = evaluations below half of the run's best so far, of its "
        "evaluations after it first reached half of the reference's score (summed over the cell's runs). The last "
        "evaluation dips exactly when the run falls. `dip rate − baseline's`: the difference of the mean rates per run "
        "(runs that never reached half of the reference's score left out) with its CI; more or fewer dips when the CI "
        "excludes 0.",
        "",
        markdown_table(tables["dips"]),
        "### Per cell: raw returns and diagnostics",
        "",
        "Diagnostics are means over each run's iterations, then over seeds: measured lag (in updates and in gradient "
        "steps), `TV(π_T, μ)` at train start, VACO's minibatch TV estimate and filtered fraction, approx. KL of each "
        "update, PPO's clip fraction; except max lag (the run's largest, in updates) and segments dropped (the run's "
        "total of actor segments dropped for `max_policy_lag`). TV depends on the algorithm, not only on the injected "
        "lag. `falls`: runs that reached half of the reference's score and ended below half of their best "
        "evaluation; `dips`: as in the table above.",
        "",
        markdown_table(tables["cells"]),
        "## Plots",
        "",
        "![score vs lag](score_vs_lag.png)",
        "",
        "![learning curves](learning_curves.png)",
        "",
        "![aggregate intervals](aggregate_intervals.png)",
        "",
    ]
    atomic_write_text(out_dir / "results.md", "\n".join(sections))


def summary_table(runs: pd.DataFrame, tables: dict[str, pd.DataFrame], reference: str) -> str:
    """
    The short answer, per env, lag and algorithm: mean final returns, the ratio to the reference at the same lag with
    its CI and what the CI says, and what each keeps of its own lag-0 score.
    """
    keeps: dict[tuple[str, str, str], Any] = {}
    for row in tables["versus_lag0"].to_dict("records"):
        keeps[(row["env"], row["algorithm"], row["lag"])] = row["final"]
    rows = []
    for row in tables["versus_reference"].to_dict("records"):
        env, algorithm, lag = row["env"], row["algorithm"], row["lag"]
        cell = runs[(runs["env"] == env) & (runs["lag"] == lag)]
        mean_final = cell.groupby("algorithm")["final"].mean()
        rows.append(
            {
                "env": env,
                "lag": lag,
                "seeds": row["n"],
                f"{algorithm} / {reference} (final)": f"{mean_final[algorithm]:.0f} / {mean_final[reference]:.0f}",
                "ratio [95 % CI]": row["final"],
                "verdict": row["verdict (final)"],
                f"{algorithm} keeps of its lag 0": keeps.get((env, algorithm, lag), "–"),
                f"{reference} keeps of its lag 0": keeps.get((env, reference, lag), "–"),
            }
        )
    header = (
        "Final evaluation returns (means over seeds), the ratio of mean normalized scores with its 95 % stratified-"
        "bootstrap CI, and the verdict it supports: better or worse when the CI excludes 1, else no significant "
        "difference. `keeps of its lag 0`: the same ratio against the algorithm's own lag-0 runs.\n\n"
    )
    return header + markdown_table(pd.DataFrame(rows))


def intervals_to_columns(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """A table for CSV: each column of :class:`Interval` cells becomes three (``name``, ``name low``, ``name high``)."""
    flat = table.copy()
    for column in columns:
        if column in flat:
            intervals = flat.pop(column)
            for suffix, part in (("", "value"), (" low", "low"), (" high", "high")):
                flat[column + suffix] = [getattr(i, part) if isinstance(i, Interval) else np.nan for i in intervals]
    return flat


def peers_report(peers: pd.DataFrame, focus: str, reps: int) -> str:
    """``peers.md``: the table of :func:`peer_table` with how to read it."""
    return (
        f"# {focus} against its peers\n\n"
        "Per env and lag: each algorithm's IQM of normalized final scores over seeds (1 = the reference's final score, "
        f"0 = random) with its 95 % stratified-bootstrap CI ({reps} resamples; `[n/a]` = one run); per lag, the IQM over "
        "the envs every algorithm has (`n`: runs per env, in the columns' order). The best peer is the one with the "
        f"highest IQM; `{focus} / best peer` is the ratio of the two IQMs with its CI and the verdict it supports: better "
        "or worse when the CI excludes 1, else no significant difference.\n\n" + markdown_table(peers)
    )


def analyze(
    results_dirs: Sequence[Path],
    out_dir: Path,
    reference: str,
    reference_lag: str,
    reps: int,
    seed: int,
    envs: Sequence[str] | None = None,
    lags: Sequence[str] | None = None,
    algorithm_filter: Sequence[str] | None = None,
    versus: str | None = None,
) -> pd.DataFrame:
    """
    Load, normalize, aggregate, plot and write the report; return the runs table.

    :param algorithm_filter: analyze only these algorithms (default: all)
    :param versus: also compare this algorithm with the best of the others per cell (``peers.md``, ``peers.csv``)
    """
    runs, curves = load_runs(results_dirs, envs, lags)
    if algorithm_filter is not None and not runs.empty:
        runs = runs[runs["algorithm"].isin(algorithm_filter)].reset_index(drop=True)
    if runs.empty:
        filters = (("envs", envs), ("lags", lags), ("algorithms", algorithm_filter))
        selection = "".join(f" for {name} {values}" for name, values in filters if values)
        raise SystemExit(f"No {RESULT_FILE} under {', '.join(map(str, results_dirs))}{selection}")
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    constants = normalize(runs, reference, reference_lag)
    floor, top = runs["env"].map(constants["random"]), runs["env"].map(constants["reference"])
    for score in (*SCORES, "best"):
        runs[f"{score}_norm"] = (runs[score] - floor) / (top - floor)
    runs["fell"] = fell(runs)
    keys = zip(runs["env"], runs["algorithm"], runs["lag"], runs["seed"], strict=True)
    runs[["evals_learned", "dips"]] = [
        dips((curves[key]["return"].to_numpy() - low) / (high - low)) for key, low, high in zip(keys, floor, top, strict=True)
    ]
    runs["dip_rate"] = runs["dips"] / runs["evals_learned"].where(runs["evals_learned"] > 0)
    algorithms = ordered_algorithms(runs, reference)
    versus_reference, versus_lag0 = ratio_tables(runs, algorithms, reference, reps, rng)
    tables = {
        "aggregate": aggregate_table(runs, algorithms, reps, rng),
        "improvement": improvement_table(runs, algorithms, reference, reps, rng),
        "versus_reference": versus_reference,
        "versus_lag0": versus_lag0,
        "cells": cell_table(runs, algorithms),
    }
    # Its own generator, so that adding this table left every other CI of a given seed unchanged
    robustness_rng = np.random.default_rng(seed + 1)
    tables["robustness"] = robustness_table(runs, algorithms, reference, versus_reference, reps, robustness_rng)
    tables["dips"] = dip_table(runs, algorithms, reference, reps, np.random.default_rng(seed + 3))
    write_report(out_dir, results_dirs, runs, constants, tables, reference, reps)
    atomic_write_text(out_dir / "summary.md", summary_table(runs, tables, reference))
    if versus is not None:
        if versus not in algorithms:
            raise SystemExit(f"--versus {versus}: no runs of it among {', '.join(algorithms)}")
        peers = peer_table(runs, versus, algorithms, reps, np.random.default_rng(seed + 2))
        atomic_write_text(out_dir / "peers.md", peers_report(peers, versus, reps))
        peers_csv = intervals_to_columns(peers, [*algorithms, f"{versus} / best peer"])
        atomic_write_text(out_dir / "peers.csv", peers_csv.to_csv(index=False))
    plot_score_vs_lag(runs, tables["aggregate"], algorithms, out_dir / "score_vs_lag.png", reps, rng)
    plot_learning_curves(runs, curves, algorithms, out_dir / "learning_curves.png")
    plot_aggregate_intervals(tables["aggregate"], algorithms, out_dir / "aggregate_intervals.png")
    atomic_write_text(out_dir / "runs.csv", runs.to_csv(index=False))
    aggregate = intervals_to_columns(tables["aggregate"], list(AGGREGATE_METRICS))
    atomic_write_text(out_dir / "aggregate.csv", aggregate.to_csv(index=False))
    robustness = intervals_to_columns(tables["robustness"], ["IQM / baseline", "IQM / own lag 0"])
    atomic_write_text(out_dir / "robustness.csv", robustness.to_csv(index=False))
    return runs
