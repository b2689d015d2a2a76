#!/usr/bin/env bash
# Variant study (issue 7), sixth screen: the defaults (decoupled filter, δ = 0.05) collapsed on InvertedPendulum-v5 at
# lag 4 in the main grid (seeds 0-1: 1000 -> ~100-300 after ~100k steps, with train/approx_kl bursts of 10^3-10^5
# while the filter's estimate stayed at δ). Suspect: the truncated weight min(1, π_T/μ) hides the samples the learner
# has moved away from. Screened here at lag 4, seeds 0-1, 150k steps (the collapses came at 90-110k), SB3's PPO
# settings as in the main grid: the untruncated learner reference (`learner`, δ = 0.05) and the previous default
# (behavior reference, δ = 0.2 = `vaco_d20`). References: the main grid's `vaco`, `vaco_paper`, `lagged_ppo` runs.
# Resumable: rerun to continue. Analysis: python scripts/analyze.py results/screen_ip results/main --envs InvertedPendulum-v5
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
.venv/bin/python scripts/benchmark.py --envs InvertedPendulum-v5 --n-timesteps 150000 --eval-freq 10000 --workers 1 \
  --out results/screen_ip --lags 4 --seeds 0-1 --variants \
  "vaco_l05=vaco:tv_reference=learner,tv_threshold=0.05" \
  "vaco_d20=vaco:tv_reference=behavior,tv_threshold=0.2"
