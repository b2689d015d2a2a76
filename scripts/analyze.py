"""
Aggregate a benchmark grid written by ``scripts/benchmark.py``: rliable metrics (IQM, mean, median, optimality gap)
with stratified-bootstrap 95% confidence intervals, probability of improvement over a reference algorithm at each
lag, score ratios, learning curves and score-vs-lag plots, and a markdown report.

Works on a partly finished grid (every number states its n) and on a single seed (CIs shown as n/a)::

    python scripts/analyze.py results/demo
    python scripts/analyze.py results/main --out docs/results/main --reps 5000
    python scripts/analyze.py results/study/delta results/main --envs HalfCheetah-v5  # pool grids, one env
    python scripts/analyze.py results/study/kl results/main --lags 4                  # only some lag settings

Writes to ``<results dir>/analysis`` by default: ``results.md``, ``runs.csv``, ``aggregate.csv``,
``score_vs_lag.png``, ``learning_curves.png``, ``aggregate_intervals.png``. ``docs/benchmarks.md`` explains the
scores and their normalization.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's sb3_vaco, not an installed one

from sb3_vaco.bench.analysis import analyze


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "results_dirs", type=Path, nargs="+", help="folder(s) written by scripts/benchmark.py (searched recursively, pooled)"
    )
    parser.add_argument("--out", type=Path, help="output folder (default: <first results dir>/analysis)")
    parser.add_argument("--envs", nargs="+", help="analyze only these envs (default: all)")
    parser.add_argument("--lags", nargs="+", help="analyze only these lag settings, e.g. 0 4 0-8 (default: all)")
    parser.add_argument("--reference", default="lagged_ppo", help="algorithm the others are compared with and normalized by")
    parser.add_argument("--reference-lag", default="0", help="lag setting of the normalization reference")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples per CI")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    args = parser.parse_args(argv)
    out_dir = args.out or args.results_dirs[0] / "analysis"
    runs = analyze(args.results_dirs, out_dir, args.reference, args.reference_lag, args.reps, args.seed, args.envs, args.lags)
    print(f"Analyzed {len(runs)} runs: {out_dir / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
