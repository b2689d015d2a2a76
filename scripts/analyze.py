"""
Aggregate a benchmark grid written by ``scripts/benchmark.py``: rliable metrics (IQM, mean, median, optimality gap)
with stratified-bootstrap 95% confidence intervals, probability of improvement over a reference algorithm at each
lag, score ratios, learning curves and score-vs-lag plots, and a markdown report.

Works on a partly finished grid (every number states its n) and on a single seed (CIs shown as n/a)::

    python scripts/analyze.py results/demo
    python scripts/analyze.py results/main --out docs/results/main --reps 5000
    python scripts/analyze.py results/study/delta results/main --envs HalfCheetah-v5  # pool grids, one env
    python scripts/analyze.py results/study/kl results/main --lags 4                  # only some lag settings
    python scripts/analyze.py results/peers results/main results/heldout --algorithms vaco lagged_ppo decoupled_ppo \
        impala appo ppo_kl lagged_trpo --versus vaco  # VACO against the best of the others per cell: peers.md

Writes to ``<results dir>/analysis`` by default: ``results.md``, ``runs.csv``, ``aggregate.csv``,
``score_vs_lag.png``, ``learning_curves.png``, ``aggregate_intervals.png`` (and with ``--versus``: ``peers.md``,
``peers.csv``). ``docs/benchmarks.md`` explains the scores and their normalization.

``--wallclock`` adds the wall-clock analysis of runs whose evaluations are timed (``vaco_lab.wallclock``; runs
recorded before the runner timed them are left out, with a message): ``wallclock.md`` (median training time to a
threshold return, a fraction of the reference's final return, per env, latency setting and method),
``wallclock.csv`` and ``wallclock_curves.png`` (return vs wall-clock and vs env steps); ``docs/actors.md``::

    python scripts/analyze.py results/actors/wallclock --wallclock
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from vaco_lab.analysis import analyze
from vaco_lab.wallclock import DEFAULT_FRACTIONS, analyze_wallclock


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "results_dirs", type=Path, nargs="+", help="folder(s) written by scripts/benchmark.py (searched recursively, pooled)"
    )
    parser.add_argument("--out", type=Path, help="output folder (default: <first results dir>/analysis)")
    parser.add_argument("--envs", nargs="+", help="analyze only these envs (default: all)")
    parser.add_argument("--lags", nargs="+", help="analyze only these lag settings, e.g. 0 4 0-8 (default: all)")
    parser.add_argument("--algorithms", nargs="+", help="analyze only these algorithms (default: all)")
    parser.add_argument(
        "--versus", help="also compare this algorithm with the best of the others per env and lag (peers.md, peers.csv)"
    )
    parser.add_argument("--reference", default="lagged_ppo", help="algorithm the others are compared with and normalized by")
    parser.add_argument("--reference-lag", default="0", help="lag setting of the normalization reference")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples per CI")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    parser.add_argument("--summary", action="store_true", help="print summary.md, the verdict table, when done")
    parser.add_argument(
        "--wallclock", action="store_true", help="also the wall-clock analysis (wallclock.md, .csv, _curves.png) of timed runs"
    )
    parser.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=list(DEFAULT_FRACTIONS),
        help="--wallclock: threshold returns as fractions of the way from random to the reference's final return",
    )
    args = parser.parse_args(argv)
    out_dir = args.out or args.results_dirs[0] / "analysis"
    runs = analyze(
        args.results_dirs,
        out_dir,
        args.reference,
        args.reference_lag,
        args.reps,
        args.seed,
        args.envs,
        args.lags,
        args.algorithms,
        args.versus,
    )
    print(f"Analyzed {len(runs)} runs: {out_dir / 'results.md'}")
    if args.summary:
        print((out_dir / "summary.md").read_text())
    if args.wallclock:
        reach = analyze_wallclock(
            args.results_dirs, out_dir, args.reference, args.reference_lag, args.thresholds, args.envs, args.lags
        )
        if reach is not None:
            timed = reach.groupby(["env", "algorithm", "lag", "seed"]).ngroups
            print(f"Wall-clock analysis of {timed} runs: {out_dir / 'wallclock.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
