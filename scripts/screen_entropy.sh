#!/usr/bin/env bash
# Variant study (issue 7), eighth screen: the exploration noise under lag. With the defaults (decoupled filter,
# δ = 0.05, ratio_bound = 0.2) InvertedPendulum-v5 still collapses at lag 16, after the learner's action std shrank
# faster than without lag (docs/study.md, seventh screen); SB3's PPO keeps its std high there. `vaco_ent01` adds an
# entropy bonus (ent_coef = 0.01; the YAML entry has 0) to the defaults. Main grid protocol (300k steps, eval every
# 20k, zoo settings); references: results/main. Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/ip results/main --envs InvertedPendulum-v5 --out results/ip/analysis
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
WORKERS=${WORKERS:-2}
bench() { .venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers "$WORKERS" "$@"; }
ENT01="vaco_ent01=vaco:ent_coef=0.01"
bench --envs InvertedPendulum-v5 --lags 16 --seeds 0-4 --variants "$ENT01" --out results/ip
bench --envs InvertedPendulum-v5 --lags 0 4 --seeds 0-1 --variants "$ENT01" --out results/ip
