"""
The variant study's two summary plots (``docs/study.md``), drawn from the committed runs (:func:`study_plots`):

* ``score_vs_lag_variants.png``: final score against the lag per env for every VACO form measured at two lags or
  more, with LaggedPPO beside them;
* ``delta_sensitivity.png``: final score against the TV budget δ, per filter reference and lag, with LaggedPPO's
  band at the same lag.

Each point is the mean final evaluation over the cell's seeds with the stratified-bootstrap 95 % CI of the mean (the
same as :mod:`vaco_lab.analysis`); ``study_points.csv`` holds every plotted value with its n. Cells that were
not run are left out, not filled in.
"""

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from vaco_lab.analysis import CI_LEVEL, load_runs, palette_colors, stratified_bootstrap
from vaco_lab.common import lag_sort_key

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ENVS = ("HalfCheetah-v5", "Hopper-v5", "InvertedPendulum-v5")
LAG_RESULTS = (
    "main", "robust", "study/delta", "study/ip", "study/lagscale", "study/feedback", "study/ablations", "study/kl",
)
#: Variants on the score-vs-lag plot, in legend order: name in the results, label.
LAG_VARIANTS = {
    "lagged_ppo": "LaggedPPO (SB3's PPO)",
    "vaco": "VACO defaults (decoupled, δ = 0.05, ratio bound 0.2, limit τ = 0.1)",
    "vaco_rb20": "decoupled, δ = 0.05, ratio bound 0.2, no limit",
    "vaco_x05": "decoupled, δ = 0.05, no ratio bound",
    "vaco_d20": "behavior filter, δ = 0.2 (GAE critic)",
    "vaco_paper": "paper's rule (behavior, δ = 0.2, V-trace critic)",
    "vaco_ls": "no limit, lag-scaled δ (retired)",
    "vaco_tvl20": "limit τ = 0.2",
    "ppo_kl": "PPO + KL penalty (β = 1)",
    "vaco_kl": "V-trace + KL penalty (β = 1)",
}


@dataclass(frozen=True)
class DeltaSeries:
    """One line of the δ plot: the runs that measured each δ for one filter reference at one lag."""

    panel: str
    label: str
    lag: str
    variants: dict[float, str]  # δ → variant name in the results


#: Run sets of the δ plot, loaded apart: the 100k-step screen repeats the 300k grid's run names.
DELTA_RESULTS = (("main", "study/delta"), ("study/screen",))
DELTA_SERIES = (
    # Without lag the decoupled filter is the behavior filter: δ = 0.05 is `vaco_x05`'s lag-0 runs.
    DeltaSeries(
        "HalfCheetah-v5", "behavior = decoupled (no ratio bound)", "0", {0.05: "vaco_x05", 0.1: "vaco_d10", 0.2: "vaco_d20"}
    ),
    DeltaSeries("HalfCheetah-v5", "behavior filter", "4", {0.05: "vaco_d05", 0.1: "vaco_d10", 0.2: "vaco_d20"}),
    DeltaSeries("HalfCheetah-v5", "decoupled filter (no ratio bound)", "4", {0.05: "vaco_x05", 0.1: "vaco_x10"}),
    # Without lag the limit τ changes nothing: `vaco`'s lag-0 runs are `vaco_rb20`'s too.
    DeltaSeries("HalfCheetah-v5", "decoupled, ratio bound 0.2", "0", {0.05: "vaco"}),
    DeltaSeries("HalfCheetah-v5", "decoupled, ratio bound 0.2", "4", {0.05: "vaco_rb20"}),
    DeltaSeries("Hopper-v5", "behavior filter", "4", {0.2: "vaco_d20"}),
    DeltaSeries("Hopper-v5", "decoupled filter (no ratio bound)", "4", {0.05: "vaco_x05"}),
    DeltaSeries("Hopper-v5", "decoupled, ratio bound 0.2", "4", {0.05: "vaco_rb20"}),
    DeltaSeries(
        "Hopper-v5 (100k-step screen)",
        "behavior filter",
        "4",
        {0.025: "vt_gaecritic_d025", 0.05: "vt_gaecritic_d05", 0.1: "vt_gaecritic_d10", 0.2: "vt_gaecritic"},
    ),
)
#: Which env's runs (and which step budget) each δ panel draws from.
DELTA_PANELS = {
    "HalfCheetah-v5": ("HalfCheetah-v5", 300_000),
    "Hopper-v5": ("Hopper-v5", 300_000),
    "Hopper-v5 (100k-step screen)": ("Hopper-v5", 100_000),
}


def mean_interval(scores: np.ndarray, reps: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean with its bootstrap CI; a single run gives a zero-width bar."""
    interval = stratified_bootstrap(np.mean, [scores.reshape(-1, 1)], reps, rng)
    low = interval.low if interval.low is not None else interval.value
    high = interval.high if interval.high is not None else interval.value
    return interval.value, low, high


def point(cell: pd.DataFrame, reps: int, rng: np.random.Generator, **keys: object) -> dict[str, object]:
    value, low, high = mean_interval(cell["final"].to_numpy(), reps, rng)
    return {**keys, "n": len(cell), "seeds": " ".join(map(str, sorted(cell["seed"]))), "mean": value, "low": low, "high": high}


def lag_points(runs: pd.DataFrame, reps: int, rng: np.random.Generator) -> pd.DataFrame:
    """Per env, variant and fixed lag: the mean final score (random lag ranges are left to ``analyze.py``)."""
    runs = runs[runs["lag"].str.isdigit() & runs["algorithm"].isin(list(LAG_VARIANTS))]
    rows = [
        point(cell, reps, rng, env=env, variant=variant, lag=lag)
        for (env, variant, lag), cell in runs.groupby(["env", "algorithm", "lag"])
    ]
    points = pd.DataFrame(rows)
    measured_lags = points.groupby(["env", "variant"])["lag"].transform("nunique")
    return points[(measured_lags >= 2) | (points["variant"] == "lagged_ppo")]


def plot_score_vs_lag(points: pd.DataFrame, path: Path) -> None:
    lags = sorted(points["lag"].unique(), key=lag_sort_key)
    position = {lag: index for index, lag in enumerate(lags)}
    envs = [env for env in ENVS if env in set(points["env"])]
    colors = palette_colors(list(LAG_VARIANTS))
    fig, axes = plt.subplots(1, len(envs), figsize=(5.2 * len(envs), 4.6), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        for variant, label in LAG_VARIANTS.items():
            line = points[(points["env"] == env) & (points["variant"] == variant)]
            if line.empty:
                continue
            line = line.sort_values("lag", key=lambda lag: lag.map(position))
            x = line["lag"].map(position).to_numpy()
            is_ppo = variant == "lagged_ppo"
            mean, low, high = (line[column].to_numpy() for column in ("mean", "low", "high"))
            ax.errorbar(
                x,
                mean,
                yerr=[mean - low, high - mean],
                marker="o",
                capsize=3,
                color="black" if is_ppo else colors[variant],
                linewidth=2.2 if is_ppo or variant == "vaco" else 1.0,
                linestyle="--" if is_ppo else "-",
                label=label,
            )
        ax.set_xticks(range(len(lags)), lags)
        ax.set_xlabel("policy lag (updates)")
        ax.set_title(env)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel(f"final eval return (mean, {CI_LEVEL:.0%} CI)")
    # One legend for all panels: each variant once, in the order of first appearance.
    legend = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=3, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def delta_points(runs: pd.DataFrame, reps: int, rng: np.random.Generator) -> pd.DataFrame:
    """Every series' cells, then LaggedPPO once per panel and lag."""

    def cell_runs(panel: str, lag: str, variant: str) -> pd.DataFrame:
        env, steps = DELTA_PANELS[panel]
        match = (runs["env"] == env) & (runs["n_timesteps"] == steps) & (runs["lag"] == lag) & (runs["algorithm"] == variant)
        return runs[match]

    cells = [
        (
            {"panel": s.panel, "series": s.label, "lag": s.lag, "delta": delta, "variant": variant},
            cell_runs(s.panel, s.lag, variant),
        )
        for s in DELTA_SERIES
        for delta, variant in s.variants.items()
    ]
    cells += [
        (
            {"panel": panel, "series": "LaggedPPO", "lag": lag, "delta": np.nan, "variant": "lagged_ppo"},
            cell_runs(panel, lag, "lagged_ppo"),
        )
        for panel, lag in dict.fromkeys((s.panel, s.lag) for s in DELTA_SERIES)
    ]
    return pd.DataFrame([point(cell, reps, rng, **keys) for keys, cell in cells if len(cell)])


def plot_delta(points: pd.DataFrame, path: Path) -> None:
    panels = list(dict.fromkeys(points["panel"]))
    lag_styles, lag_markers = {"0": ":", "4": "-"}, {"0": "s", "4": "o"}
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.6), squeeze=False)
    series_colors = palette_colors(list(dict.fromkeys(points["series"])))
    for ax, panel in zip(axes[0], panels, strict=True):
        panel_points = points[points["panel"] == panel]
        for (series, lag), line in panel_points[panel_points["series"] != "LaggedPPO"].groupby(["series", "lag"], sort=False):
            line = line.sort_values("delta")
            mean, low, high = (line[column].to_numpy() for column in ("mean", "low", "high"))
            ax.errorbar(
                line["delta"].to_numpy(),
                mean,
                yerr=[mean - low, high - mean],
                marker=lag_markers.get(lag, "o"),
                capsize=3,
                color=series_colors[series],
                linestyle=lag_styles.get(lag, "-"),
                label=f"{series}, lag {lag}",
            )
        for _, ppo in panel_points[panel_points["series"] == "LaggedPPO"].iterrows():
            ax.axhspan(ppo["low"], ppo["high"], color="black", alpha=0.08)
            style = lag_styles.get(ppo["lag"], "-")
            ax.axhline(ppo["mean"], color="black", linestyle=style, label=f"LaggedPPO, lag {ppo['lag']}")
        deltas = sorted(panel_points["delta"].dropna().unique())
        ax.set_xscale("log")
        ax.set_xticks(deltas, [f"{delta:g}" for delta in deltas])
        ax.minorticks_off()
        ax.set_xlabel("TV budget δ")
        ax.set_title(panel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0, 0].set_ylabel(f"final eval return (mean, {CI_LEVEL:.0%} CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def study_plots(results: Path, out: Path, reps: int = 2000, seed: int = 0) -> pd.DataFrame:
    """
    Draw both plots from the run sets under ``results`` into ``out`` and write ``study_points.csv``.

    :return: every plotted point (column ``plot`` names its plot)
    """
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)

    lag_runs, _ = load_runs([results / name for name in LAG_RESULTS], envs=ENVS)
    lag_runs = lag_runs[lag_runs["n_timesteps"] == 300_000]
    by_lag = lag_points(lag_runs, reps, rng)
    plot_score_vs_lag(by_lag, out / "score_vs_lag_variants.png")

    delta_runs = pd.concat([load_runs([results / name for name in names])[0] for names in DELTA_RESULTS])
    by_delta = delta_points(delta_runs, reps, rng)
    plot_delta(by_delta, out / "delta_sensitivity.png")

    table = pd.concat([by_lag.assign(plot="score_vs_lag_variants"), by_delta.assign(plot="delta_sensitivity")])
    table.to_csv(out / "study_points.csv", index=False, float_format="%.6g")
    return table
