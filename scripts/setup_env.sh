#!/usr/bin/env bash
# Create .venv (once) and install sb3_vaco with everything the main job and the tests use.
# Re-running is cheap: it reinstalls only when setup.cfg changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.sb3_vaco_installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
  # torch first and pinned: the CPU build this machine has on disk (an unpinned torch pulls a multi-GB CUDA build).
  .venv/bin/pip install --quiet torch==2.13.0
  .venv/bin/pip install --quiet -e '.[extra,mujoco,tests,zoo,bench,ray,llm]'
  touch "$stamp"
fi
