"""
RL Zoo integration: ``python -m sb3_vaco.zoo train --algo vaco --env Hopper-v5`` (see :mod:`sb3_vaco.zoo.cli`).

This subpackage imports rl_zoo3 (which patches gymnasium's TimeLimit globally), so ``sb3_vaco/__init__.py``
never imports it.
"""

from pathlib import Path

from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_vaco import VACO, LaggedPPO

HYPERPARAMS_DIR = Path(__file__).resolve().parent.parent / "hyperparams"
ZOO_ALGOS: dict[str, type[BaseAlgorithm]] = {"vaco": VACO, "lagged_ppo": LaggedPPO}


def register_algos() -> None:
    """
    Add ``vaco`` and ``lagged_ppo`` to rl_zoo3's algorithm table and to its Optuna sampler and converter tables,
    in place (the zoo has no plugin mechanism). Idempotent.
    """
    from rl_zoo3 import hyperparams_opt, utils

    from sb3_vaco.zoo.hyperparams_opt import HYPERPARAMS_CONVERTER, HYPERPARAMS_SAMPLER

    utils.ALGOS.update(ZOO_ALGOS)
    hyperparams_opt.HYPERPARAMS_SAMPLER.update(HYPERPARAMS_SAMPLER)
    hyperparams_opt.HYPERPARAMS_CONVERTER.update(HYPERPARAMS_CONVERTER)
