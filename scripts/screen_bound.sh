#!/usr/bin/env bash
# Variant study (issue 7), seventh screen: a per-sample bound on top of the TV budget, and InvertedPendulum-v5's
# decision. The defaults (decoupled filter, δ = 0.05) collapse on InvertedPendulum-v5 under lag and fall off the
# standing plateau on Hopper-v5; the budget bounds only the minibatch's average |q − 1|. `vaco_rb20` adds
# `ratio_bound=0.2` (drop a pushing-away sample once |π_θ/π_T − 1| > 0.2: PPO's clip around the learner, Hilton et
# al. 2022, on top of the budget); `vaco_d20` is the previous default (behavior filter, δ = 0.2); `vaco_rbess` adds
# `tv_ess_scaling` to `vaco_rb20` (budget × the stale batch's effective sample size fraction). Main grid
# protocol (300k steps, eval every 20k, zoo settings); references: results/main (vaco, vaco_paper, lagged_ppo).
# `vaco_rb20` became the default: its runs moved to results/main as `vaco` (docs/study.md "Names"); a rerun would
# run them again under the old name, now with ratio_bound on by default in the YAML (the same settings).
# Resumable: rerun to continue. Analysis:
#   python scripts/analyze.py results/ip results/main --envs InvertedPendulum-v5 --out results/ip/analysis
#   python scripts/analyze.py results/main   (the HalfCheetah-v5 / Hopper-v5 runs, now `vaco` there)
# `tv_ess_scaling` (vaco_rbess) was removed from VACO afterwards (rejected here): rerun this screen at commit ad7b363.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
WORKERS=${WORKERS:-2}
bench() { .venv/bin/python scripts/benchmark.py --n-timesteps 300000 --eval-freq 20000 --workers "$WORKERS" "$@"; }
D20="vaco_d20=vaco:tv_reference=behavior,tv_threshold=0.2"
RB20="vaco_rb20=vaco:ratio_bound=0.2"
RBESS="vaco_rbess=vaco:ratio_bound=0.2,tv_ess_scaling=True"
bench --envs InvertedPendulum-v5 --lags 4 16 --seeds 0-4 --variants "$D20" "$RB20" --out results/ip
bench --envs InvertedPendulum-v5 --lags 0 --seeds 0-1 --variants "$D20" "$RB20" --out results/ip
bench --envs HalfCheetah-v5 --lags 4 16 --seeds 0-2 --variants "$RB20" --out results/bound
bench --envs Hopper-v5 --lags 0 4 --seeds 0-2 --variants "$RB20" --out results/bound
bench --envs InvertedPendulum-v5 --lags 16 4 --seeds 0-2 --variants "$RBESS" --out results/ip
# Confirmation of vaco_rb20 on HalfCheetah-v5 (vaco_rbess did not help on InvertedPendulum-v5, so its HalfCheetah
# cell was not run)
bench --envs HalfCheetah-v5 --lags 0 4 16 --seeds 0-4 --variants "$RB20" --out results/bound
