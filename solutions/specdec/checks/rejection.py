"""Hidden-test checks for notebook 03 (rejection sampling at one position)."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from specdec import rejection
from specdec.checks.core import CheckFailure, call, compare_cases, diagnose, expect_reproducible, single_threaded, upstream_note
from specdec.checks.seeds import salted
from specdec.checks.stats import compare_frequencies
from specdec.mistakes import for_exercise

_SEED = 3


def _fmt(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in t.tolist()) + "]"


def _pairs() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(description, p, q): the worked example, edge cases and random pairs (float64)."""
    d = torch.float64
    cases = [
        ("worked example", torch.tensor([0.6, 0.3, 0.1], dtype=d), torch.tensor([0.2, 0.5, 0.3], dtype=d)),
        ("p == q", torch.tensor([0.5, 0.25, 0.25], dtype=d), torch.tensor([0.5, 0.25, 0.25], dtype=d)),
        ("one-hot q at token 1 (a greedy or n-gram draft)", torch.tensor([0.2, 0.5, 0.3], dtype=d),
         torch.tensor([0.0, 1.0, 0.0], dtype=d)),
        ("p with zeros", torch.tensor([0.0, 0.7, 0.0, 0.3], dtype=d), torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=d)),
        ("one-hot p", torch.tensor([0.0, 0.0, 1.0], dtype=d), torch.tensor([0.3, 0.3, 0.4], dtype=d)),
        ("a token with p = q = 0 (top-k truncation)", torch.tensor([0.5, 0.5, 0.0], dtype=d),
         torch.tensor([0.3, 0.7, 0.0], dtype=d)),
    ]
    g = torch.Generator().manual_seed(salted(_SEED))
    for i in range(15):
        V = [2, 3, 5, 8, 20][i % 5]
        p = torch.softmax(2 * torch.randn(V, generator=g, dtype=d), 0)
        q = torch.softmax(2 * torch.randn(V, generator=g, dtype=d), 0)
        cases.append((f"random pair {i}", p, q))
    return cases


def _label(fn_name: str, desc: str, p: torch.Tensor, q: torch.Tensor, extra: str = "") -> str:
    return f"{fn_name}({desc}: p={_fmt(p)}, q={_fmt(q)}{extra})"


def check_acceptance_probability(fn: Callable) -> None:
    """Every token with q(y) > 0 of every pair."""
    cases = [(f"{desc}: p={_fmt(p)}, q={_fmt(q)}, y={y}", (p, q, y))
             for desc, p, q in _pairs() for y in range(len(q)) if q[y] > 0]
    tiny_p = torch.tensor([5e-13, 1 - 5e-13], dtype=torch.float64)
    tiny_q = torch.tensor([1e-12, 1 - 1e-12], dtype=torch.float64)
    cases.append(("p=[5e-13, 1 - 5e-13], q=[1e-12, 1 - 1e-12], y=0 (a tiny q(y) is still a q(y) > 0: the ratio is "
                  "0.5, no epsilon)", (tiny_p, tiny_q, 0)))
    compare_cases(fn, rejection.acceptance_probability, cases)


def _tensor_result(got, label: str, V: int) -> torch.Tensor:
    if not isinstance(got, torch.Tensor) or got.shape != (V,):
        raise CheckFailure(f"{label}: return a tensor of shape ({V},), got {got!r}")
    if torch.isnan(got).any():
        raise CheckFailure(f"{label}: the result contains NaN ({_fmt(got)}). Guard the 0/0 case.")
    if got.dtype != torch.float64:
        raise CheckFailure(f"{label}: return float64 (got {got.dtype}); exact distributions are computed in float64.")
    return got


def check_residual_distribution(fn: Callable) -> None:
    """Normalised, no NaN at p == q, p without the proposed token for a one-hot q; float32 inputs give float64."""
    d = torch.float64
    pairs = _pairs()
    pairs += [(f"{desc}, given as float32", p.float(), q.float()) for desc, p, q in pairs[:1] + pairs[-3:]]
    pairs += [  # the residual's two edge cases: a tiny mass is still a distribution; only exactly 0 falls back to p
        ("a residual of total mass 2e-10 (p and q differ in the tenth digit)",
         torch.tensor([0.5 + 1e-10, 0.5 - 1e-10], dtype=d), torch.tensor([0.5, 0.5], dtype=d)),
        ("q >= p everywhere by rounding (p != q, every p - q <= 0)",
         torch.tensor([0.5, 0.5], dtype=d), torch.tensor([0.5, 0.5 + 1e-7], dtype=d)),
    ]
    for desc, p, q in pairs:
        label = _label("residual_distribution", desc, p, q)
        got = _tensor_result(call(fn, label, p, q), label, len(p))
        expected = rejection.residual_distribution(p, q)
        if not torch.allclose(got, expected, atol=1e-9):
            tiny = float((p.double() - q.double()).clamp(min=0).sum())
            why = (f" The residual's mass is {tiny:.3g}: small, but not 0; normalise it (only a mass of exactly 0 "
                   "falls back to p)." if 0 < tiny < 1e-6 else "")
            raise CheckFailure(f"{label}: expected {_fmt(expected)}, got {_fmt(got)}.{why}"
                               + diagnose(for_exercise("residual_distribution"), [((p, q), got)]))


def check_output_paths(fn: Callable) -> None:
    """Both paths on every pair, and on float32 pairs (the paths are float64 all the same)."""
    pairs = _pairs()
    pairs += [(f"{desc}, given as float32", p.float(), q.float()) for desc, p, q in pairs[:1] + pairs[-3:]]
    for desc, p, q in pairs:
        label = _label("output_paths", desc, p, q)
        got = call(fn, label, p, q)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailure(f"{label}: return a tuple (accept_path, reject_path), got {type(got).__name__}")
        accept_path = _tensor_result(got[0], label + " accept_path", len(p))
        reject_path = _tensor_result(got[1], label + " reject_path", len(p))
        exp_accept, exp_reject = rejection.output_paths(p, q)
        for name, value, expected in (("accept_path", accept_path, exp_accept), ("reject_path", reject_path, exp_reject)):
            if not torch.allclose(value, expected, atol=1e-9):
                note = upstream_note(fn, [("residual_distribution", check_residual_distribution)])
                raise CheckFailure(f"{label}: {name} should be {_fmt(expected)}, got {_fmt(value)}."
                                   + (note or diagnose(for_exercise("output_paths"), [((p, q), got)])))


def check_acceptance_rate(fn: Callable) -> None:
    """sum min(p, q) on every pair."""
    compare_cases(fn, rejection.acceptance_rate, [(f"{desc}: p={_fmt(p)}, q={_fmt(q)}", (p, q)) for desc, p, q in _pairs()])


@single_threaded
def check_verify_token(fn: Callable, n: int = 8_000) -> None:
    """The accept test at chosen u (u = 0 included), then seeded Monte Carlo of the output."""
    rng = random.Random(salted(_SEED))
    for desc, p, q in _pairs():
        for y in range(len(q)):
            if q[y] <= 0:
                continue
            ratio = float(p[y]) / float(q[y])
            for u in (0.0, min(ratio, 1.0) * 0.999, min(ratio * 1.001, 0.999999), 0.5, 0.999999):
                label = _label("verify_token", desc, p, q, f", y={y}, u={u:.6g}")
                got = call(fn, label, p, q, y, u, torch.Generator().manual_seed(salted(rng.randrange(2**31))))
                if not (isinstance(got, tuple) and len(got) == 2):
                    raise CheckFailure(f"{label}: return (accepted, token), got {got!r}")
                if not (isinstance(got[0], bool) and isinstance(got[1], int) and not isinstance(got[1], bool)):
                    raise CheckFailure(f"{label}: return a bool and an int, got {type(got[0]).__name__} and "
                                       f"{type(got[1]).__name__} ({got!r}): bool(...) and int(...) around tensors.")
                accepted, token = bool(got[0]), int(got[1])
                should = u < ratio
                if accepted != should:
                    extra = (" u = 0 must not accept a token the target gives probability 0: use a strict u < p(y)/q(y)."
                             if u == 0 else " Accept exactly when u < p(y)/q(y).")
                    raise CheckFailure(f"{label}: p(y)/q(y) = {ratio:.6g}, so accepted should be {should}, "
                                       f"got {accepted}.{extra}")
                if accepted and token != y:
                    raise CheckFailure(f"{label}: an accepted draft outputs y = {y} itself, got {token}.")
                if not accepted and float(rejection.residual_distribution(p, q)[token]) <= 0:
                    raise CheckFailure(f"{label}: after a rejection the output {token} has residual probability 0; "
                                       f"the residual is {_fmt(rejection.residual_distribution(p, q))}. "
                                       "Draw from the residual max(p - q, 0) / sum, not from p or q.")
    desc, p, q = _pairs()[0]
    for y in range(len(q)):  # the draft token as torch.multinomial gives it: a 0-d long tensor; the token is an int
        label = _label("verify_token", desc, p, q, f", y=torch.tensor({y}), u=0.5")
        got = call(fn, label, p, q, torch.tensor(y), 0.5, torch.Generator().manual_seed(salted(y)))
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], bool) and isinstance(got[1], int)
                and not isinstance(got[1], bool)):
            raise CheckFailure(f"{label}: return (accepted, token), a bool and an int whatever the type of y, got "
                               f"{got!r}: int(y) when the draft is accepted.")
    for ratio_p, ratio_q in ((0.3, 0.7), (0.2, 0.3), (0.11, 0.13), (0.37, 0.41), (0.05, 0.9)):
        p = torch.tensor([ratio_p, 1 - ratio_p], dtype=torch.float64)
        q = torch.tensor([ratio_q, 1 - ratio_q], dtype=torch.float64)
        ratio = ratio_p / ratio_q
        for u, should in ((ratio * (1 - 1e-9), True), (ratio * (1 + 1e-9), False)):
            label = _label("verify_token", "u within 1e-9 of p(y)/q(y)", p, q, f", y=0, u={u!r}")
            got = call(fn, label, p, q, 0, u, torch.Generator().manual_seed(salted(0)))
            if not (isinstance(got, tuple) and len(got) == 2) or bool(got[0]) != should:
                raise CheckFailure(f"{label}: p(y)/q(y) = {ratio!r}, so accepted should be {should}, got "
                                   f"{got!r}. Compare in the precision you are given (float64 here): rounding u or "
                                   "the ratio to float32 (7 significant digits) flips decisions this close to the "
                                   "boundary." + diagnose(for_exercise("verify_token"), [((p, q, 0, u, None), got)]))
    g = torch.Generator().manual_seed(salted(_SEED))
    for desc, p, q in [_pairs()[i] for i in (0, 3, 5)]:
        label = _label("verify_token", desc, p, q, " with y ~ q and u ~ U[0, 1)")
        outputs = []
        ys = torch.multinomial(q, n, replacement=True, generator=g).tolist()
        us = torch.rand(n, generator=g, dtype=torch.float64).tolist()
        for y, u in zip(ys, us):
            outputs.append(int(call(fn, label, p, q, y, u, g)[1]))
        compare_frequencies(outputs, dict(enumerate(p.tolist())), label,
                            hint="After a rejection, draw from the residual max(p - q, 0) / sum, not from p or q.")
    wide_p = torch.full((40,), 1 / 40, dtype=torch.float64)
    wide_q = torch.zeros(40, dtype=torch.float64)
    wide_q[0] = 1.0  # y = 0 is rejected with u = 0.5, and the residual spreads over 39 tokens
    expect_reproducible(fn, "verify_token(p uniform over 40 tokens, q one-hot at y = 0, y=0, u=0.5, generator)",
                        lambda seed: (wide_p, wide_q, 0, 0.5, torch.Generator().manual_seed(salted(seed))), seeds=range(5))

