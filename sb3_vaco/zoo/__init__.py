"""
RL Zoo integration: ``python -m sb3_vaco.zoo train --algo vaco --env Hopper-v5``.

This subpackage imports rl_zoo3 (which patches gymnasium's TimeLimit globally), so ``sb3_vaco/__init__.py``
never imports it.
"""

from pathlib import Path

from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_vaco import VACO, LaggedPPO

HYPERPARAMS_DIR = Path(__file__).resolve().parent.parent / "hyperparams"
ZOO_ALGOS: dict[str, type[BaseAlgorithm]] = {"vaco": VACO, "lagged_ppo": LaggedPPO}


def register_algos() -> None:
    """Add ``vaco`` and ``lagged_ppo`` to rl_zoo3's algorithm table, in place (the zoo has no plugin mechanism)."""
    from rl_zoo3 import utils

    utils.ALGOS.update(ZOO_ALGOS)
