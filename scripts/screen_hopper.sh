#!/usr/bin/env bash
# Screening grid of the variant study (issue 7): VACO filter variants vs LaggedPPO on Hopper-v5, 100k steps per run.
# Resumable: rerun to continue (finished runs are skipped). Results: results/screen/, analysis: scripts/analyze.py.
# Stages: the new variants first, then seeds 0-1 at lags 0 and 4, then seeds 0-2 at lags 0, 4 and 16.
# These screens ran under the paper's defaults (V-trace critic targets, behavior-referenced filter, δ = 0.2): the
# variants pin what they ran with, so a rerun reproduces them (vaco_paper = the paper's rule).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
V_OLD=(lagged_ppo vaco_paper
  "dec05=vaco:value_target=vtrace,tv_reference=decoupled,tv_threshold=0.05"
  "dec10s=vaco:value_target=vtrace,tv_reference=decoupled,tv_threshold=0.1,tv_lag_scaling=true"
  "dec20s=vaco:value_target=vtrace,tv_reference=decoupled,tv_threshold=0.2,tv_lag_scaling=true")
V_NEW=("vaco_filter_only=vaco:advantage_estimator=gae,tv_reference=behavior,tv_threshold=0.2"
  "fo_dec10s=vaco:advantage_estimator=gae,tv_reference=decoupled,tv_threshold=0.1,tv_lag_scaling=true"
  "fo_dec20s=vaco:advantage_estimator=gae,tv_reference=decoupled,tv_threshold=0.2,tv_lag_scaling=true")
COMMON=(--envs Hopper-v5 --n-timesteps 100000 --eval-freq 10000 --workers 2 --out results/screen)
.venv/bin/python scripts/benchmark.py "${COMMON[@]}" --variants "${V_NEW[@]}" --lags 0 4 --seeds 0
.venv/bin/python scripts/benchmark.py "${COMMON[@]}" --variants "${V_OLD[@]}" "${V_NEW[@]}" --lags 0 4 --seeds 0-1
.venv/bin/python scripts/benchmark.py "${COMMON[@]}" --variants "${V_OLD[@]}" "${V_NEW[@]}" --lags 0 4 16 --seeds 0-2
