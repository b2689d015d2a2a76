#!/usr/bin/env bash
# Variant study (issue 7), fifth stage: the lead of the fourth screen (scripts/screen_delta_hc.sh), VACO with the
# budget reference and δ = 0.05 (`vaco_b05`: TV(π_T, μ) + 0.05; without lag it is `vaco_d05`, the behavior reference
# with δ = 0.05, so the lag-0 cells run as vaco_d05). Seeds 3-4 on HalfCheetah-v5, then Hopper-v5 seeds 0-2, main
# grid protocol (300k steps, eval every 20k, zoo settings). Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/delta results/main --out results/delta/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
RUN=(.venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers 2 --out results/delta)
BUDGET="vaco_b05=vaco:tv_reference=budget,tv_threshold=0.05"
DELTA="vaco_d05=vaco:tv_threshold=0.05"
for env in HalfCheetah-v5 Hopper-v5; do
  seeds=$([ "$env" = HalfCheetah-v5 ] && echo 3-4 || echo 0-2)
  "${RUN[@]}" --envs "$env" --seeds $seeds --lags 4 --variants "$BUDGET"
  "${RUN[@]}" --envs "$env" --seeds $seeds --lags 0 --variants "$DELTA"
done
