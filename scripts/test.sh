#!/usr/bin/env bash
# The test command: set up .venv if needed, then lint, type-check and run the test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m slow` for the learning checks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
.venv/bin/ruff check .
.venv/bin/mypy sb3_vaco scripts
.venv/bin/pytest "$@"
