"""Seeded Monte Carlo comparisons of a sampler against its exact distribution.

Tolerance: n independent draws give each outcome's count c ~ Binomial(n, pi). We accept
|c/n - pi| <= 5 * sqrt(pi (1 - pi) / n) + 1/n for every outcome, and reject at once any
outcome of probability 0. For a correct sampler a 5-sigma excursion in one cell has
probability about 6e-7 (normal approximation), so with at most a few hundred cells a
false failure has probability below 1e-3 even if a learner consumes random numbers
differently from the reference; with a fixed seed each implementation always gets the
same verdict (no flaky tests). The mistakes these checks must catch move some outcome by
far more than 5 sigma at the sample sizes used (the test suite proves it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable

from specdec.checks.core import CheckFailure

SIGMAS = 5.0
#: Early looks (see sample_and_compare) fail only beyond this many sigmas: a correct sampler never gets there.
EARLY_SIGMAS = 10.0
EARLY_LOOKS = (1 / 8, 1 / 4, 1 / 2)


def compare_frequencies(
    samples: Iterable[Hashable], expected: dict[Hashable, float], label: str, hint: str = "", sigmas: float = SIGMAS
) -> None:
    """Fail unless the samples' frequencies match ``expected`` within the tolerance above."""
    counts = Counter(samples)
    n = sum(counts.values())
    if n == 0:
        raise CheckFailure(f"{label}: no samples")
    for outcome, count in counts.items():
        if expected.get(outcome, 0.0) <= 0.0:
            raise CheckFailure(
                f"{label}: produced {outcome!r} ({count} of {n} runs), which has probability 0 under the exact "
                f"distribution.{(' ' + hint) if hint else ''}"
            )
    worst = None
    for outcome, pi in expected.items():
        freq = counts.get(outcome, 0) / n
        tolerance = sigmas * math.sqrt(pi * (1 - pi) / n) + 1 / n
        excess = abs(freq - pi) / tolerance
        if excess > 1 and (worst is None or excess > worst[0]):
            worst = (excess, outcome, freq, pi, tolerance)
    if worst:
        _, outcome, freq, pi, tolerance = worst
        raise CheckFailure(
            f"{label}: outcome {outcome!r} came up with frequency {freq:.4f} in {n} seeded runs; the exact probability "
            f"is {pi:.4f} (tolerance ±{tolerance:.4f}, {sigmas:g} sigma). The output does not follow the target distribution."
            f"{(' ' + hint) if hint else ''}"
        )


def sample_and_compare(draw: Callable[[], Hashable], n: int, expected: dict[Hashable, float], label: str,
                       hint: str = "") -> None:
    """compare_frequencies on ``n`` calls of ``draw``, looking early so that a wrong sampler fails fast: an outcome
    of probability 0 fails at once, and at n/8, n/4 and n/2 draws a frequency beyond EARLY_SIGMAS fails there.
    A correct sampler passes the early looks (a 10-sigma excursion has probability about 1e-23), so its verdict is
    the one at n draws, as with compare_frequencies."""
    looks = {max(1, int(n * f)) for f in EARLY_LOOKS}
    samples = []
    for i in range(1, n + 1):
        sample = draw()
        samples.append(sample)
        if expected.get(sample, 0.0) <= 0.0 or i in looks:
            compare_frequencies(samples, expected, label, hint, sigmas=SIGMAS if i == n else EARLY_SIGMAS)
    compare_frequencies(samples, expected, label, hint)
