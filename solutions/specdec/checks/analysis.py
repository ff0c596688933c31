"""Hidden-test checks for notebook 09 (reading a benchmark)."""

from __future__ import annotations

import random
from collections.abc import Callable

from specdec import analysis as ref, metrics
from specdec.checks.core import CheckFailure, call, call_recorded, close, compare_cases, diagnose, fmt
from specdec.checks.seeds import salted
from specdec.mistakes import for_exercise
from specdec.recording import RoundStats


def _rounds_cases() -> list[tuple[str, tuple]]:
    rng = random.Random(salted(9))
    cases = [("[4, 4, 4], gamma=4: every draft accepted", ([4, 4, 4], 4)),
             ("[0, 0, 0], gamma=4: every first draft rejected", ([0, 0, 0], 4)),
             ("[1, 4, 0], gamma=4", ([1, 4, 0], 4)),
             ("[0, 1, 1, 0], gamma=1", ([0, 1, 1, 0], 1)),
             ("[2], gamma=6", ([2], 6))]
    for gamma in (3, 5, 8):
        accepted = [min(gamma, int(rng.expovariate(0.4))) for _ in range(40)]
        cases.append((f"40 rounds, gamma={gamma}: {accepted[:6]}...", (accepted, gamma)))
    for gamma in (1, 4, 8):  # rounds of a chain whose every position is accepted with probability 0.8
        accepted = [simulated_round(rng, 0.8, gamma) for _ in range(2000)]
        cases.append((f"2000 rounds simulated with alpha=0.8, gamma={gamma}: {accepted[:6]}...", (accepted, gamma)))
    return cases


def simulated_round(rng: random.Random, alpha: float, gamma: int) -> int:
    """Drafts accepted by one round of ``gamma`` drafts, each accepted with probability ``alpha`` until the first
    rejection."""
    k = 0
    while k < gamma and rng.random() < alpha:
        k += 1
    return k


def check_acceptance_from_rounds(fn: Callable) -> None:
    cases = _rounds_cases()
    compare_cases(fn, ref.acceptance_from_rounds, cases, rel=1e-9)
    for label, args in cases[:3]:
        got = call(fn, f"acceptance_from_rounds({label})", *args)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise CheckFailure(f"acceptance_from_rounds({label}): the right value, but as {type(got).__name__} "
                               f"({got!r}); the signature promises a float: float(...) of it.")


def check_alpha_from_rate(fn: Callable) -> None:
    """alpha back from the rate it implies, for alphas 0..1 (small ones too) at gamma 1..16, within 1e-6."""
    mistakes = for_exercise("alpha_from_rate")
    history: list = []
    cases = [(0.757, 4), (1.0, 4), (0.0, 3)]
    cases += [(metrics.rate_from_alpha(alpha, gamma), gamma)
              for alpha in (0.05, 0.15, 0.3, 0.6, 0.8, 0.89, 0.95, 0.999) for gamma in (1, 2, 4, 8, 16)]
    cases += [(0.999, 4), (0.9995, 2), (0.99999, 8)]  # rates just below 1: alpha is not 1 there
    rng = random.Random(salted(44))  # and inputs nobody can list in advance (a grading run salts the seed)
    cases += [(metrics.rate_from_alpha(round(rng.uniform(0.02, 0.98), 6), gamma), gamma)
              for gamma in (rng.randint(1, 16) for _ in range(8))]
    for rate, gamma in cases:
        label = f"alpha_from_rate(rate={rate:.6g}, gamma={gamma})"
        want = metrics.alpha_from_rate(rate, gamma)
        got = call_recorded(fn, label, (rate, gamma), mistakes, history)
        history.append(((rate, gamma), got))
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise CheckFailure(f"{label}: return a Python float, got {type(got).__name__} {got!r}")
        if not close(got, want, rel=0.0, abs_tol=1e-6):
            implied = metrics.rate_from_alpha(min(max(float(got), 0.0), 1.0), gamma)
            raise CheckFailure(f"{label}: expected alpha = {fmt(want)}, got {fmt(got)} (whose rate at gamma {gamma} "
                               f"would be {fmt(implied)}, not {rate:.6g})." + diagnose(mistakes, history, rel=1e-6))


def _round(proposed: int, accepted: int, draft_s: float, target_s: float) -> RoundStats:
    return RoundStats(proposed, accepted, accepted + 1, draft_s, target_s, 0, 0)


def check_measured_costs(fn: Callable) -> None:
    rng = random.Random(salted(3))
    cases = [("one round: 4 drafts in 0.8 ms, verify 3 ms; step 2 ms", [_round(4, 2, 0.0008, 0.003)], 0.002),
             ("two rounds of different lengths (a tree or lookup run)", [_round(4, 4, 0.0004, 0.002),
                                                                       _round(2, 0, 0.0006, 0.004)], 0.002)]
    rounds = [_round(g, rng.randint(0, g), g * rng.uniform(2e-4, 4e-4), rng.uniform(2e-3, 4e-3))
              for g in [rng.randint(1, 6) for _ in range(30)]]
    cases.append(("30 random rounds", rounds, 0.0025))
    cases.append(("three prompt-lookup rounds, one that proposed nothing (its verify forward still ran)",
                  [_round(3, 1, 0.0, 0.0025), _round(0, 0, 0.0, 0.0021), _round(2, 2, 0.0, 0.0024)], 0.002))
    cases.append(("three draft-model rounds; the second spent 0.0004 s drafting and proposed nothing (its seconds "
                  "count: c is all the draft's seconds over all the drafts proposed)",
                  [_round(3, 1, 0.0009, 0.0025), _round(0, 0, 0.0004, 0.0021), _round(2, 2, 0.0006, 0.0024)], 0.002))
    mistakes = for_exercise("measured_costs")
    history = []
    for desc, rounds, step in cases:
        label = f"measured_costs({desc}, target_step_s={step})"
        got = call(fn, label, rounds, step)
        want = ref.measured_costs(rounds, step)
        history.append(((rounds, step), got))
        if not isinstance(got, tuple):
            raise CheckFailure(f"{label}: return a tuple (c, verify_ratio), got {type(got).__name__} {got!r}")
        if not (len(got) == 2 and all(close(g, w, rel=1e-9) for g, w in zip(got, want))):
            raise CheckFailure(f"{label}: expected (c, verify_ratio) = ({fmt(want[0])}, {fmt(want[1])}), got {got!r}."
                               + diagnose(mistakes, history))


def check_predicted_speedup(fn: Callable) -> None:
    cases = [(f"a={a}, gamma={g}, c={c}" + (f", verify_ratio={v}" if v != 1.0 else ""), (a, g, c, v))
             for a, g, c, v in [(0.8, 4, 0.1, 1.0), (0.0, 3, 0.05, 1.0), (1.0, 5, 0.1, 1.0), (0.6, 1, 0.2, 1.0),
                                (0.9, 4, 0.12, 1.3), (1.0, 3, 0.0, 2.0), (0.75, 8, 0.02, 1.1),
                                (0.9995, 4, 0.05, 1.0), (0.99999, 8, 0.1, 1.0), (1, 2, 0.1, 1.0)]]
    rng = random.Random(salted(45))  # and inputs nobody can list in advance (a grading run salts the seed)
    for _ in range(8):
        a, g, c, v = round(rng.uniform(0, 1), 6), rng.randint(1, 16), round(rng.uniform(0, 0.5), 6), round(rng.uniform(0.8, 2), 3)
        cases.append((f"a={a}, gamma={g}, c={c}, verify_ratio={v}", (a, g, c, v)))
    compare_cases(fn, ref.predicted_speedup, cases, rel=1e-9)
    got = call(fn, "predicted_speedup(0.8, 4, 0.1) (verify_ratio left out)", 0.8, 4, 0.1)
    if not close(got, ref.predicted_speedup(0.8, 4, 0.1), rel=1e-9):
        raise CheckFailure("predicted_speedup(0.8, 4, 0.1): verify_ratio must default to 1.0 (verifying costs one step)")


def _rows(spec: list[tuple[str, str, int, float]]) -> list[dict]:
    return [{"task": t, "proposer": p, "gamma": g, "tokens_per_s": s} for t, p, g, s in spec]


def check_best_measured_gamma(fn: Callable) -> None:
    rows = _rows([("code", "draft", 1, 400.0), ("code", "draft", 2, 480.0), ("code", "draft", 4, 510.0),
                  ("code", "draft", 6, 505.0), ("math", "draft", 8, 720.0), ("math", "draft", 2, 600.0),
                  ("math", "draft", 6, 720.0), ("code", "lookup", 5, 900.0), ("code", "lookup", 1, 350.0),
                  ("math", "lookup", 2, 100.0), ("math", "lookup", 4, 90.0), ("math", "lookup", 6, 95.0),
                  ("agent", "draft", 3, 512.2), ("agent", "draft", 5, 512.4), ("agent", "draft", 7, 511.9),
                  ("code", "draft_undistilled", 3, 999.0), ("math", "draft_undistilled", 5, 999.0)])
    cases = [("code", "draft", 4), ("math", "draft", 6), ("code", "lookup", 5), ("math", "lookup", 2),
             ("agent", "draft", 5),  # 512.4 beats 512.2 by 0.2 tokens/s: compare the measured values, unrounded
             ("code", "draft_undistilled", 3)]  # "draft" is not "draft_undistilled": compare proposers whole
    mistakes = for_exercise("best_measured_gamma")
    history = []
    for task, proposer, want in cases:
        label = f"best_measured_gamma(rows, {task!r}, {proposer!r})"
        got = call(fn, label, rows, task, proposer)
        history.append(((rows, task, proposer), got))
        if got != want:
            mine = [(r["gamma"], r["tokens_per_s"]) for r in rows if r["task"] == task and r["proposer"] == proposer]
            raise CheckFailure(f"{label}: expected {want}, got {got!r}; the rows of this task and proposer, "
                               f"(gamma, tokens/s): {mine}." + diagnose(mistakes, history))
    rng = random.Random(salted(9))
    for k in range(20):  # random sweeps in random order, with ties and other tasks and proposers mixed in
        spec = [(rng.choice(["code", "math"]), rng.choice(["draft", "lookup"]), g, float(rng.choice([500, 510, 520, 530])))
                for g in rng.sample(range(1, 17), rng.randint(3, 9))]
        rows = _rows(spec)
        task, proposer = spec[0][0], spec[0][1]
        want = ref.best_measured_gamma(rows, task, proposer)
        label = f"best_measured_gamma(random rows {k}, {task!r}, {proposer!r})"
        got = call(fn, label, rows, task, proposer)
        history.append(((rows, task, proposer), got))
        if got != want:
            mine = sorted((r["gamma"], r["tokens_per_s"]) for r in rows if r["task"] == task and r["proposer"] == proposer)
            raise CheckFailure(f"{label}: expected {want}, got {got!r}; the rows of this task and proposer, (gamma, "
                               f"tokens/s): {mine}. The highest tokens/s wins; on a tie, the smaller gamma."
                               + diagnose(mistakes, history))


def check_code_vs_math(answer: object) -> None:
    if answer not in ("a", "b", "c", "d"):
        raise CheckFailure(f"CODE_VS_MATH must be one of 'a', 'b', 'c', 'd', got {answer!r}")
    if answer != "c":
        why = {"a": "both tasks use the same draft and target, so c is the same; the draft's cost does not differ",
               "b": "prompt length changes the prefill, which both runs pay; the gap shows in decode_speedup too",
               "d": "verification is exact for both tasks: identical outputs are checked in every row"}[answer]
        raise CheckFailure(f"CODE_VS_MATH = {answer!r} is not it: {why}.")
