"""
The variant study's two summary plots (``docs/study.md``) from the committed runs: score against the lag per
VACO form (``score_vs_lag_variants.png``) and score against the TV budget δ (``delta_sensitivity.png``), with every
plotted value in ``study_points.csv``. The plots are :mod:`vaco_lab.study`'s::

    python scripts/study_plots.py               # → results/study/
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from vaco_lab.common import REPO_ROOT as ROOT
from vaco_lab.study import study_plots


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="folder holding the run sets")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "study")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    table = study_plots(args.results, args.out, args.reps, args.seed)
    print(f"wrote {args.out}/score_vs_lag_variants.png, delta_sensitivity.png, study_points.csv ({len(table)} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
