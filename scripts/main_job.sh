#!/usr/bin/env bash
# The main job: VACO vs SB3's PPO (LaggedPPO) on InvertedPendulum-v5 with data 16 updates stale, and PPO without lag,
# 3 seeds, 120k steps per run, 2 worker processes (about 11.5 minutes on two idle cores). Prints the verdict table
# (ratio of VACO's to PPO's score with its 95 % bootstrap CI; what PPO keeps of its lag-0 score) and writes plots.
# Usage: bash scripts/main_job.sh [OUT] [benchmark.py options, e.g. --seeds 3-5]; default OUT runs/main_job.
# Rerunning resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
out=${1:-runs/main_job}
shift || true
start=$SECONDS
.venv/bin/python scripts/benchmark.py --grid demo --out "$out" --workers 2 "$@"
.venv/bin/python scripts/analyze.py "$out" --summary
echo "(main job: $((SECONDS - start)) s; full report: $out/analysis/results.md)"
