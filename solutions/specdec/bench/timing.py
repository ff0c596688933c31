"""Timings that survive a busy machine: methods interleaved across repeats, medians with their spread,
and a warning (printed and recorded) when the machine was busy or the repeats disagree.

A benchmark that times method A five times and then method B five times turns a slow minute of the
machine into a speedup. Interleaving (every method once per repeat, the order rotated each repeat) puts a
slow stretch on every method alike, and the ratio of two medians from the same interleaved run is then a
fair figure; the spread (max - min) / median says how far to trust it.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from collections.abc import Iterator, Sequence
from typing import TypeVar

#: Repeats whose spread exceeds this fraction of the median get a warning.
SPREAD_LIMIT = 0.10

Method = TypeVar("Method")


def interleaved(methods: Sequence[Method], repeats: int) -> Iterator[tuple[int, Method]]:
    """(repeat, method) for every method once per repeat, the order rotated by one each repeat."""
    methods = list(methods)
    for repeat in range(repeats):
        shift = repeat % len(methods)
        for method in methods[shift:] + methods[:shift]:
            yield repeat, method


def spread(values: Sequence[float]) -> dict:
    """median, min, max and spread = (max - min) / median of one method's repeats."""
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / median if median else 0.0}


def median_interval(values: Sequence[float], confidence: float = 0.9) -> tuple[float, float]:
    """A distribution-free interval for the median of what ``values`` sample: the k-th smallest and k-th largest
    value, k the largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (at least that confidence; with
    five values the interval is min-max, 94%). Too few values for the confidence: min-max."""
    ordered, n = sorted(values), len(values)
    k, below = 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2 ** n
        if below > (1 - confidence) / 2:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


class LoadWatch:
    """Samples the 1-minute load average while a benchmark runs and turns it, with the spreads of its
    repeats, into warnings: a load above the benchmark's own threads (plus half a core of slack) means
    other work shared the cores, and a spread above SPREAD_LIMIT means the repeats disagree."""

    def __init__(self, threads: int) -> None:
        self.threads, self.samples = threads, []

    def sample(self) -> None:
        self.samples.append(round(os.getloadavg()[0], 2))

    def warnings(self, spreads: dict[str, float]) -> list[str]:
        out = []
        if self.samples and max(self.samples) > self.threads + 0.5:
            out.append(f"the machine was busy: load average up to {max(self.samples):.1f} while this benchmark used "
                       f"{self.threads} thread(s) on {os.cpu_count()} cores; its times are not figures to quote")
        wide = {name: s for name, s in spreads.items() if s > SPREAD_LIMIT}
        if wide:
            worst = max(wide, key=wide.get)
            out.append(f"{len(wide)} of {len(spreads)} measurements spread more than {SPREAD_LIMIT:.0%} across repeats "
                       f"(worst: {worst}, {wide[worst]:.0%}); rerun on a quiet machine or with more repeats")
        return out

    def report(self, spreads: dict[str, float], stream=sys.stderr) -> dict:
        """The record for a benchmark's JSON; prints each warning to ``stream``."""
        warnings = self.warnings(spreads)
        for line in warnings:
            print(f"warning: {line}", file=stream)
        return {"threads": self.threads, "cpu_count": os.cpu_count(), "load_average": self.samples,
                "max_spread": round(max(spreads.values(), default=0.0), 4), "warnings": warnings}
