"""Notebook 13, the knobs engines expose: a draft length per batch size, chosen once from a profile.

Instead of notebook 11's controller, which re-decides gamma every step, an engine can profile once: for
each batch size B and draft length K, the inter-token latency of a step, ``itl[B][K]`` (K = 0: speculation
off), and the per-position acceptance rates ``rates[i]``, accepted at position i over rounds (vLLM's
``acceptance_rates``: unconditional, so they fall with i). A round of K drafts commits on average
``1 + rates[0] + ... + rates[K - 1]`` tokens per row (mean acceptance length, the bonus or correction
included), so the goodput of K at B is that over ``itl[B][K]``, and the schedule keeps the best K per
profiled B. At serving time a batch of B rows takes the entry of the largest profiled batch size not above
B (the smallest profiled one if B is below them all). vLLM's dynamic speculative decoding manager works this
way (``DynamicSpeculativeConfig``'s ``batch_stats`` and ``acceptance_rate_per_pos``,
``vllm/v1/spec_decode/dynamic/manager.py``).

Do not feed it alpha ** i or the draft acceptance rate: the rates are already the probability that a row's
i-th draft survives, and multiplying them again double-counts the earlier rejections.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence


def check_profile(itl: Mapping[int, Mapping[int, float]], rates: Sequence[float]) -> None:
    if not itl:
        raise ValueError("itl is empty: profile at least one batch size")
    for b, row in itl.items():
        if not isinstance(b, int) or b < 1:
            raise ValueError(f"batch sizes must be ints >= 1, got {b!r}")
        if 0 not in row:
            raise ValueError(f"itl[{b}] has no K = 0 entry (speculation off), which every schedule compares with")
        for k, seconds in row.items():
            if not isinstance(k, int) or not 0 <= k <= len(rates):
                raise ValueError(f"itl[{b}] has K = {k!r}, outside 0..{len(rates)} (the positions with a rate)")
            if not (isinstance(seconds, float | int) and math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"itl[{b}][{k}] = {seconds!r} is not a positive time")
    for i, r in enumerate(rates):
        if not 0 <= r <= 1:
            raise ValueError(f"rates[{i}] = {r!r} is not a probability")
        if i and r > rates[i - 1] + 1e-12:
            raise ValueError(f"rates[{i}] = {r} exceeds rates[{i - 1}] = {rates[i - 1]}: unconditional per-position "
                             "rates cannot grow with the position (a draft survives only if the one before did)")


def k_schedule(itl: Mapping[int, Mapping[int, float]], rates: Sequence[float]) -> dict[int, int]:
    """The draft length with the highest goodput at each profiled batch size; ties go to the smaller K.

    itl[B][K]: seconds per step with B rows drafting K tokens each (K = 0 required); rates[i]: the fraction of
    rounds whose draft i + 1 was accepted."""
    check_profile(itl, rates)
    ### BEGIN SOLUTION
    schedule = {}
    for b, row in itl.items():
        best_k, best = 0, -1.0
        for k in sorted(row):
            goodput = (1 + sum(rates[:k])) / row[k]  # tokens per row per second
            if goodput > best:
                best_k, best = k, goodput
        schedule[b] = best_k
    return dict(sorted(schedule.items()))
    ### END SOLUTION


def lookup_k(schedule: Mapping[int, int], batch_size: int) -> int:
    """The scheduled K for a batch of ``batch_size`` rows: the entry of the largest profiled batch size not
    above it, or of the smallest profiled one."""
    if not schedule:
        raise ValueError("the schedule is empty")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    ### BEGIN SOLUTION
    sizes = sorted(schedule)
    i = bisect.bisect_right(sizes, batch_size) - 1
    return schedule[sizes[max(i, 0)]]
    ### END SOLUTION


def profile_from_grid(target_s: Sequence[Sequence[float]], draft_s: Sequence[Sequence[float]], rows: Sequence[int],
                      per_row: Sequence[int], overhead_s: float = 0.0) -> dict[int, dict[int, float]]:
    """itl[B][K] from notebook 11's forward-cost grid (seconds[rows index][per_row index], ``per_row`` = K + 1):
    K draft forwards of one token per row, then one target forward of K + 1 per row, plus ``overhead_s``."""
    itl: dict[int, dict[int, float]] = {}
    for i, b in enumerate(rows):
        itl[b] = {}
        for j, width in enumerate(per_row):
            k = width - 1
            itl[b][k] = k * draft_s[i][0] + target_s[i][j] + overhead_s
    return itl
