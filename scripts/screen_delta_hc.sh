#!/usr/bin/env bash
# Variant study (issue 7), fourth screen: the TV budget δ on HalfCheetah-v5, where VACO (δ = 0.2) wins at lag 4 but
# trails PPO at lag 0. PPO's clip ε bounds |π_θ/μ − 1| per sample and TV = ½·E|π_θ/μ − 1|, so PPO's trust region is
# about TV ≤ ε/2: 0.05 with HalfCheetah's tuned ε = 0.1, a quarter of δ = 0.2. Same protocol as the main grid
# (300k steps, eval every 20k, zoo settings), so δ = 0.2 and LaggedPPO are the main grid's `vaco` and `lagged_ppo`.
# Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/delta results/main --envs HalfCheetah-v5 --out results/delta/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
.venv/bin/python scripts/benchmark.py --envs HalfCheetah-v5 --n-timesteps 300000 --eval-freq 20000 --workers 2 \
  --out results/delta --lags 4 0 --seeds 0-2 --variants \
  "vaco_d05=vaco:tv_threshold=0.05" \
  "vaco_d10=vaco:tv_threshold=0.1"
