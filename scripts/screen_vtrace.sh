#!/usr/bin/env bash
# Variant study (issue 7), second screen: which part of V-trace's realignment hurts under heavy lag?
# Same protocol as screen_hopper.sh (Hopper-v5, zoo settings, 100k steps, seeds 0-2) at lags 4 and 16, where the
# first screen's V-trace forms fell behind. LaggedPPO and the paper's rule for these cells are in results/screen.
# Resumable: rerun to continue. Analysis: python scripts/analyze.py results/screen
# These screens ran under the paper's defaults (V-trace critic targets, behavior-referenced filter, δ = 0.2): the
# variants pin what they ran with, so a rerun reproduces them (vaco_paper = the paper's rule).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
VARIANTS=(
  "vt_gaecritic=vaco:value_target=gae,tv_reference=behavior,tv_threshold=0.2"
  "gae_vtcritic=vaco:advantage_estimator=gae,value_target=vtrace,tv_reference=behavior,tv_threshold=0.2"
  "vt_epoch=vaco:value_target=vtrace,realign_every_epoch=true,tv_reference=behavior,tv_threshold=0.2"
  "vt_rho2=vaco:value_target=vtrace,vtrace_rho_bar=2,vtrace_c_bar=2,tv_reference=behavior,tv_threshold=0.2")
.venv/bin/python scripts/benchmark.py --envs Hopper-v5 --n-timesteps 100000 --eval-freq 10000 --workers 2 \
  --out results/screen --variants "${VARIANTS[@]}" --lags 4 16 --seeds 0-2
