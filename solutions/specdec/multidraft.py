"""Verifying several *sampled* candidates at one node (notebook 07, section 4b): exact output
distributions by enumeration.

The course's trees have deterministic children (the draft's top-k), verified by elimination:
try child x with probability r(x) / sum(r), remove it on rejection. When the children are
instead k samples from the draft's q, there is a better rule that uses q: SpecInfer's
multi-step speculative sampling. Try child x with probability min(1, r(x) / q(x)); on
rejection replace the target's distribution by its residual, r <- norm(max(r - q, 0)); when
every child is rejected, sample from r. Each step is notebook 03's single-position rule with
target r and proposal q, so the output follows p. Without replacement (Sequoia), the proposal
of the next child is q with the children already drawn removed, and the same rule uses it.

Everything here is exact arithmetic (float64) over every tuple of children: no sampling.
"""

from __future__ import annotations

import itertools

import torch

#: The rules :func:`node_outcome` knows. ``residual``: multi-step speculative sampling (exact).
#: ``one_hot``: the course's elimination rule applied to sampled children (exact, ignores q).
#: ``stale``: min(1, p/q) against the original p for every child and a final sample from
#: norm(max(p - q, 0)), without updating the residual (NOT exact: the bug to recognise).
RULES = ("residual", "one_hot", "stale")


def _normalised(weights: torch.Tensor) -> torch.Tensor:
    total = weights.sum()
    return weights / total if total > 0 else weights


def verify_children(p: torch.Tensor, proposals: list[torch.Tensor], children: tuple[int, ...],
                    rule: str) -> tuple[torch.Tensor, float]:
    """Exact outcome of verifying the given children in order at one node.

    p: (V,) the target's distribution; proposals[i]: (V,) the distribution child i was drawn
    from; children: their tokens. Returns (the committed token's distribution (V,), the
    probability that some child was accepted)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    out = torch.zeros_like(p)
    r = p.clone()
    still_rejecting = 1.0  # probability that every child so far was rejected
    for x, q in zip(children, proposals):
        if rule == "residual":
            accept = min(1.0, float(r[x] / q[x])) if q[x] > 0 else 0.0
        elif rule == "one_hot":
            accept = float(r[x] / r.sum()) if r.sum() > 0 else 0.0
        else:  # stale
            accept = min(1.0, float(p[x] / q[x])) if q[x] > 0 else 0.0
        out[x] += still_rejecting * accept
        still_rejecting *= 1.0 - accept
        if rule == "residual":
            r = _normalised(torch.clamp(r - q, min=0.0))
        elif rule == "one_hot":
            r[x] = 0.0
    if rule == "stale":
        r = torch.clamp(p - proposals[-1], min=0.0)
    if still_rejecting > 0:
        out += still_rejecting * _normalised(r)
    return out, 1.0 - still_rejecting


def node_outcome(p: torch.Tensor, q: torch.Tensor, k: int, rule: str,
                 replacement: bool = True) -> tuple[torch.Tensor, float]:
    """The committed token's exact distribution (V,) and the acceptance probability when k children
    are drawn from q (i.i.d., or without replacement) and verified in order with ``rule``."""
    p, q = p.to(torch.float64), q.to(torch.float64)
    if p.shape != q.shape or p.dim() != 1:
        raise ValueError(f"p and q must be (V,) of one shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    if k < 1 or (not replacement and k > int((q > 0).sum())):
        raise ValueError(f"k must be >= 1 (and at most the draft's support without replacement), got {k}")
    out, accepted = torch.zeros_like(p), 0.0
    for children in itertools.product(range(p.shape[0]), repeat=k):
        weight, proposals, remaining = 1.0, [], q.clone()
        for x in children:
            proposal = _normalised(remaining)
            weight *= float(proposal[x])
            proposals.append(proposal)
            if not replacement:
                remaining[x] = 0.0
        if weight == 0.0:
            continue
        dist, acc = verify_children(p, proposals, children, rule)
        out += weight * dist
        accepted += weight * acc
    return out, accepted
