#!/usr/bin/env bash
# Variant study (issue 7), eighth screen: the collapses at lag 16. With the defaults (decoupled filter, δ = 0.05,
# ratio_bound = 0.2) two of five InvertedPendulum-v5 runs collapse at lag 16 after the learner's action std shrank
# faster than without lag (docs/study.md); SB3's PPO keeps its std there. Two remedies on InvertedPendulum-v5, lag 16,
# five seeds: `vaco_ent01` adds an entropy bonus (ent_coef = 0.01; the YAML entry has 0), `vaco_ls` divides the
# budget by 1 + the measured lag (`tv_lag_scaling`: the learner then stays about δ from the behavior data instead of
# moving δ per update away from it). The lag-scaled budget held every InvertedPendulum-v5 run, so it and its
# square-root form (`vaco_ls05`, budget δ/√(1 + k̄)) then ran on HalfCheetah-v5 and Hopper-v5 (results/lagscale).
# Main grid protocol (300k steps, eval every 20k, zoo settings); references: results/main. Resumable: rerun to
# continue. Analysis:
#   python scripts/analyze.py results/ip results/main --envs InvertedPendulum-v5 --out results/ip/analysis
#   python scripts/analyze.py results/lagscale results/main --envs HalfCheetah-v5 Hopper-v5 --out results/lagscale/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
WORKERS=${WORKERS:-2}
bench() { .venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers "$WORKERS" "$@"; }
bench --envs InvertedPendulum-v5 --lags 16 --seeds 0-4 --variants "vaco_ent01=vaco:ent_coef=0.01" --out results/ip
bench --envs InvertedPendulum-v5 --lags 16 --seeds 0-4 --variants "vaco_ls=vaco:tv_lag_scaling=True" --out results/ip
LS="vaco_ls=vaco:tv_lag_scaling=1.0"
LS05="vaco_ls05=vaco:tv_lag_scaling=0.5"
bench --envs HalfCheetah-v5 --lags 16 --seeds 0-2 --variants "$LS" "$LS05" --out results/lagscale
bench --envs Hopper-v5 --lags 16 --seeds 0-4 --variants "$LS" "$LS05" --out results/lagscale
bench --envs HalfCheetah-v5 --lags 4 --seeds 0-2 --variants "$LS" "$LS05" --out results/lagscale
bench --envs InvertedPendulum-v5 --lags 16 --seeds 0-4 --variants "$LS05" --out results/ip
