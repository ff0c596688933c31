"""Turning logits into the distribution a sampler actually draws from.

Verification is exact only for the distributions it is given: q must be what the draft
really sampled from, and p must apply the request's settings (temperature here; top-k
and top-p later).
"""

from __future__ import annotations

import torch

from specdec.validate import check_nonnegative_real


def probs_from_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution a sampler draws from, along the last dim, in float64.

    Softmax of logits / temperature, restricted to the top_k most likely tokens (0: all)
    and to the smallest set whose probability reaches top_p (1.0: all), renormalised.
    temperature = 0 means greedy: a one-hot vector at the argmax (the distribution a
    greedy sampler draws from, which is what verification must be given as q or p).
    """
    check_nonnegative_real(temperature, "temperature")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 keeps every token), got {top_k}")
    logits = logits.to(torch.float64)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float64)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_k and top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the strictly more likely tokens
        keep_sorted = before < top_p * sorted_probs.sum(-1, keepdim=True)
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of probs (..., V) -> (...)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def sample_from_weights(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of non-negative, unnormalised weights (B, V) -> (B,), by inverse CDF.

    Drawing u * total and finding where it falls in the cumulative sum samples row b with
    probability weights[b] / weights[b].sum() without dividing, and costs one cumsum
    (torch.multinomial is far slower for a large V on CPU). Rows must have a positive sum.
    """
    cdf = weights.to(torch.float64).cumsum(-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64)
    index = torch.searchsorted(cdf, u * total, right=True)  # (B, 1): first cdf entry above the draw
    last_positive = weights.shape[-1] - 1 - (weights > 0).flip(-1).to(torch.int8).argmax(-1, keepdim=True)
    return torch.minimum(index, last_positive).squeeze(-1)  # guards u * total rounding up to total
