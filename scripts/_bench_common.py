"""
For the scripts that import it (``speed_benchmark.py``): puts this checkout first on ``sys.path``, so that
``sb3_vaco`` is imported from it (a worktree, a copy) rather than wherever it is installed and a record's git
revision names the code that ran, then re-exports :mod:`sb3_vaco.bench.common`. Spawned workers re-import this
module and get the same path.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from sb3_vaco.bench.common import (  # noqa: E402
    PROGRESS_FILE,
    RESULT_FILE,
    VERSIONED_PACKAGES,
    LagSetting,
    atomic_write_text,
    command_line,
    git_revision,
    lag_label,
    lag_sort_key,
    package_versions,
    parse_lag,
    use_one_thread,
    zoo_entry,
)

__all__ = [
    "PROGRESS_FILE",
    "REPO_ROOT",
    "RESULT_FILE",
    "VERSIONED_PACKAGES",
    "LagSetting",
    "atomic_write_text",
    "command_line",
    "git_revision",
    "lag_label",
    "lag_sort_key",
    "package_versions",
    "parse_lag",
    "use_one_thread",
    "zoo_entry",
]
