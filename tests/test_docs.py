"""
The code in README.md and docs/ runs: every block marked ``<!-- runnable -->`` is run with tiny budgets (training
lengths, evaluation episodes and Optuna trials shrunk), in a scratch folder.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARK = "<!-- runnable -->"
BLOCK = re.compile(re.escape(MARK) + r"\s*\n```(?P<language>python|bash)\n(?P<code>.*?)\n```", re.DOTALL)
# What a tiny run changes in a block: training steps, evaluation episodes, trials
TINY_BUDGETS = [
    (re.compile(r"\.learn\(\s*[\d_]+"), ".learn(512"),
    (re.compile(r"n_eval_episodes=\d+"), "n_eval_episodes=1"),
    (re.compile(r"(?<=\s)-n \d+"), "-n 1024"),
    (re.compile(r"--n-trials \d+"), "--n-trials 2"),
    (re.compile(r"--eval-freq \d+"), "--eval-freq 512"),
]


def runnable_blocks() -> list[tuple[str, str, str]]:
    blocks = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for index, match in enumerate(BLOCK.finditer(path.read_text())):
            blocks.append((f"{path.relative_to(REPO)}#{index}", match["language"], match["code"]))
    return blocks


def tiny(code: str) -> str:
    for pattern, replacement in TINY_BUDGETS:
        code = pattern.sub(replacement, code)
    return code


def test_blocks_are_found_and_shrunk():
    names = [name for name, _, _ in runnable_blocks()]
    assert {"README.md#0", "README.md#1", "docs/vaco.md#0", "docs/vaco.md#1", "docs/peers.md#0"} <= set(names)
    assert tiny("model.learn(100_000)\npython -m x -n 300000 --eval-freq 10000") == (
        "model.learn(512)\npython -m x -n 1024 --eval-freq 512"
    )


@pytest.mark.parametrize("name, language, code", runnable_blocks(), ids=[name for name, _, _ in runnable_blocks()])
def test_runnable_block_runs(name, language, code, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    if language == "python":
        commands = [[sys.executable, "-c", tiny(code)]]
    else:
        lines = [line.split("#")[0].strip() for line in tiny(code).splitlines()]
        commands = [shlex.split(line) for line in lines if line and not line.startswith("pip ")]
        commands = [[sys.executable, *command[1:]] if command[0] == "python" else command for command in commands]
    for command in commands:
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert result.returncode == 0, f"{name}: {shlex.join(command)}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
