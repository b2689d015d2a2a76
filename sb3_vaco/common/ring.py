"""
Parameter snapshots of a module keyed by version: the one snapshot ring of the package, used by the injected lag of
the SB3 algorithms (:class:`~sb3_vaco.common.policy_lag.PolicyLag`) and by the LLM trainer.
"""

import torch as th
from torch import nn


class SnapshotRing:
    """
    Parameter snapshots of a module (its ``state_dict()``: parameters and buffers), keyed by *version*, an int that
    only grows (the SB3 algorithms: one version per update; the LLM trainer: the optimizer step).

    :meth:`select` gives the snapshot to act with for a wanted version: the newest one not newer than it, or the
    oldest one when none is that old (early in training). Old snapshots go when ``capacity`` is exceeded on
    :meth:`push` (SB3: ``K_max + 1`` versions are all that can act) or by :meth:`drop_before` (the LLM trainer, whose
    requests never go back in time).

    :param capacity: keep at most this many snapshots, dropping the oldest on :meth:`push` (None: no limit)
    :param device: where the snapshots are stored; None: on each tensor's own device; ``"cpu"``: a stale copy of an
        accelerator model costs host memory, not accelerator memory
    """

    def __init__(self, capacity: int | None = None, device: str | th.device | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"`capacity` must be None or >= 1, got {capacity!r}")
        self.capacity = capacity
        self.device = None if device is None else th.device(device)
        self._snapshots: dict[int, dict[str, th.Tensor]] = {}

    @property
    def versions(self) -> list[int]:
        """The stored versions, oldest first."""
        return sorted(self._snapshots)

    def __len__(self) -> int:
        return len(self._snapshots)

    def __contains__(self, version: object) -> bool:
        return version in self._snapshots

    def __getitem__(self, version: int) -> dict[str, th.Tensor]:
        """The snapshot of exactly ``version``."""
        return self._snapshots[version]

    @th.no_grad()
    def push(self, version: int, module: nn.Module) -> None:
        """Store a copy of ``module``'s parameters and buffers as ``version``."""
        self._snapshots[version] = {
            name: tensor.detach().clone() if self.device is None else tensor.detach().to(self.device, copy=True)
            for name, tensor in module.state_dict().items()
        }
        while self.capacity is not None and len(self._snapshots) > self.capacity:
            del self._snapshots[min(self._snapshots)]

    def select(self, target_version: int) -> tuple[int, dict[str, th.Tensor]]:
        """
        The snapshot to act with when the wanted version is ``target_version``: the newest one with a version
        ``<= target_version``, or the oldest one if there is none.

        :return: ``(version, state_dict)``
        """
        if not self._snapshots:
            raise RuntimeError("SnapshotRing.select() called before any snapshot was pushed")
        versions = self.versions
        eligible = [version for version in versions if version <= target_version]
        version = eligible[-1] if eligible else versions[0]
        return version, self._snapshots[version]

    def drop_before(self, version: int) -> None:
        """Drop every snapshot older than ``version``."""
        for old in [v for v in self._snapshots if v < version]:
            del self._snapshots[old]

    def state_dict(self) -> dict[int, dict[str, th.Tensor]]:
        """``{version: state_dict}`` (the stored tensors themselves, not copies)."""
        return dict(self._snapshots)

    def load_state_dict(self, state: dict[int, dict[str, th.Tensor]]) -> None:
        """Replace the snapshots by ``state`` (of :meth:`state_dict`), keeping the newest ``capacity`` ones."""
        self._snapshots = {}
        for version in sorted(state)[-self.capacity :] if self.capacity is not None else sorted(state):
            self._snapshots[int(version)] = {
                name: tensor if self.device is None else tensor.to(self.device) for name, tensor in state[version].items()
            }
