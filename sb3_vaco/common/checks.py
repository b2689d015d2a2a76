"""
Hyperparameter validation, one place for every algorithm of the package: each numeric parameter is checked for type,
finiteness and range, and a bad value raises a ``ValueError`` that names the parameter and says what is allowed.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


def require(condition: bool, message: str) -> None:
    """A ``ValueError`` with ``message`` unless ``condition``."""
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class Rule:
    """
    What a numeric hyperparameter accepts.

    :param low: the lower bound (None: none)
    :param low_open: whether ``low`` itself is excluded
    :param high: the upper bound, included (None: none)
    :param high_open: whether ``high`` itself is excluded
    :param integer: an int (numpy ints too; not a bool, not 16.0)
    :param optional: None is allowed
    :param schedule: a callable of the progress remaining is allowed (SB3's schedules)
    """

    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    integer: bool = False
    optional: bool = False
    schedule: bool = False

    def describe(self) -> str:
        kind = "an int" if self.integer else "a finite number"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            bounds.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        text = kind + (" " + " and ".join(bounds) if bounds else "")
        if self.schedule:
            text += ", or a schedule (a callable of the progress remaining)"
        if self.optional:
            text += ", or None"
        return text

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if callable(value):
            return self.schedule
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            return False
        if self.integer and not isinstance(value, (int, np.integer)):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or bool(value < self.high if self.high_open else value <= self.high)


_POSITIVE = Rule(low=0.0, low_open=True)
_NON_NEGATIVE = Rule(low=0.0)
_COUNT = Rule(low=1, integer=True)

#: Every numeric hyperparameter of the package's algorithms and of their hosts (SB3's PPO, sb3-contrib's TRPO)
HYPERPARAMETERS: dict[str, Rule] = {
    # SB3's on-policy algorithms
    "learning_rate": Rule(low=0.0, schedule=True),  # 0 freezes the weights: a legitimate check
    "n_steps": _COUNT,
    "batch_size": Rule(low=1, integer=True, optional=True),
    "n_epochs": _COUNT,
    "gamma": Rule(low=0.0, high=1.0),
    "gae_lambda": Rule(low=0.0, high=1.0),
    "ent_coef": _NON_NEGATIVE,
    "vf_coef": _NON_NEGATIVE,
    "max_grad_norm": _POSITIVE,
    "target_kl": Rule(low=0.0, low_open=True, optional=True),
    "clip_range": Rule(low=0.0, low_open=True, schedule=True),
    "clip_range_vf": Rule(low=0.0, low_open=True, schedule=True, optional=True),
    "sde_sample_freq": Rule(low=-1, integer=True),
    "stats_window_size": _COUNT,
    # sb3-contrib's TRPO
    "cg_max_steps": _COUNT,
    "cg_damping": _NON_NEGATIVE,
    "line_search_shrinking_factor": Rule(low=0.0, low_open=True, high=1.0, high_open=True),
    "line_search_max_iter": _COUNT,
    "n_critic_updates": _COUNT,
    "sub_sampling_factor": _COUNT,
    # V-trace and VACO
    "vtrace_rho_bar": _POSITIVE,
    "vtrace_c_bar": _POSITIVE,
    "tv_threshold": Rule(low=0.0, low_open=True, schedule=True),
    "ratio_bound": Rule(low=0.0, low_open=True, optional=True),
    "tv_behavior_limit": Rule(low=0.0, low_open=True, optional=True),
    # the baselines and the peers
    "kl_coef": _NON_NEGATIVE,
    "behavior_kl_coef": Rule(low=0.0, optional=True),
    "weight_cap": _POSITIVE,
    "pg_rho_bar": _POSITIVE,
    "is_ratio_clip": _POSITIVE,
    "kl_target": _POSITIVE,
}


def check_hyperparameters(values: Mapping[str, Any], rules: Mapping[str, Rule] = HYPERPARAMETERS) -> None:
    """
    Check every entry of ``values`` (constructor arguments, or a model's attributes) that ``rules`` knows; other
    entries are left alone.

    :raises ValueError: naming the first bad parameter and what it accepts
    """
    for name, value in values.items():
        rule = rules.get(name)
        if rule is not None and not rule.accepts(value):
            raise ValueError(f"`{name}` must be {rule.describe()}; got {value!r}")
