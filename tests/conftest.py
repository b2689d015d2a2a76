"""Fixtures shared by the test modules: one thread per process, and the tiny settings every algorithm trains with."""

from collections.abc import Callable
from typing import Any

import pytest
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm

import sb3_vaco
from sb3_vaco import IMPALA, LaggedMaskablePPO, LaggedTRPO

#: Every public algorithm class of the package, but LaggedMaskablePPO, which needs envs with action masks (its own
#: tests are in test_peers.py)
ALGORITHMS: tuple[type[BaseAlgorithm], ...] = tuple(
    algo
    for algo in (getattr(sb3_vaco, name) for name in sb3_vaco.__all__)
    if isinstance(algo, type) and issubclass(algo, BaseAlgorithm) and algo is not LaggedMaskablePPO
)

#: A one-layer network of 16 units: enough to learn CartPole a little, cheap to train on one thread
TINY_NET = dict(net_arch=[16])
#: The tiny settings of the PPO-shaped algorithms (test modules override single keys, never redefine them):
#: rollouts of 32 steps per env, minibatches of 16, two passes
TINY: dict[str, Any] = dict(n_steps=32, batch_size=16, n_epochs=2, policy_kwargs=TINY_NET)


def tiny_settings(algo: type[BaseAlgorithm]) -> dict[str, Any]:
    """:data:`TINY` in the terms of ``algo`` (TRPO has critic updates instead of epochs; IMPALA one batch per pass)."""
    if issubclass(algo, LaggedTRPO):
        return {"n_steps": TINY["n_steps"], "batch_size": TINY["batch_size"], "policy_kwargs": TINY_NET,
                "n_critic_updates": 2, "cg_max_steps": 5}  # fmt: skip
    if issubclass(algo, IMPALA):
        return {key: value for key, value in TINY.items() if key != "batch_size"}
    return dict(TINY)


@pytest.fixture(autouse=True)
def one_torch_thread():
    # Torch is several times faster with one thread on this 2-core machine, and tests must not fight for cores.
    th.set_num_threads(1)


@pytest.fixture
def tiny() -> Callable[[type[BaseAlgorithm]], dict[str, Any]]:
    """``tiny(algo)``: the tiny settings of ``algo`` (a fresh dict each call)."""
    return tiny_settings


@pytest.fixture(params=ALGORITHMS, ids=lambda algo: algo.__name__)
def any_algo(request: pytest.FixtureRequest) -> type[BaseAlgorithm]:
    """Each public algorithm class in turn (a test taking it runs once per class)."""
    return request.param
