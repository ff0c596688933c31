"""Input validation shared by the reference functions: clear errors, never silent garbage."""

from __future__ import annotations

import math
from numbers import Integral, Real


def check_positive_int(value: object, name: str, minimum: int = 1) -> int:
    """Return ``value`` as an int if it is an integer >= ``minimum``, else raise."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive_real(value: object, name: str) -> float:
    """Return ``value`` as a float if it is a finite number > 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


def check_nonnegative_real(value: object, name: str) -> float:
    """Return ``value`` as a float if it is a finite number >= 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return float(value)


def check_probability(value: object, name: str) -> float:
    """Return ``value`` as a float if it lies in [0, 1], else raise."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not (0.0 <= value <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return float(value)
