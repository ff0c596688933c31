"""Notebook 15, the ledger of a round when acceptance depends on the position and drafting may cost one pass.

alphas[k - 1] = P(draft k accepted | drafts 1..k-1 accepted), the per-position acceptance a proposer shows (a
parallel drafter's falls faster with k than an autoregressive one's). A round of gamma drafts commits
E_gamma = 1 + alpha_1 + alpha_1 alpha_2 + ... + alpha_1...alpha_gamma tokens in expectation, and costs
draft(gamma) + verify(gamma); target-only decoding costs verify(0) per token. E_gamma is notebook 04's
``expected_committed_length``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from specdec.chain import expected_committed_length


def acceptance_by_position(accepted: Sequence[int], proposed: Sequence[int]) -> list[float]:
    """Per-position acceptance measured from rounds: alpha_k for k = 1..max(proposed).

    accepted[r], proposed[r]: round r's accepted and proposed drafts (0 <= accepted <= proposed; the last round of a
    request may propose fewer). alpha_k is the share of the rounds that reached draft k (proposed at least k drafts
    and accepted the first k - 1) that also accepted it; float("nan") where no round reached draft k. Raises
    ValueError on inputs that are not such rounds.
    """
    if len(accepted) != len(proposed) or not accepted:
        raise ValueError(f"need one accepted and one proposed count per round, got {len(accepted)} and {len(proposed)}")
    for a, p in zip(accepted, proposed):
        if not (isinstance(a, int) and isinstance(p, int)) or isinstance(a, bool) or not 0 <= a <= p:
            raise ValueError(f"each round needs integers 0 <= accepted <= proposed, got accepted={a!r}, proposed={p!r}")
    ### BEGIN SOLUTION
    alphas = []
    for k in range(1, max(proposed) + 1):
        reached = sum(1 for a, p in zip(accepted, proposed) if p >= k and a >= k - 1)
        passed = sum(1 for a in accepted if a >= k)
        alphas.append(passed / reached if reached else math.nan)
    return alphas
    ### END SOLUTION


def best_gamma_by_position(alphas: Sequence[float], draft_cost: Callable[[int], float],
               verify_cost: Callable[[int], float]) -> tuple[int, float]:
    """The gamma in 1..len(alphas) with the highest expected speedup over target-only decoding, and that speedup.

    alphas: per-position acceptance (above); draft_cost(g): the time to draft g tokens; verify_cost(g): the time of
    the target's forward over g + 1 positions (verify_cost(0) is a plain decoding step). Speedup(g) = E_g x
    verify_cost(0) / (draft_cost(g) + verify_cost(g)). Ties go to the smaller gamma. Returns (gamma, speedup).
    """
    if not alphas or any(not 0 <= a <= 1 for a in alphas):
        raise ValueError(f"alphas must be a non-empty sequence of probabilities, got {list(alphas)}")
    ### BEGIN SOLUTION
    best = (0, -math.inf)
    for g in range(1, len(alphas) + 1):
        speedup = expected_committed_length(alphas[:g]) * verify_cost(0) / (draft_cost(g) + verify_cost(g))
        if speedup > best[1]:
            best = (g, speedup)
    return best
    ### END SOLUTION


def cost_from_measurements(points: dict[int, float]) -> Callable[[int], float]:
    """A cost function of gamma from costs measured at some gammas: linear between them, flat beyond the ends (for
    :func:`best_gamma_by_position` when only some gammas were run)."""
    if not points:
        raise ValueError("need at least one measured (gamma, cost) point")
    xs = sorted(points)

    def cost(g: int) -> float:
        if g <= xs[0]:
            return points[xs[0]]
        for a, b in zip(xs, xs[1:]):
            if a <= g <= b:
                return points[a] + (points[b] - points[a]) * (g - a) / (b - a)
        return points[xs[-1]]

    return cost
