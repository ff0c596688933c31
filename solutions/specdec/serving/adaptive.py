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

import torch

from specdec.ledger import expected_tokens_per_round
from specdec.models.devices import synchronize
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
    def measure(cls, forward: Callable[[int], object], counts: list[int], repeats: int = 5,
                device: torch.device | str = "cpu") -> StepCosts:
        """Time ``forward(n)`` for each count (median of ``repeats`` after a warm-up); ``device``: where the forward
        runs, waited for before each clock read (on a GPU the forward's kernels run after it returns)."""
        seconds = []
        for n in counts:
            forward(n)
            times = []
            for _ in range(repeats):
                synchronize(device)
                start = time.perf_counter()
                forward(n)
                synchronize(device)
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
                repeats: int = 5, device: torch.device | str = "cpu") -> BatchCosts:
        """Time ``forward(rows, tokens_per_row)`` on the grid (median of ``repeats`` after a warm-up), waiting for
        ``device`` before each clock read (:meth:`StepCosts.measure`)."""
        seconds = []
        for r in rows:
            line = StepCosts.measure(lambda k, r=r: forward(r, k), per_row, repeats, device)
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

    What speculating costs is measured by pairing a step in which every row drafts with plain steps taken at most
    ``pair_within`` steps before it at about the same batch size, or a plain step with such speculating steps (so at
    nearly the same context and machine load: a paired measurement, like an interleaved benchmark): ``ratio`` = its
    seconds per row over the median of theirs (one slow step, a garbage collection say, does not make a pair; a
    ratio is at least 1: a step that drafts does all a plain step does and more, so less is noise). What a round
    commits is measured over every row that drafted (tokens per row per round at each gamma, ``tau``), since one
    step's count is mostly luck; until ``min_rounds`` rounds were seen at a gamma, ``E(alpha, gamma)`` stands in
    (it overestimates short rounds where the first draft is the hardest to accept). The gain is the median of
    ``tau / ratio`` over the recent pairs at this batch size. "auto" keeps the cost model's gamma unless the gain
    says otherwise by more than ``margin``, and every ``interval`` steps it probes the arm it is not using (the
    interval doubles after each probe, jumps to ``max_interval`` once three pairs or more put the gain beyond
    ``sure`` of 1, and starts again at ``probe_every`` when the batch size changes by more than a quarter).

    Probing speculation while plain decoding wins has a price beyond the step: the draft first reads every token
    it skipped, for every row (about what the draft costs per token, for all the tokens since the last probe,
    whatever the interval). So once two pairs have measured the cost at this batch size, such a probe drafts for
    one row in ``probe_share`` only (the rows the draft is closest to): it refreshes ``tau``, the acceptance side,
    for a fraction of the catch-up; the cost side is measured again by a probe of every row once the newest pair
    is ``max_interval`` steps old.

    What was measured at a batch size is kept when the batch moves on (a book per batch size) and taken up again
    when it comes back within a quarter, so a server whose batch swings between sizes does not learn each one
    anew. A gate outlives an engine: a new engine given the same gate (``ServingEngine(gate=...)``, the same
    target and draft on the same machine) calls :meth:`start_engine` and goes on from what the gate knows, as a
    long-lived server would, instead of paying for its first probes again.
    """

    def __init__(self, margin: float = 0.05, sure: float = 0.25, probe_every: int = 16, max_interval: int = 256,
                 pair_within: int = 4, min_rounds: int = 16, probe_share: int = 8) -> None:
        self.margin, self.sure, self.probe_every, self.max_interval = margin, sure, probe_every, max_interval
        self.pair_within, self.min_rounds, self.probe_share = pair_within, min_rounds, probe_share
        self.tau: dict[int, tuple[float, float]] = {}  # gamma -> (tokens committed, rounds), decayed per record
        self._new_book(0)
        self.shelf: dict[int, tuple] = {}  # batch size -> its book (pairs, recent, probed, interval) while away
        self.clock = -1  # the latest step seen, on the gate's clock (an engine's steps plus its offset)
        self.offset = 0  # added to the steps of the engine that uses the gate now

    def _new_book(self, rows: int) -> None:
        """Nothing measured yet at ``rows`` rows."""
        self.rows = rows  # the batch size the pairs were measured at
        self.pairs: list[tuple[int, float, int]] = []  # (gamma, seconds ratio, step) of the recent pairs
        # each arm's recent steps: (step, gamma, seconds per row, paired already); a step in which only some rows
        # drafted is neither arm's
        self.recent: dict[bool, list[tuple[int, int, float, bool]]] = {True: [], False: []}
        self.probed = -1  # the step of the latest probe of speculation on a share of the rows
        self.interval = self.probe_every

    @staticmethod
    def _near(rows: int, anchor: int) -> bool:
        """``rows`` is about the batch size ``anchor`` (within a quarter of it)."""
        return abs(rows - anchor) <= anchor / 4

    def start_engine(self) -> None:
        """A new engine takes the gate over: its step 0 comes after every step seen, with a gap wide enough that no
        step of the new engine pairs with one of an old engine (another batch, another context)."""
        self.offset = self.clock + self.pair_within + 1

    def _tick(self, step: int) -> int:
        step += self.offset
        self.clock = max(self.clock, step)
        return step

    def _switch(self, rows: int) -> None:
        """Shelve the book of the batch size measured so far; take up the book kept nearest to ``rows`` (within a
        quarter), or start an empty one."""
        if self.rows and (self.pairs or self.recent[True] or self.recent[False]):
            self.shelf[self.rows] = (self.pairs, self.recent, self.probed, self.interval)
        near = [r for r in self.shelf if self._near(rows, r)]
        if near:
            self.rows = min(near, key=lambda r: abs(rows - r))
            self.pairs, self.recent, self.probed, self.interval = self.shelf.pop(self.rows)
        else:
            self._new_book(rows)

    def _same_batch(self, rows: int) -> bool:
        return self._near(rows, self.rows)

    def record(self, step: int, rows: int, gamma: int, seconds: float, tokens: int, alpha: float,
               drafting: int | None = None) -> None:
        """A decode-only step of ``rows`` rows, ``drafting`` of them (all by default) with ``gamma`` drafts each
        (0: plain), that took ``seconds``; the drafting rows committed ``tokens``."""
        step = self._tick(step)
        self.tau = {g: (0.99 * t, 0.99 * n) for g, (t, n) in self.tau.items()}
        drafting = rows if drafting is None else drafting
        if gamma and drafting:
            committed, rounds = self.tau.get(gamma, (0.0, 0.0))
            self.tau[gamma] = (committed + tokens, rounds + drafting)
        if not self._same_batch(rows):
            self._switch(rows)
        if gamma and drafting < rows:  # a probe on a share of the rows: acceptance only
            self.probed = step
            return
        speculating = gamma > 0
        # each step pairs once: with the other arm's steps of the last pair_within steps that have not paired yet
        others = [o for o in self.recent[not speculating] if step - o[0] <= self.pair_within and not o[3]]
        mine = (step, gamma, seconds / rows, bool(others))
        self.recent[speculating] = self.recent[speculating][-3:] + [mine]
        if others:
            self.recent[not speculating] = [(*o[:3], True) for o in self.recent[not speculating]]
            other = statistics.median(o[2] for o in others)
            spec, plain = (mine[2], other) if speculating else (other, mine[2])
            drafts = gamma if speculating else others[-1][1]
            self.pairs = self.pairs[-7:] + [(drafts, max(spec / plain, 1.0), step)]
            if len(self.pairs) >= 3 and abs(self.gain(alpha) - 1) > self.sure:  # far from a tie: look again later
                self.interval = self.max_interval

    def tokens_per_round(self, alpha: float, gamma: int) -> float:
        committed, rounds = self.tau.get(gamma, (0.0, 0.0))
        return committed / rounds if rounds >= self.min_rounds else expected_tokens_per_round(alpha, gamma)

    def gain(self, alpha: float) -> float | None:
        """Measured throughput of speculation over plain decoding (None before the first pair)."""
        if not self.pairs:
            return None
        return statistics.median(self.tokens_per_round(alpha, g) / ratio for g, ratio, _ in self.pairs)

    def decide(self, step: int, rows: int, alpha: float, model_gamma: int, fallback_gamma: int) -> tuple[int, int]:
        """The gamma for "auto" rows this step and how many of the ``rows`` rows draft: the model's gamma,
        overruled by a measured gain beyond the margin, or a probe of the other arm (``fallback_gamma`` when the
        model says 0 and speculation is probed)."""
        step = self._tick(step)
        if not self._same_batch(rows):
            self._switch(rows)
        gain = self.gain(alpha)
        speculate = model_gamma > 0
        if gain is not None and abs(gain - 1) > self.margin:
            speculate = gain > 1
        other = self.recent[not speculate]
        latest = max(other[-1][0] if other else -1, self.probed if not speculate else -1)
        if latest < 0 or step - latest >= self.interval:
            if latest >= 0:
                self.interval = min(2 * self.interval, self.max_interval)
            if not speculate and len(self.pairs) >= 2 and step - self.pairs[-1][2] < self.max_interval:
                return model_gamma or fallback_gamma, max(1, -(-rows // self.probe_share))
            speculate = not speculate
        return (model_gamma or fallback_gamma) if speculate else 0, rows
