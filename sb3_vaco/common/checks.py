"""Hyperparameter validation shared by every algorithm: errors that name the parameter and what is allowed."""

from typing import Any

import numpy as np


def require(condition: bool, message: str) -> None:
    """A ``ValueError`` with ``message`` unless ``condition``."""
    if not condition:
        raise ValueError(message)


def check_positive(name: str, value: Any) -> None:
    """A ``ValueError`` naming ``name`` unless ``value`` is a schedule or a number > 0."""
    if not callable(value):
        require(
            isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
            f"`{name}` must be a number > 0, got {value!r}",
        )


def check_integer(name: str, value: Any, minimum: int = 1) -> None:
    """A ``ValueError`` naming ``name`` unless ``value`` is an int >= ``minimum`` (``"64"``, ``16.5``, ``True`` are not)."""
    require(
        isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= minimum),
        f"`{name}` must be an int >= {minimum}, got {value!r}",
    )
