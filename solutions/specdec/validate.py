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


def check_tensor(x: object, name: str, ndim: int, *, floating: bool | None = None) -> None:
    """Raise unless x is a torch tensor with ``ndim`` dimensions (and a float or integer dtype)."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")
    if floating is True and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if floating is False and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor of token ids, got {x.dtype}")


def check_distribution(p: object, name: str, ndim: int = 1, atol: float = 1e-5) -> None:
    """Raise unless p holds probability vectors along its last dimension (finite, >= 0, sum 1)."""
    import torch

    check_tensor(p, name, ndim, floating=True)
    if p.shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary dimension")
    sums = p.sum(-1, dtype=torch.float64)  # NaN and inf propagate into the sums: one pass finds both
    if not torch.isfinite(sums).all():
        raise ValueError(f"{name} contains NaN or inf")
    if p.min() < 0:
        raise ValueError(f"{name} has negative probabilities (min {p.min().item():.3g}); pass probabilities, not logits")
    worst = (sums - 1).abs().max().item()
    if worst > atol:
        raise ValueError(f"{name} must sum to 1 along its last dimension (off by up to {worst:.3g}); normalise it")


def check_token_ids(tokens: object, name: str, vocab_size: int, ndim: int) -> None:
    """Raise unless tokens is an integer tensor of ids in [0, vocab_size)."""
    check_tensor(tokens, name, ndim, floating=False)
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"{name} has token ids outside [0, {vocab_size}): min {tokens.min().item()}, max {tokens.max().item()}")
