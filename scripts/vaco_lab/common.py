"""
Helpers shared by the benchmark code: one torch thread per process, versions and git revision for the records,
atomic writes, lag settings, and reading the zoo YAML shipped in ``sb3_vaco``.
"""

import functools
import gzip
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The checkout the lab belongs to (``scripts/vaco_lab/`` is two levels below its root).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Distributions whose versions every record carries.
VERSIONED_PACKAGES = ("stable_baselines3", "sb3_vaco", "torch", "gymnasium", "mujoco", "rl_zoo3", "numpy")

LagSetting = int | tuple[int, int]
#: The two files of a finished run; result.json is written last and marks the run as finished.
RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.csv.gz"  # gzip: a tenth of the plain CSV (runs written before it: progress.csv)
#: The per-iteration log of runs written before it was compressed
PLAIN_PROGRESS_FILE = "progress.csv"


def use_one_thread() -> None:
    """
    One compute thread per process: on a machine shared by parallel runs, torch's default thread pool makes
    training 10-25x slower. The environment variables reach processes started afterwards (spawned workers).
    """
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = "1"
    import torch as th

    th.set_num_threads(1)


def package_versions() -> dict[str, str]:
    """Python, platform and the installed versions of :data:`VERSIONED_PACKAGES`."""
    versions = {"python": platform.python_version(), "platform": platform.platform()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def git_revision() -> str | None:
    """The repository's commit, suffixed ``+dirty`` when tracked files have uncommitted changes; None outside git."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if status else "")


def check_checkout() -> None:
    """
    Raise ``RuntimeError`` unless ``sb3_vaco`` is imported from this checkout: a record's git revision must name the
    code that ran. From another checkout (a ``git worktree`` at a fixed commit), run with ``PYTHONPATH`` set to it.
    """
    import sb3_vaco

    package_root = Path(sb3_vaco.__file__).resolve().parents[1]
    if package_root != REPO_ROOT:
        raise RuntimeError(
            f"sb3_vaco is imported from {package_root}, not from this checkout {REPO_ROOT}: "
            f"run with PYTHONPATH={REPO_ROOT} (or install this checkout) so that the records name the code that ran"
        )


def command_line() -> str:
    """The command that started this process, as a user would retype it."""
    return shlex.join(["python", *sys.argv])


def atomic_write_text(path: Path, text: str) -> None:
    """
    Write ``text`` to ``path`` through a temporary file in the same folder and a rename: never a partial file.
    A ``.gz`` path is written gzip-compressed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as tmp:
        data = text.encode()
        tmp.write(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    os.chmod(tmp.name, 0o644)  # NamedTemporaryFile creates it private
    os.replace(tmp.name, path)


def parse_lag(text: str) -> LagSetting:
    """``"4"`` → ``4`` (every env 4 updates stale); ``"0-8"`` → ``(0, 8)`` (per-env staleness drawn in [0, 8])."""
    low, sep, high = text.strip().partition("-")
    try:
        lag: LagSetting = (int(low), int(high)) if sep else int(low)
    except ValueError:
        raise ValueError(f"A lag setting is an int K or a range K_min-K_max, got {text!r}") from None
    lag_range = lag if isinstance(lag, tuple) else (lag, lag)
    if not 0 <= lag_range[0] <= lag_range[1]:
        raise ValueError(f"A lag setting needs 0 <= K_min <= K_max, got {text!r}")
    return lag


def lag_label(lag: LagSetting) -> str:
    """Inverse of :func:`parse_lag`: ``4`` → ``"4"``, ``(0, 8)`` → ``"0-8"``."""
    return f"{lag[0]}-{lag[1]}" if isinstance(lag, tuple) else str(lag)


def lag_sort_key(label: str) -> tuple[float, int]:
    """Order lag settings by mean staleness, then by the widest staleness: 0, 4, 0-8, 16."""
    lag = parse_lag(label)
    low, high = lag if isinstance(lag, tuple) else (lag, lag)
    return (low + high) / 2, high


def parse_seeds(items: Any) -> tuple[int, ...]:
    """Seeds as ints and inclusive ranges: ``["0-2", "7"]`` (or ``"0-2"``, ``[0, 1]``) → ``(0, 1, 2, 7)``."""
    items = [items] if isinstance(items, (str, int)) else list(items)
    seeds: list[int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ValueError(f"A seed is an int or an inclusive range A-B, got {item!r}")
        low, sep, high = str(item).strip().partition("-")
        try:
            seeds.extend(range(int(low), int(high) + 1) if sep else [int(low)])
        except ValueError:
            raise ValueError(f"A seed is an int or an inclusive range A-B, got {item!r}") from None
    if not seeds:
        raise ValueError(f"No seeds in {items!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"Repeated seed in {items!r}")
    return tuple(seeds)


@functools.cache
def _zoo_entries(algo: str) -> dict[str, dict[str, Any]]:
    from sb3_vaco.zoo import load_entries

    return load_entries(algo)


def zoo_entry(algo: str, env_id: str) -> dict[str, Any]:
    """The hyperparameters the zoo uses for ``algo`` on ``env_id``: the env's YAML entry, else ``default`` (a copy)."""
    entries = _zoo_entries(algo)
    return dict(entries[env_id] if env_id in entries else entries["default"])
