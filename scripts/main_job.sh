#!/usr/bin/env bash
# The main job: a short lag experiment, VACO vs SB3's PPO (LaggedPPO) on Hopper-v5 at lags 0 and 4, 2 seeds,
# 50k steps per run, 2 worker processes (about 5 minutes on 2 idle cores). Prints a table, writes plots.
# Output: runs/main_job/ (results per run, analysis/results.md, analysis/*.png). Rerunning resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
out=${1:-runs/main_job}
.venv/bin/python scripts/benchmark.py --grid demo --out "$out"
.venv/bin/python scripts/analyze.py "$out"
echo
cat "$out/analysis/results.md"
