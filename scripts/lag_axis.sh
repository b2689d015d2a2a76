#!/usr/bin/env bash
# Lag axis (issues 4 and 7): VACO (defaults) and LaggedPPO at lags 1, 2 and 8, between the main grid's 0, 4 and 16,
# so that score vs lag is measured at 0, 1, 2, 4, 8, 16 updates (× 80 gradient steps per update with the zoo's
# Hopper-v5 settings, × 160 with HalfCheetah-v5's, × 320 with InvertedPendulum-v5's SB3 defaults); plus the
# eleventh screen's Hopper-v5 PPO-KL seed 2 and the ablations' lag-4 seeds 3-4. Main grid protocol (300k steps,
# eval every 20k, zoo settings); the lag-axis runs go into results/main beside the main grid's.
# Two chains of one worker each (two processes in all; their runs are disjoint), balanced by run length:
# HalfCheetah-v5 lags 1-2 on one; Hopper-v5 (shorter runs), HalfCheetah-v5 lag 8 and the PPO-KL seed on the other;
# then InvertedPendulum-v5 (shortest runs: lags 8 and 1 on one chain, 2 on the other); then each chain takes one of
# the ablations' seeds. Seed-major inside each command, so a stopped script leaves every lag with its first seeds.
# Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/main
#   python scripts/analyze.py results/ablations results/main --envs HalfCheetah-v5 --lags 0 4 --out results/ablations/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
bench() { .venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers 1 "$@"; }
main_cells() { bench --out results/main --variants vaco lagged_ppo --seeds 0-2 "$@"; }
ablations() { bench --out results/ablations --envs HalfCheetah-v5 --lags 4 --variants ppo_kl vaco_align_only vaco_filter_only spo "$@"; }
chain_a() {
  main_cells --envs HalfCheetah-v5 --lags 1 2
  main_cells --envs InvertedPendulum-v5 --lags 8 1
  ablations --seeds 3
}
chain_b() {
  bench --out results/kl --envs Hopper-v5 --lags 4 --seeds 2 --variants ppo_kl
  main_cells --envs Hopper-v5 --lags 1 2 8
  main_cells --envs HalfCheetah-v5 --lags 8
  main_cells --envs InvertedPendulum-v5 --lags 2
  ablations --seeds 4
}
chain_a > "${LOG_A:-/dev/stdout}" 2>&1 &
chain_b > "${LOG_B:-/dev/stdout}" 2>&1 &
wait
