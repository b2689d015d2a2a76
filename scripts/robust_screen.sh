#!/usr/bin/env bash
# Issue 20's screen: candidates for a default that is safe at every lag, on the cells where the defaults fail or lead
# (InvertedPendulum-v5 and Hopper-v5 at lag 16, HalfCheetah-v5 at lag 4), seeds 0-2, main grid protocol (300k steps,
# eval every 20k, zoo settings). Every candidate equals the defaults without lag, so lag-0 cells need no runs; the
# defaults' and LaggedPPO's runs are results/main's. Candidates:
#   vaco_learner   untruncated weights π_T/μ in the filter (tv_reference=learner): no truncation bias on the std
#   vaco_rho4      weights min(4, π_T/μ) (pg_rho_bar=4): most of that bias removed, the variance still capped
#   vaco_anchor20  a second budget on the distance to the data (data_tv_limit=0.2)
# Two chains, one worker each; seed-major, so a stopped script leaves every cell with its first seeds. Resumable.
# Analysis: python scripts/analyze.py results/robust results/main --out results/robust/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
VARIANTS=(
  "vaco_learner=vaco:tv_reference=learner"
  "vaco_rho4=vaco:pg_rho_bar=4"
  "vaco_anchor20=vaco:data_tv_limit=0.2"
)
bench() { .venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers 1 --out results/robust "$@"; }
chain_a() { for seed in 0 1 2; do bench --envs InvertedPendulum-v5 Hopper-v5 --lags 16 --seeds "$seed" --variants "${VARIANTS[@]}"; done; }
chain_b() { for seed in 0 1 2; do bench --envs HalfCheetah-v5 --lags 4 --seeds "$seed" --variants "${VARIANTS[@]}"; done; }
chain_a > "${LOG_A:-/dev/stdout}" 2>&1 &
chain_b > "${LOG_B:-/dev/stdout}" 2>&1 &
wait
