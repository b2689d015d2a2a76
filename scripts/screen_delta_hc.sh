#!/usr/bin/env bash
# Variant study (issue 7), fourth screen: the TV budget δ on HalfCheetah-v5, where VACO (δ = 0.2) wins at lag 4 but
# trails PPO at lag 0, moving the learner ~10x further per update (median train/approx_kl 0.13 vs 0.014).
# PPO's clip ε bounds |π_θ/μ − 1| per sample and TV = ½·E|π_θ/μ − 1|, so PPO's trust region is about TV ≤ ε/2:
# 0.05 with HalfCheetah's tuned ε = 0.1, a quarter of δ = 0.2. Under lag the behavior-referenced filter with a small
# δ is over budget before the first step, so the "budget" reference (δ beyond the lag already spent, TV(π_T, μ) + δ)
# is screened too; without lag it is the behavior reference, so it runs at lag 4 only.
# Same protocol as the main grid (300k steps, eval every 20k, zoo settings): δ = 0.2 and LaggedPPO are the main
# grid's `vaco` and `lagged_ppo`. Seed by seed, so a partial screen covers every cell. Resumable: rerun to continue.
# Analysis: python scripts/analyze.py results/delta results/main --envs HalfCheetah-v5 --out results/delta/analysis
# The budget reference (`tv_reference=budget`, vaco_b05/vaco_b10) was removed from VACO afterwards (rejected here):
# rerun this screen at commit 563eaeb.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
RUN=(.venv/bin/python scripts/benchmark.py --envs HalfCheetah-v5 --n-timesteps 300000 --eval-freq 20000 --workers 2
  --out results/delta)
DELTAS=("vaco_d05=vaco:tv_reference=behavior,tv_threshold=0.05"
  "vaco_d10=vaco:tv_reference=behavior,tv_threshold=0.1")
BUDGETS=("vaco_b05=vaco:tv_reference=budget,tv_threshold=0.05" "vaco_b10=vaco:tv_reference=budget,tv_threshold=0.1")
for seed in 0 1 2; do
  "${RUN[@]}" --seeds "$seed" --lags 4 --variants "${DELTAS[@]}" "${BUDGETS[@]}"
  "${RUN[@]}" --seeds "$seed" --lags 0 --variants "${DELTAS[@]}"
done
