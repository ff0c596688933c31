"""Acceptance, said three ways, and the conversions between them (notebooks 09, 11, 12).

Terms (``accepted[r]``: drafts round r accepted, ``gammas[r]``: drafts it proposed):
    alpha                   the per-position probability that a draft is accepted given that every earlier
                            one was: the cost model's a, the argument of E(alpha, gamma). Estimated from rounds
                            as A / (A + R), A accepted drafts, R rounds that ended by a rejection (k < gamma):
                            the maximum-likelihood estimate when positions are accepted independently.
    draft acceptance rate   A / proposed drafts (vLLM's ``draft_acceptance_rate``). Not alpha: under the i.i.d.
                            model it is (E - 1) / gamma, which falls as gamma grows at a fixed alpha.
    mean acceptance length  tau = 1 + A / rounds: tokens committed per round, the correction or bonus token
                            included (vLLM's ``mean_acceptance_length``, EAGLE's tau). E(alpha, gamma) predicts it.
    per-position rates      position i (0-based): rounds that accepted draft i over rounds that tested it (that
                            proposed it and accepted drafts 0..i-1). Flat at alpha when the i.i.d. model holds.

Example: alpha 0.89 at gamma 4 gives E = 4.01 tokens per round and a draft acceptance rate of 0.75.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from specdec.ledger import expected_tokens_per_round
from specdec.validate import check_positive_int


def _check_rounds(accepted: Sequence[int], gammas: Sequence[int]) -> None:
    if isinstance(accepted, (str, bytes)) or isinstance(gammas, (str, bytes)):
        raise TypeError("accepted and gammas must be sequences of ints, one per round")
    if len(accepted) != len(gammas) or not len(accepted):
        raise ValueError(f"need one gamma per round and at least one round, got {len(accepted)} accepted counts and "
                         f"{len(gammas)} gammas")
    for r, (k, g) in enumerate(zip(accepted, gammas)):
        try:
            k, g = operator.index(k), operator.index(g)
        except TypeError:
            raise TypeError(f"round {r}: accepted and gamma must be ints, got {k!r} and {g!r}") from None
        if not (g >= 1 and 0 <= k <= g):
            raise ValueError(f"round {r}: need gamma >= 1 and 0 <= accepted <= gamma, got accepted={k!r}, gamma={g!r}")


def alpha_from_counts(accepted: int, rejections: int) -> float:
    """alpha = A / (A + R) from totals: A accepted drafts, R rounds that ended by a rejection (each tested one
    position more than it accepted). 1.0 when no round ended by a rejection."""
    if accepted < 0 or rejections < 0 or accepted + rejections == 0:
        raise ValueError(f"need accepted >= 0, rejections >= 0 and one tested position, got {accepted}, {rejections}")
    return accepted / (accepted + rejections)


def alpha_estimate(accepted: Sequence[int], gammas: Sequence[int]) -> float:
    """alpha = A / (A + R) from per-round counts (a fully accepted round tested all its drafts)."""
    _check_rounds(accepted, gammas)
    return alpha_from_counts(sum(accepted), sum(k < g for k, g in zip(accepted, gammas)))


def acceptance_metrics(accepted: Sequence[int], gammas: Sequence[int]) -> dict:
    """The three forms of acceptance from per-round counts (see the module's terms).

    Returns ``alpha``, ``draft_acceptance_rate``, ``mean_acceptance_length`` (tau) and ``per_position``
    (a list over positions 0..max(gammas)-1 of conditional rates; None where no round tested the position),
    plus ``rounds``, ``accepted`` and ``proposed``.
    """
    _check_rounds(accepted, gammas)
    A, proposed, rounds = sum(accepted), sum(gammas), len(accepted)
    per_position = []
    for i in range(max(gammas)):
        tested = sum(1 for k, g in zip(accepted, gammas) if g > i and k >= i)
        passed = sum(1 for k, g in zip(accepted, gammas) if g > i and k > i)
        per_position.append(passed / tested if tested else None)
    return {"alpha": alpha_estimate(accepted, gammas), "draft_acceptance_rate": A / proposed,
            "mean_acceptance_length": 1 + A / rounds, "per_position": per_position,
            "rounds": rounds, "accepted": A, "proposed": proposed}


def rate_from_alpha(alpha: float, gamma: int) -> float:
    """The draft acceptance rate alpha implies at gamma drafts per round: (E(alpha, gamma) - 1) / gamma."""
    check_positive_int(gamma, "gamma")
    return (expected_tokens_per_round(alpha, gamma) - 1) / gamma


def alpha_from_rate(rate: float, gamma: int) -> float:
    """The per-position alpha behind a draft acceptance rate measured at gamma drafts per round.

    Under the i.i.d. model a round accepts alpha + alpha^2 + ... + alpha^gamma drafts on average, so the rate
    is that sum over gamma; it increases with alpha from 0 (alpha = 0) to 1 (alpha = 1). Solve for alpha to
    within 1e-6 (bisection on [0, 1] is enough).
    """
    if not (0 <= rate <= 1 and gamma >= 1):
        raise ValueError(f"need 0 <= rate <= 1 and gamma >= 1, got rate={rate!r}, gamma={gamma!r}")
    ### BEGIN SOLUTION
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, gamma + 1)) / gamma < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
    ### END SOLUTION


def alpha_from_tau(tau: float, gamma: int) -> float:
    """The alpha whose E(alpha, gamma) is the mean acceptance length ``tau`` (1 <= tau <= gamma + 1)."""
    check_positive_int(gamma, "gamma")
    if not 1 <= tau <= gamma + 1:
        raise ValueError(f"tau must lie in [1, gamma + 1] = [1, {gamma + 1}], got {tau!r}")
    return _invert(lambda a: sum(a**i for i in range(gamma + 1)), tau)  # E as a sum: no cancellation near 1


def _invert(increasing, target: float) -> float:
    """The a in [0, 1] with increasing(a) = target, by bisection (to 1e-12; the ends exactly)."""
    if target <= increasing(0.0):
        return 0.0
    if target >= increasing(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if increasing(mid) < target else (lo, mid)
    return (lo + hi) / 2
