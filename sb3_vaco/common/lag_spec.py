"""A policy-lag setting: ``K`` (every env ``K`` updates stale) or a per-env range ``(K_min, K_max)``."""

import numpy as np

PolicyLagSpec = int | tuple[int, int] | list[int]


def parse_policy_lag(policy_lag: PolicyLagSpec) -> tuple[int, int]:
    """
    Validate a lag setting and return it as ``(K_min, K_max)``.

    :param policy_lag: ``K`` (every env K updates stale) or ``(K_min, K_max)`` (per-env staleness range)
    """
    if isinstance(policy_lag, (int, np.integer)) and not isinstance(policy_lag, bool):
        lag_range = (int(policy_lag), int(policy_lag))
    elif (
        isinstance(policy_lag, (tuple, list))
        and len(policy_lag) == 2
        and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in policy_lag)
    ):
        lag_range = (int(policy_lag[0]), int(policy_lag[1]))
    else:
        raise ValueError(
            f"`policy_lag` must be an int K >= 0 or a pair (K_min, K_max) of ints with 0 <= K_min <= K_max, got {policy_lag!r}"
        )
    if lag_range[0] < 0 or lag_range[0] > lag_range[1]:
        raise ValueError(f"`policy_lag` must satisfy 0 <= K_min <= K_max, got {policy_lag!r}")
    return lag_range
