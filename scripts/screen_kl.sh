#!/usr/bin/env bash
# Variant study (issue 7), eleventh screen: the KL penalty on V-trace advantages. PPO-KL (GAE advantages and
# β·KL(μ‖π) on the ratio to the behavior policy, the `ablations` preset's `ppo_kl`) was level with VACO at lag 0 and
# ahead of it at lag 4 on HalfCheetah-v5 (docs/study.md, ablations at lags 0 and 4). Does it keep that lead with
# the realigned advantages, does it carry to Hopper-v5, where VACO trails LaggedPPO, and does a penalty toward the
# data hold InvertedPendulum-v5 at lag 16, where VACO's runs collapse far from it?
#   vaco_kl   the defaults with policy_loss=kl (V-trace advantages, KL penalty β = 1 instead of the TV filter)
#   ppo_kl    GAE advantages with the same penalty (the ablations' baseline)
# Main grid protocol (300k steps, eval every 20k, zoo settings), seeds 0-2. Two chains of one worker each (two
# processes in all), lag-4 cells first. Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/kl results/ablations results/main --envs HalfCheetah-v5 Hopper-v5 --lags 0 4 16 --out results/kl/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
bench() { .venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers 1 --out results/kl --seeds 0-2 "$@"; }
VACO_KL="vaco_kl=vaco:policy_loss=kl"
chain_a() {
  bench --envs HalfCheetah-v5 --lags 4 --variants "$VACO_KL"
  bench --envs HalfCheetah-v5 --lags 0 --variants "$VACO_KL"
}
chain_b() {
  bench --envs Hopper-v5 --lags 4 --variants "$VACO_KL" ppo_kl
  bench --envs InvertedPendulum-v5 --lags 16 --variants "$VACO_KL" ppo_kl
}
chain_a > "${LOG_A:-/dev/stdout}" 2>&1 &
chain_b > "${LOG_B:-/dev/stdout}" 2>&1 &
wait
