"""
The lag state in a checkpoint: a zip member of its own (``policy_lag.pt``) beside what SB3 saves. SB3's loaders read
only ``data``, the ``*.pth`` members and the version files, so ``PPO.load`` (``TRPO.load``, ...) reads a lagged
algorithm's checkpoint as its own, and ``get_parameters()`` holds the policy and optimizer state dicts only.
"""

import io
import pathlib
import zipfile
from typing import Any

import torch as th
from stable_baselines3.common.save_util import open_path

#: The zip member holding :meth:`~sb3_vaco.common.policy_lag.PolicyLag.state_dict` (not ``.pth``: SB3 skips it)
LAG_STATE_MEMBER = "policy_lag.pt"


def add_lag_state(archive_bytes: io.BytesIO, state: dict[str, Any]) -> None:
    """Append the lag state to a checkpoint written into ``archive_bytes`` by SB3's ``save()``."""
    archive_bytes.seek(0)
    with zipfile.ZipFile(archive_bytes, mode="a") as archive:
        with archive.open(LAG_STATE_MEMBER, mode="w", force_zip64=True) as member:
            th.save(state, member)


def read_lag_state(path: str | pathlib.Path | io.BufferedIOBase, device: th.device | str) -> dict[str, Any] | None:
    """
    The lag state of the checkpoint at ``path`` (found as SB3's ``load()`` finds it: ``path`` or ``path.zip``), or
    None if it was saved without one.
    """
    if isinstance(path, io.BufferedIOBase) and path.seekable():
        path.seek(0)
    file = open_path(path, "r", verbose=0, suffix="zip")
    try:
        with zipfile.ZipFile(file) as archive:
            if LAG_STATE_MEMBER not in archive.namelist():
                return None
            with archive.open(LAG_STATE_MEMBER) as member:
                return th.load(io.BytesIO(member.read()), map_location=device, weights_only=True)
    finally:
        if not isinstance(path, io.BufferedIOBase):
            file.close()
