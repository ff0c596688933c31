"""Notebook 03, rejection sampling at one position: accept a draft token so that the
output follows the target distribution p exactly, whatever the draft distribution q.

Reference solutions of the exercises in ``grader/source/03_rejection_sampling``.
"""

from __future__ import annotations

import torch

from specdec.validate import check_distribution, check_probability, check_token_ids


def check_pair(p: torch.Tensor, q: torch.Tensor) -> None:
    check_distribution(p, "p")
    check_distribution(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")


def check_draft_token(q: torch.Tensor, y: int) -> None:
    check_token_ids(torch.as_tensor(y), "y", q.shape[-1], ndim=0)
    if q[y] <= 0:
        raise ValueError(f"q[y] = 0 for the draft token y = {y}: the draft cannot have sampled it (wrong q?)")


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, y: int) -> float:
    """Probability of accepting the draft token y: min(1, p(y) / q(y))."""
    check_pair(p, q)
    check_draft_token(q, y)
    ### BEGIN SOLUTION
    return min(1.0, float(p[y]) / float(q[y]))
    ### END SOLUTION


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where rejections go: max(p - q, 0), normalised. (V,) float64.

    When p == q nothing is ever rejected and the residual is 0/0; return p then (any
    distribution would do, and p keeps the sampler well defined), never NaN.
    """
    check_pair(p, q)
    ### BEGIN SOLUTION
    excess = (p.to(torch.float64) - q.to(torch.float64)).clamp_min(0)
    total = excess.sum()
    if total <= 0:
        return p.to(torch.float64)
    return excess / total
    ### END SOLUTION


def verify_token(
    p: torch.Tensor, q: torch.Tensor, y: int, u: float, generator: torch.Generator | None = None
) -> tuple[bool, int]:
    """Speculative sampling at one position.

    y was drawn from q; u is a uniform draw in [0, 1). Accept y when u < p(y) / q(y);
    otherwise draw the output from the residual (with ``generator``). Returns
    (accepted, output token).
    """
    check_pair(p, q)
    check_draft_token(q, y)
    check_probability(u, "u")
    ### BEGIN SOLUTION
    if u * float(q[y]) < float(p[y]):  # u < p/q without dividing; p(y) = 0 never passes
        return True, int(y)
    residual = residual_distribution(p, q)
    return False, int(torch.multinomial(residual, 1, generator=generator))
    ### END SOLUTION


def output_paths(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two ways verify_token can output each token x, when y ~ q and u ~ U[0, 1).

    Returns (accept_path, reject_path), both (V,) float64: accept_path[x] is the
    probability that the draft proposes x and it is accepted; reject_path[x] that some
    draft is rejected and x is drawn from the residual. Their sum is the output distribution.
    """
    check_pair(p, q)
    ### BEGIN SOLUTION
    p, q = p.to(torch.float64), q.to(torch.float64)
    accept = torch.where(q > 0, torch.minimum(torch.ones_like(p), p / q.clamp_min(1e-300)), torch.zeros_like(p))
    accept_path = q * accept  # (V,)
    reject_mass = (q * (1 - accept)).sum()  # P(reject), over every draft token
    return accept_path, reject_mass * residual_distribution(p, q)
    ### END SOLUTION


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> float:
    """Probability that a draft token y ~ q is accepted: sum of min(p, q) = 1 - TV(p, q)."""
    check_pair(p, q)
    ### BEGIN SOLUTION
    return float(torch.minimum(p.to(torch.float64), q.to(torch.float64)).sum())
    ### END SOLUTION


# --- Course machinery (not exercises) ---


def monte_carlo_output(p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """Empirical output distribution of n independent vectorised rounds. (V,) float64."""
    check_pair(p, q)
    p, q = p.to(torch.float64), q.to(torch.float64)
    y = torch.multinomial(q, n, replacement=True, generator=generator)  # (n,)
    u = torch.rand(n, generator=generator, dtype=torch.float64)  # (n,)
    accepted = u * q[y] < p[y]  # (n,)
    fallback = torch.multinomial(residual_distribution(p, q), n, replacement=True, generator=generator)  # (n,)
    out = torch.where(accepted, y, fallback)
    return torch.bincount(out, minlength=p.shape[0]).to(torch.float64) / n
