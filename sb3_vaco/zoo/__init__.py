"""
RL Zoo integration: ``python -m sb3_vaco.zoo train --algo vaco --env Hopper-v5`` (see :mod:`sb3_vaco.zoo.cli`).

This subpackage imports rl_zoo3 (which patches gymnasium's TimeLimit globally), so ``sb3_vaco/__init__.py``
never imports it.
"""

import functools
import tempfile
from pathlib import Path
from typing import Any

import yaml
from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_vaco import (
    APPO,
    IMPALA,
    PPOKL,
    SPO,
    VACO,
    DecoupledPPO,
    LaggedPPO,
    LaggedTRPO,
    VACOAlignOnly,
    VACOFilterOnly,
)

HYPERPARAMS_DIR = Path(__file__).resolve().parent.parent / "hyperparams"
ZOO_ALGOS: dict[str, type[BaseAlgorithm]] = {
    "vaco": VACO,
    "lagged_ppo": LaggedPPO,
    "vaco_align_only": VACOAlignOnly,
    "vaco_filter_only": VACOFilterOnly,
    "ppo_kl": PPOKL,
    "spo": SPO,
    "decoupled_ppo": DecoupledPPO,
    "impala": IMPALA,
    "appo": APPO,
    "lagged_trpo": LaggedTRPO,
}
#: The key of a shipped YAML file that takes another file's entries: ``inherit: {from: vaco, without: [key, ...]}``
INHERIT_KEY = "inherit"


def load_entries(algo: str) -> dict[str, dict[str, Any]]:
    """
    The shipped hyperparameter entries of ``algo`` (env id → entry). A file with an ``inherit`` entry starts from
    the entries of the file it names, less the keys listed under ``without``, and its own entries update them key by
    key: a baseline takes VACO's tuned settings and states only what differs.
    """
    path = HYPERPARAMS_DIR / f"{algo}.yml"
    entries: dict[str, Any] = yaml.safe_load(path.read_text())
    inherit = entries.pop(INHERIT_KEY, None)
    if inherit is None:
        return entries
    if not isinstance(inherit, dict) or set(inherit) - {"from", "without"} or "from" not in inherit:
        raise ValueError(f"{path}: `{INHERIT_KEY}` must be a mapping with `from` (a file name) and optional `without`")
    without = set(inherit.get("without", []))
    resolved = {
        env_id: {key: value for key, value in entry.items() if key not in without}
        for env_id, entry in load_entries(inherit["from"]).items()
    }
    for env_id, entry in entries.items():
        resolved[env_id] = {**resolved.get(env_id, {}), **(entry or {})}
    return resolved


@functools.cache
def config_file(algo: str) -> Path:
    """The YAML file the zoo reads for ``algo`` (``--conf-file``): the shipped file, or its resolved entries if it inherits."""
    path = HYPERPARAMS_DIR / f"{algo}.yml"
    if INHERIT_KEY not in yaml.safe_load(path.read_text()):
        return path
    resolved = Path(tempfile.mkdtemp(prefix="sb3_vaco_hyperparams_")) / path.name
    resolved.write_text(yaml.safe_dump(load_entries(algo), sort_keys=False))
    return resolved


def register_algos() -> None:
    """
    Add VACO, LaggedPPO, the baselines and the peers to rl_zoo3's algorithm table, and the Optuna samplers of VACO,
    LaggedPPO and the peers and their converters to the zoo's tables, in place (no plugin mechanism). Idempotent.
    """
    from rl_zoo3 import hyperparams_opt, utils

    from sb3_vaco.zoo.hyperparams_opt import HYPERPARAMS_CONVERTER, HYPERPARAMS_SAMPLER

    utils.ALGOS.update(ZOO_ALGOS)
    hyperparams_opt.HYPERPARAMS_SAMPLER.update(HYPERPARAMS_SAMPLER)
    hyperparams_opt.HYPERPARAMS_CONVERTER.update(HYPERPARAMS_CONVERTER)
