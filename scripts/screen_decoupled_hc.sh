#!/usr/bin/env bash
# Variant study (issue 7), fifth screen: on HalfCheetah-v5 δ = 0.05 closes the lag-0 gap to PPO (fourth screen,
# scripts/screen_delta_hc.sh) but with the behavior reference it is over budget under lag and falls behind PPO at
# lag 4, while the budget reference (TV(π_T, μ) + δ) lets the learner drift without bound (train/tv_behavior
# 0.55, median train/approx_kl ≈ 6 per update). The decoupled reference bounds the learner's own move per update
# (q = π_θ/π_T) and corrects for the lag with the truncated weight min(1, π_T/μ) (decoupled PPO, Hilton et al.
# 2022); without lag it is the behavior reference, so its lag-0 cells are vaco_d05's. Lag 4, seeds 0-2, main grid
# protocol (300k steps, eval every 20k, zoo settings). Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/delta results/main --envs HalfCheetah-v5 --out results/delta/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
.venv/bin/python scripts/benchmark.py --envs HalfCheetah-v5 --n-timesteps 300000 --eval-freq 20000 --workers 2 \
  --out results/delta --lags 4 --seeds 0-2 --variants \
  "vaco_x05=vaco:tv_reference=decoupled,tv_threshold=0.05" \
  "vaco_x10=vaco:tv_reference=decoupled,tv_threshold=0.1"
