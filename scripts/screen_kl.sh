#!/usr/bin/env bash
# Variant study (issue 7), eleventh screen: the KL penalty on V-trace advantages. PPO-KL (GAE advantages and
# β·KL(μ‖π) on the ratio to the behavior policy, the `ablations` preset's `ppo_kl`) was level with VACO at lag 0 and
# ahead of it at lag 4 on HalfCheetah-v5 (docs/study.md, ablations at lags 0 and 4). Does it keep that lead with
# the realigned advantages, and does it carry to Hopper-v5, where VACO trails LaggedPPO?
#   vaco_kl   the defaults with policy_loss=kl (V-trace advantages, KL penalty instead of the TV filter)
# HalfCheetah-v5 lag 4, vaco_kl and ppo_kl at Hopper-v5 lag 4, then HalfCheetah-v5 lag 0. Main grid protocol (300k steps, eval
# every 20k, zoo settings), seeds 0-2, two workers. Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/kl results/ablations results/main --envs HalfCheetah-v5 Hopper-v5 --out results/kl/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
WORKERS=${WORKERS:-2}
bench() { .venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers "$WORKERS" --out results/kl --seeds 0-2 "$@"; }
bench --envs HalfCheetah-v5 --lags 4 --variants "vaco_kl=vaco:policy_loss=kl"
bench --envs Hopper-v5 --lags 4 --variants "vaco_kl=vaco:policy_loss=kl" ppo_kl
bench --envs HalfCheetah-v5 --lags 0 --variants "vaco_kl=vaco:policy_loss=kl"
