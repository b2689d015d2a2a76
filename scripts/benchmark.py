"""
Benchmark grid: {algorithm variant} × {env} × {lag setting} × {update setting} × {seed}, through RL Zoo.

The named grids and variants are data, in ``scripts/grids.yml``; run one by name, or give the axes on the command
line. A run whose ``result.json`` exists is skipped, so rerunning the same command resumes an interrupted grid.

Examples::

    python scripts/benchmark.py --list                         # the grids, their folders and progress
    python scripts/benchmark.py --grid demo
    python scripts/benchmark.py --grid main --dry-run          # list the runs (and which are done), run nothing
    python scripts/benchmark.py --grid robust_screen --workers 2
    python scripts/benchmark.py --grid main --envs Hopper-v5 --lags 4 --seeds 0-1   # part of a grid
    python scripts/benchmark.py --envs Hopper-v5 --variants vaco lagged_ppo "vaco:tv_threshold=0.05,tv_reference=behavior" \\
        --lags 0 4 0-8 --seeds 0-4 --n-timesteps 300000 --eval-freq 20000 --out results/my_grid

Output, per run: ``<out>/<env>/<algorithm>/lag<L>/seed<S>/result.json`` (eval curve, scores, timing,
hyperparameters, versions) and ``progress.csv.gz`` (one row per iteration: lag and TV statistics, losses).
``docs/benchmarks.md`` describes both; the runner is :mod:`vaco_lab.runner`.
"""

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from vaco_lab.common import REPO_ROOT, check_checkout, command_line, git_revision, parse_seeds
from vaco_lab.grids import BASE_UPDATE, Cell, Grid, GridFile, load_grid_file, parse_update, parse_variant, select
from vaco_lab.runner import ERROR_FILE, RunSpec, grid_runs, print_dry_run, run_grid

GRIDS_FILE = Path(__file__).resolve().parent / "grids.yml"
AD_HOC_OUT = REPO_ROOT / "results" / "custom"


def grid_from_args(args: argparse.Namespace, grids: GridFile) -> Grid:
    """The grid the command line describes: a named grid (part of it, with another protocol), or the axes given."""
    seeds = parse_seeds(args.seeds) if args.seeds else None
    out = Path(args.out).resolve() if args.out else None  # relative to the working directory
    if args.grid:
        return select(
            grids.grid(args.grid),
            envs=args.envs,
            variants=args.variants,
            lags=args.lags,
            updates=args.updates,
            seeds=seeds,
            n_timesteps=args.n_timesteps,
            eval_freq=args.eval_freq,
            n_eval_episodes=args.n_eval_episodes,
            out=out,
        )
    if not args.envs:
        raise SystemExit("Give --grid NAME (see --list) or --envs")
    cell = Cell(
        out=out or AD_HOC_OUT,
        envs=tuple(args.envs),
        variants=tuple(parse_variant(spec, grids.variants) for spec in args.variants or ("vaco", "lagged_ppo")),
        lags=tuple(args.lags or ("0",)),
        seeds=seeds or (0,),
        n_timesteps=args.n_timesteps,
        eval_freq=args.eval_freq or 10_000,
        updates=tuple(parse_update(spec) for spec in args.updates or (BASE_UPDATE,)),
        n_eval_episodes=args.n_eval_episodes or 10,
    )
    return Grid(None, "ad-hoc grid from the command line", (cell,))


def runs_from_args(args: argparse.Namespace, grids: GridFile) -> tuple[list[RunSpec], Grid]:
    """The runs of the command line's grid, in run order."""
    grid = grid_from_args(args, grids)
    context = {"grid": grid.name, "command": command_line(), "git": git_revision()}
    return grid_runs(grid, REPO_ROOT, context), grid


def list_grids(grids: GridFile) -> None:
    """Every grid of the file: name, runs done / all, output folders, description."""
    for name, grid in grids.grids.items():
        runs = grid_runs(grid, REPO_ROOT, {})
        done = sum(run.result_path.exists() for run in runs)
        folders = ", ".join(map(str, grid.out_dirs))
        print(f"{name:20s} {done:4d}/{len(runs):<4d} runs done  → {folders}\n{'':20s} {grid.description}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", help="a named grid of the grids file (see --list)")
    parser.add_argument("--preset", dest="grid", help=argparse.SUPPRESS)  # the former name of --grid
    parser.add_argument("--grids-file", type=Path, default=GRIDS_FILE, help="the grids file (default: %(default)s)")
    parser.add_argument("--list", action="store_true", help="list the grids with their folders and progress, run nothing")
    parser.add_argument(
        "--envs", nargs="+", help="env ids (keys of the shipped YAML files, else their `default`); with --grid: only these"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        help="[NAME=]BASE[:KEY=VALUE,...], BASE a variant of the grids file (default: vaco lagged_ppo); "
        "with --grid: only these names",
    )
    parser.add_argument("--lags", nargs="+", help="lag settings: K (e.g. 4) or K_min-K_max (e.g. 0-8) (default: 0)")
    parser.add_argument("--updates", nargs="+", help="LABEL[:KEY=VALUE,...], VALUE xF scales the YAML value (default: base)")
    parser.add_argument("--seeds", nargs="+", help="seeds and inclusive ranges, e.g. 0-4 (default: 0; replaces a grid's)")
    parser.add_argument("--n-timesteps", type=int, help="training steps per run (default: the grid's, else the YAML's)")
    parser.add_argument("--eval-freq", type=int, help="evaluate every N env steps (default: the grid's, else 10000)")
    parser.add_argument("--n-eval-episodes", type=int, help="deterministic eval episodes per evaluation (default: 10)")
    parser.add_argument("--out", help="output folder (default: the grid's, else results/custom)")
    parser.add_argument("--workers", type=int, default=2, help="parallel runs (capped at the number of CPU cores)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their status, run nothing")
    args = parser.parse_args(argv)
    for name in ("workers", "eval_freq", "n_timesteps", "n_eval_episodes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.grid and args.updates:
        args.updates = [parse_update(spec).label for spec in args.updates]  # with a grid: labels to keep
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_checkout()
        grids = load_grid_file(args.grids_file)
        if args.list:
            list_grids(grids)
            return 0
        runs, grid = runs_from_args(args, grids)
    except (ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"grid {grid.name or '(command line)'}: {grid.description}")
        print_dry_run(runs)
        return 0
    workers = min(args.workers, os.cpu_count() or 1)
    start = time.perf_counter()
    try:
        outcomes = run_grid(runs, workers)
    except KeyboardInterrupt:
        return 130
    failed = [outcome for outcome in outcomes if not outcome.ok]
    folders = ", ".join(dict.fromkeys(str(run.out_dir) for run in runs))
    print(f"Finished {len(outcomes) - len(failed)} run(s) in {time.perf_counter() - start:.0f} s; results in {folders}")
    for outcome in failed:
        print(f"FAILED {outcome.run_id}: {outcome.message} (see its {ERROR_FILE}; rerun to retry)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
