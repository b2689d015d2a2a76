#!/usr/bin/env bash
# The lag benchmark's remaining axes (issue 4), each beside the main grid's cells of the same protocol (300k steps,
# eval every 20k, zoo settings), seeds 0-2:
#   ablations    the four ablations at lag 0 on HalfCheetah-v5 (their lag-4 cells ran before): is PPO-KL's lag-4
#                lead over VACO robustness to lag or a faster learner? Align only / filter only are not LaggedPPO /
#                VACO at lag 0: V-trace's advantage (IMPALA's form) is GAE's only for λ = 1 (0.92 here)
#   lag_range    per-env staleness drawn in 0..8 per rollout (a batch mixes policy versions), HalfCheetah-v5 and
#                InvertedPendulum-v5
#   sweep        ρ̄ of the policy-gradient weight and of V-trace (pg_rho_bar = vtrace_rho_bar = 0.5, 2; the default
#                is 1) at HalfCheetah-v5 lag 4 (without lag π_T/μ = 1, so ρ̄ ≥ 1 changes nothing there)
#   update_freq  forward lag at lag 0 on Hopper-v5: twice the epochs, half the minibatch (the preset's axis; base
#                is the main grid's lag-0 cell)
# Two chains of one worker each (two processes in all; their runs are disjoint), seed-major inside each command.
# Resumable: rerun to continue. Analysis (commands in docs/benchmarks.md):
#   python scripts/analyze.py results/ablations results/main --envs HalfCheetah-v5 --lags 0 4 --out results/ablations/analysis
#   python scripts/analyze.py results/lag_range results/main --envs HalfCheetah-v5 InvertedPendulum-v5 --out results/lag_range/analysis
#   python scripts/analyze.py results/sweep results/main --envs HalfCheetah-v5 --out results/sweep/analysis
#   python scripts/analyze.py results/update_freq results/main --envs Hopper-v5 --out results/update_freq/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
bench() { .venv/bin/python scripts/benchmark.py --seeds 0-2 --workers 1 "$@"; }
RHO=("vaco_rho05=vaco:pg_rho_bar=0.5,vtrace_rho_bar=0.5" "vaco_rho2=vaco:pg_rho_bar=2,vtrace_rho_bar=2")
UPDATES=("epochs2x:n_epochs=x2" "batch_half:batch_size=x0.5")
chain_a() {
  bench --preset ablations --lags 0 --variants ppo_kl
  bench --preset ablations --lags 0 --variants vaco_filter_only vaco_align_only
  bench --preset sweep --lags 4 --variants "${RHO[0]}"
  bench --preset update_freq --lags 0 --updates "${UPDATES[@]}" --variants vaco
}
chain_b() {
  bench --preset lag_range --envs HalfCheetah-v5 InvertedPendulum-v5
  bench --preset ablations --lags 0 --variants spo
  bench --preset sweep --lags 4 --variants "${RHO[1]}"
  bench --preset update_freq --lags 0 --updates "${UPDATES[@]}" --variants lagged_ppo
}
chain_a > "${LOG_A:-/dev/stdout}" 2>&1 &
chain_b > "${LOG_B:-/dev/stdout}" 2>&1 &
wait
