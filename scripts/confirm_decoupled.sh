#!/usr/bin/env bash
# Variant study (issue 7), confirmation of the fifth screen's lead: the decoupled filter with δ = 0.05 (vaco_x05;
# without lag it is vaco_d05, the behavior filter with δ = 0.05, so lag-0 cells run under that name).
# HalfCheetah-v5 seeds 3-4 (seeds 0-2 are the screens'), then Hopper-v5 seeds 0-4, lags 0 and 4, main grid protocol
# (300k steps, eval every 20k, zoo settings); references: the main grid's lagged_ppo cells.
# Done: the decoupled δ = 0.05 form became the default, and these runs (vaco_x05 at lag 4, vaco_d05 at lag 0) were
# moved to results/main as `vaco` (docs/study.md "Names"); a rerun would run them again under the old names.
# Analysis:
#   python scripts/analyze.py results/delta results/main --envs HalfCheetah-v5 Hopper-v5 --out results/delta/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
RUN=(.venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers 2 --out results/delta)
DECOUPLED="vaco_x05=vaco:tv_reference=decoupled,tv_threshold=0.05"
BEHAVIOR="vaco_d05=vaco:tv_reference=behavior,tv_threshold=0.05"
"${RUN[@]}" --envs HalfCheetah-v5 --seeds 3-4 --lags 4 --variants "$DECOUPLED"
"${RUN[@]}" --envs HalfCheetah-v5 --seeds 3-4 --lags 0 --variants "$BEHAVIOR"
"${RUN[@]}" --envs Hopper-v5 --seeds 0-4 --lags 4 --variants "$DECOUPLED"
"${RUN[@]}" --envs Hopper-v5 --seeds 0-4 --lags 0 --variants "$BEHAVIOR"
