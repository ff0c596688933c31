"""Turning logits into the distribution a sampler actually draws from.

Draft and target must use the same rule (temperature here; top-k/top-p later), or the
verification is exact for the wrong distribution.
"""

from __future__ import annotations

import torch

from specdec.validate import check_nonnegative_real


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax of logits / temperature along the last dim, in float64.

    temperature = 0 means greedy: a one-hot vector at the argmax (the distribution a
    greedy sampler draws from, which is what verification must be given as q or p).
    """
    check_nonnegative_real(temperature, "temperature")
    logits = logits.to(torch.float64)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float64)
    return torch.softmax(logits / temperature, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of probs (..., V) -> (...)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
