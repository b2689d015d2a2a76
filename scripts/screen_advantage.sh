#!/usr/bin/env bash
# Variant study (issue 7), tenth screen: the form of V-trace's policy advantage. VACO's default is IMPALA's
# r_t + γ·v_{t+1} − V(s_t), which without lag is not GAE's advantage (it weights the TD error k steps ahead by
# γ·(γλ)^(k−1) instead of (γλ)^k: with HalfCheetah-v5's λ = 0.92 a visibly noisier estimate), so even at lag 0 VACO
# and PPO differ in the advantages as well as in the surrogate. `advantage_estimator="vtrace_gae"` keeps the V-trace
# corrections in GAE's form, r_t + γ·((1 − λ)·V(s_{t+1}) + λ·v_{t+1}) − V(s_t): GAE itself without lag.
#   vaco_vtgae   the defaults with advantage_estimator=vtrace_gae, HalfCheetah-v5, lag 4 (the lead to keep)
# Its lag-0 cell is the `ablations` preset's `vaco_filter_only` at lag 0 (GAE advantages and the filter: the same
# update up to the rounding of ρ = π_T/μ ≈ 1, `test_vtrace_gae_advantages_are_gae_without_lag`), run by
# scripts/benchmark_axes.sh. Main grid protocol (300k steps, eval every 20k, zoo settings), seeds 0-2.
# Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/advantage results/ablations results/main --envs HalfCheetah-v5 --out results/advantage/analysis
# Result: no gain at lag 0 or 4 (docs/study.md, tenth screen); `vtrace_gae` was removed from VACO afterwards:
# rerun this screen at commit d86f7e1.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
WORKERS=${WORKERS:-1}
.venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers "$WORKERS" --out results/advantage \
  --envs HalfCheetah-v5 --lags 4 --seeds 0-2 --variants "vaco_vtgae=vaco:advantage_estimator=vtrace_gae"
