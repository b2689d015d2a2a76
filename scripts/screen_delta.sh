#!/usr/bin/env bash
# Variant study (issue 7), third screen: the TV budget δ of the candidate (V-trace advantages, GAE critic targets)
# at lag 4, where VACO moves the learner 5-10x further per update than PPO (train/approx_kl). Same protocol as
# screen_hopper.sh (Hopper-v5, zoo settings, 100k steps, seeds 0-2); δ = 0.2 is vt_gaecritic of screen_vtrace.sh.
# Resumable: rerun to continue. Analysis: python scripts/analyze.py results/screen
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
.venv/bin/python scripts/benchmark.py --envs Hopper-v5 --n-timesteps 100000 --eval-freq 10000 --workers 2 \
  --out results/screen --lags 4 --seeds 0-2 --variants \
  "vt_gaecritic_d025=vaco:value_target=gae,tv_reference=behavior,tv_threshold=0.025" \
  "vt_gaecritic_d05=vaco:value_target=gae,tv_reference=behavior,tv_threshold=0.05" \
  "vt_gaecritic_d10=vaco:value_target=gae,tv_reference=behavior,tv_threshold=0.1"
