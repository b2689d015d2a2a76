"""
Env wrappers and env factories shared by the benchmark grids, the RL Zoo integration and the actors.

* :class:`LatencyWrapper`: a fixed latency per ``step()`` (a remote simulator, a robot, a slow link). In a grid or a
  zoo YAML entry: ``env_wrapper: {sb3_vaco.common.wrappers.LatencyWrapper: {latency: 0.001}}``.
* :class:`WrappedEnvFactory`: ``gym.make(env_id)`` inside a wrapper, picklable: what asynchronous actors build their
  envs from when the learner's env came from the zoo (``sb3_vaco.zoo.exp_manager``), so that they step the same
  wrapped env as a synchronous run.
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any, SupportsFloat

import gymnasium as gym


class LatencyWrapper(gym.Wrapper):
    """
    Adds a fixed latency to every ``step()``: ``time.sleep`` before the wrapped env's step, so the caller waits at least
    ``latency`` seconds per step without using CPU.

    :param env: the env to wrap
    :param latency: seconds per step (>= 0)
    """

    def __init__(self, env: gym.Env, latency: float) -> None:
        if not latency >= 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency!r}")
        super().__init__(env)
        self.latency = float(latency)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.latency > 0:
            time.sleep(self.latency)
        return self.env.step(action)


@dataclasses.dataclass(frozen=True)
class WrappedEnvFactory:
    """
    ``wrapper(gym.make(env_id, **kwargs))``: an env factory that pickles (cloudpickle takes the wrapper by value when it
    is a closure, such as the zoo's ``env_wrapper``). The actors' fork server preloads the module of ``env_id``.

    :param env_id: registered env id
    :param wrapper: callable ``env -> wrapped env`` (None: the env as ``gym.make`` returns it)
    :param label: how the wrapper is shown (e.g. the zoo's ``env_wrapper`` setting), for logs and records
    """

    env_id: str
    wrapper: Callable[[gym.Env], gym.Env] | None = None
    label: str = ""

    def __call__(self, **kwargs: Any) -> gym.Env:
        env = gym.make(self.env_id, **kwargs)
        return self.wrapper(env) if self.wrapper is not None else env

    def __repr__(self) -> str:
        return f"WrappedEnvFactory({self.env_id!r}, wrapper={self.label or self.wrapper!r})"
