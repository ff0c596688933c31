"""Notebook 11, when speculation pays in a batch: gamma from measured acceptance and step costs.

Notebook 01's cost model with a batch: B decoding rows with gamma drafts each cost gamma
draft forwards over B tokens and one target forward over B * (gamma + 1) tokens, and
commit B * E(alpha, gamma) tokens. While a forward is memory bound its time hardly grows
with the tokens it carries, and speculation is nearly free; once the batch makes it
compute bound, every draft position costs as much as a real token and gamma -> 0.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Callable

from specdec.ledger import expected_tokens_per_round
from specdec.validate import check_positive_int, check_probability


def choose_gamma(alpha: float, batch_size: int, step_time: Callable[[int], float],
                 draft_step_time: Callable[[int], float], max_gamma: int) -> int:
    """The drafts per row, 0..max_gamma (0: speculation off), that maximise expected tokens/s.

    ``step_time(n)``: seconds of one target forward over n tokens; ``draft_step_time(n)``: one
    draft forward over n tokens. gamma drafts commit ``batch_size * E`` tokens with
    ``E = expected_tokens_per_round(alpha, gamma)`` (notebook 01) and cost
    ``gamma * draft_step_time(batch_size) + step_time(batch_size * (gamma + 1))`` seconds.
    Ties go to the smaller gamma.
    """
    check_probability(alpha, "alpha")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(max_gamma, "max_gamma", minimum=0)
    ### BEGIN SOLUTION
    best, best_rate = 0, -1.0
    for gamma in range(max_gamma + 1):
        seconds = gamma * draft_step_time(batch_size) + step_time(batch_size * (gamma + 1))
        rate = batch_size * expected_tokens_per_round(alpha, gamma) / seconds
        if rate > best_rate:
            best, best_rate = gamma, rate
    return best
    ### END SOLUTION


class StepCosts:
    """Measured forward times against the tokens a forward carries, linearly interpolated."""

    def __init__(self, counts: list[int], seconds: list[float]) -> None:
        if len(counts) != len(seconds) or len(counts) < 2 or counts != sorted(counts):
            raise ValueError("need at least two increasing token counts, one time each")
        self.counts, self.seconds = counts, seconds

    def __call__(self, n: int) -> float:
        c, s = self.counts, self.seconds
        if n <= c[0]:
            return s[0]
        i = min(bisect.bisect_left(c, n), len(c) - 1)  # the segment holding n; beyond the last count, the last one
        return s[i - 1] + (s[i] - s[i - 1]) * (n - c[i - 1]) / (c[i] - c[i - 1])

    @classmethod
    def measure(cls, forward: Callable[[int], object], counts: list[int], repeats: int = 5) -> StepCosts:
        """Time ``forward(n)`` for each count (median of ``repeats`` after a warm-up)."""
        seconds = []
        for n in counts:
            forward(n)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                forward(n)
                times.append(time.perf_counter() - start)
            seconds.append(sorted(times)[len(times) // 2])
        return cls(counts, seconds)

    def to_dict(self) -> dict:
        return {"counts": self.counts, "seconds": self.seconds}


def smoothed_alpha(accepted: float, tested: float, prior: float = 0.8, weight: int = 8) -> float:
    """alpha, the per-position acceptance E(alpha, gamma) takes: accepted drafts over tested positions (A / (A + R),
    R rounds ended by a rejection; see :mod:`specdec.metrics`), pulled toward ``prior`` while few positions were
    seen (``weight`` pseudo-positions). Not accepted / proposed: that rate falls with gamma at a fixed alpha."""
    return (accepted + prior * weight) / (tested + weight)


class BatchCosts:
    """Forward times on a grid of (rows, tokens per row), interpolated: a verify forward of B rows with
    gamma drafts each is ``costs(B, gamma + 1)``. Rows of one token each (decoding) and a few rows of many
    tokens cost differently for the same total (every row gathers its own context), so one token count is
    not enough to predict a batched verify."""

    def __init__(self, rows: list[int], per_row: list[int], seconds: list[list[float]]) -> None:
        if len(rows) < 2 or len(per_row) < 2 or rows != sorted(rows) or per_row != sorted(per_row):
            raise ValueError("need at least two increasing row counts and two increasing tokens-per-row counts")
        if len(seconds) != len(rows) or any(len(line) != len(per_row) for line in seconds):
            raise ValueError("seconds must have one line per row count, one value per tokens-per-row count")
        self.rows, self.per_row, self.seconds = rows, per_row, seconds
        self._lines = [StepCosts(per_row, line) for line in seconds]  # per row count: time against tokens per row

    def __call__(self, rows: int, per_row: float) -> float:
        times = StepCosts(self.rows, [line(per_row) for line in self._lines])
        return times(rows)

    def at_batch(self, rows: int) -> StepCosts:
        """Time against total tokens for a batch of ``rows`` rows: the step_time that choose_gamma takes."""
        return StepCosts([rows * k for k in self.per_row], [self(rows, k) for k in self.per_row])

    @classmethod
    def measure(cls, forward: Callable[[int, int], object], rows: list[int], per_row: list[int],
                repeats: int = 5) -> BatchCosts:
        """Time ``forward(rows, tokens_per_row)`` on the grid (median of ``repeats`` after a warm-up)."""
        seconds = []
        for r in rows:
            line = StepCosts.measure(lambda k, r=r: forward(r, k), per_row, repeats)
            seconds.append(line.seconds)
        return cls(rows, per_row, seconds)

    @classmethod
    def from_token_costs(cls, costs: StepCosts) -> BatchCosts:
        """Costs that depend on the total number of tokens only (for tests and what-ifs)."""
        rows = [1, max(costs.counts[-1], 2)]
        return cls(rows, [1, 2], [[costs(r), costs(2 * r)] for r in rows])

    def to_dict(self) -> dict:
        return {"rows": self.rows, "per_row": self.per_row, "seconds": self.seconds}


class GoodputGate:
    """Speculation's measured gain at the current batch size, and when to trust it over the cost model.

    What a speculating step costs is measured against a plain step taken at most ``pair_within`` steps apart at
    about the same batch size (so at nearly the same context and machine load: a paired measurement, like an
    interleaved benchmark): ``ratio`` = its seconds per row over the plain step's. What a round commits is
    measured over every speculating step (tokens per row per round at each gamma, ``tau``), since one step's
    count is mostly luck; until ``min_rounds`` rounds were seen at a gamma, ``E(alpha, gamma)`` stands in (it
    overestimates short rounds where the first draft is the hardest to accept). The gain is the median of
    ``tau / ratio`` over the recent pairs at this batch size. "auto" keeps the cost model's gamma unless the gain
    says otherwise by more than ``margin``, and every ``interval`` steps it probes the arm it is not using (the
    interval doubles after each probe, jumps to ``max_interval`` once the gain is beyond ``sure`` of 1, and
    starts again at ``probe_every`` when the batch size changes by more than a quarter)."""

    def __init__(self, margin: float = 0.05, sure: float = 0.25, probe_every: int = 16, max_interval: int = 256,
                 pair_within: int = 4, min_rounds: int = 16) -> None:
        self.margin, self.sure, self.probe_every, self.max_interval = margin, sure, probe_every, max_interval
        self.pair_within, self.min_rounds = pair_within, min_rounds
        self.tau: dict[int, tuple[float, float]] = {}  # gamma -> (tokens committed, rounds), decayed per record
        self.rows = 0  # the batch size the pairs were measured at
        self.pairs: list[tuple[int, float]] = []  # (gamma, seconds ratio) of the recent pairs
        # each arm's latest step: (step, gamma, seconds per row, paired already)
        self.last: dict[bool, tuple[int, int, float, bool] | None] = {True: None, False: None}
        self.interval = probe_every

    def _same_batch(self, rows: int) -> bool:
        return abs(rows - self.rows) <= self.rows / 4

    def record(self, step: int, rows: int, gamma: int, seconds: float, tokens: int, alpha: float) -> None:
        """A decode-only step of ``rows`` rows with ``gamma`` drafts each (0: plain) that took ``seconds`` and
        committed ``tokens``."""
        self.tau = {g: (0.99 * t, 0.99 * n) for g, (t, n) in self.tau.items()}
        if gamma:
            committed, rounds = self.tau.get(gamma, (0.0, 0.0))
            self.tau[gamma] = (committed + tokens, rounds + rows)
        if not self._same_batch(rows):
            self.rows, self.pairs, self.interval = rows, [], self.probe_every
            self.last = {True: None, False: None}
        speculating = gamma > 0
        other = self.last[not speculating]
        paired = other is not None and not other[3] and step - other[0] <= self.pair_within
        self.last[speculating] = (step, gamma, seconds / rows, paired)
        if paired:  # each step pairs once: with the other arm's latest, if that one has not been paired yet
            self.last[not speculating] = (*other[:3], True)
            spec, plain = self.last[True], self.last[False]
            self.pairs = self.pairs[-7:] + [(spec[1], spec[2] / plain[2])]
            if abs(self.gain(alpha) - 1) > self.sure:  # far from a tie: no need to look again soon
                self.interval = self.max_interval

    def tokens_per_round(self, alpha: float, gamma: int) -> float:
        committed, rounds = self.tau.get(gamma, (0.0, 0.0))
        return committed / rounds if rounds >= self.min_rounds else expected_tokens_per_round(alpha, gamma)

    def gain(self, alpha: float) -> float | None:
        """Measured throughput of speculation over plain decoding (None before the first pair)."""
        if not self.pairs:
            return None
        return statistics.median(self.tokens_per_round(alpha, g) / ratio for g, ratio in self.pairs)

    def decide(self, step: int, rows: int, alpha: float, model_gamma: int, fallback_gamma: int) -> int:
        """The gamma for "auto" rows this step: the model's, overruled by a measured gain beyond the margin,
        or a probe of the other arm (``fallback_gamma`` when the model says 0 and speculation is probed)."""
        gain = self.gain(alpha) if self._same_batch(rows) else None
        speculate = model_gamma > 0
        if gain is not None and abs(gain - 1) > self.margin:
            speculate = gain > 1
        other = self.last[not speculate] if self._same_batch(rows) else None
        if other is None or step - other[0] >= self.interval:
            speculate = not speculate
            if other is not None:
                self.interval = min(2 * self.interval, self.max_interval)
        return (model_gamma or fallback_gamma) if speculate else 0
