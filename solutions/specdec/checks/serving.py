"""Checks for notebook 11 (speculation in a serving engine): random block tables, ragged batches,
rounds with stops inside the drafts, schedules with preemption, and cost curves."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from specdec.checks.core import (
    CheckFailure,
    call_recorded,
    compare_cases,
    diagnose,
    fmt,
    not_implemented,
    upstream_note,
    where_lists_differ,
)
from specdec.checks.seeds import salted
from specdec.ledger import expected_tokens_per_round
from specdec.mistakes import Mistake, for_exercise
from specdec.params import StopCriteria, accept_until_stop
from specdec.serving.adaptive import StepCosts, choose_gamma
from specdec.serving.blocks import blocks_for, release_slots, reserve_slots, slot_mapping
from specdec.serving.commit import commit_round
from specdec.serving.scheduler import schedule_step
from specdec.serving.sequence import Seq, SeqStatus

Outcome = tuple[tuple[str, Any], ...]


def _snapshot(fn: Callable, outcome: Callable[[tuple, Any], Outcome]) -> Callable[..., Outcome]:
    """fn run on deep copies of its arguments; returns what the call returned and left behind, by name."""
    def run(*args: Any) -> Outcome:
        copies = copy.deepcopy(args)
        return outcome(copies, fn(*copies))
    return run


def _compare_in_place(fn: Callable, reference: Callable, cases: Iterable[tuple[str, tuple]],
                      outcome: Callable[[tuple, Any], Outcome], requires=()) -> int:
    """Like compare_cases for functions that change their arguments in place: the return value and the
    arguments afterwards must equal the reference's, on every case."""
    name = reference.__name__
    mistakes = [Mistake(m.exercise, m.name, _snapshot(m.fn, outcome), m.hint) for m in for_exercise(name)]
    learner, expected_of = _snapshot(fn, outcome), _snapshot(reference, outcome)
    history: list[tuple[tuple, Any]] = []
    for count, (description, args) in enumerate(cases):
        label = f"{name}({description})"
        expected = expected_of(*args)
        got = call_recorded(learner, label, args, mistakes, history, requires, rel=0.0, named=fn,
                            changes_inputs=True)
        history.append((args, got))
        if got != expected:
            wrong = [f"{what} should be {fmt(want)}, got {fmt(have)}" for (what, want), (_, have) in zip(expected, got)
                     if want != have]
            note = upstream_note(fn, requires)
            hint = "" if note else diagnose(mistakes, history, rel=0.0)
            raise CheckFailure(f"{label}: " + "; ".join(wrong) + f".{hint}{note}")
    return count + 1


# ---- blocks ---------------------------------------------------------------------------------
def _table_outcome(args: tuple, returned: Any) -> Outcome:
    free, table = args[0], args[1]
    return (("the return value", returned), ("block_table afterwards", list(table)), ("free_blocks afterwards", list(free)))


def _release_outcome(args: tuple, returned: Any) -> Outcome:
    free, table = args[0], args[1]
    return (("the return value", returned), ("block_table afterwards", list(table)),
            ("free_blocks afterwards (in any order)", sorted(free)))


def _table_cases(seed: int, keep: bool) -> list[tuple[str, tuple]]:
    """Random pools, tables and slot counts, often on a block boundary (k * block_size and one either side)."""
    rng = random.Random(salted(seed))
    cases = []
    for _ in range(160):
        block_size = rng.choice([1, 2, 3, 4, 8, 16])
        ids = rng.sample(range(40), 14)
        held = rng.randrange(0, 6)
        table, free = ids[:held], ids[held : held + rng.randrange(0, 9)]
        k = rng.randrange(0, held + len(free) + 3)
        num = max(k * block_size + rng.choice([-1, 0, 0, 1, rng.randrange(block_size)]), 0)
        what = "num_kept" if keep else "num_slots"
        cases.append((f"free_blocks={free}, block_table={table}, {what}={num}, block_size={block_size}",
                      (free, table, num, block_size)))
    return cases


def check_reserve_slots(fn: Callable) -> None:
    fixed = [("free_blocks=[9, 8, 7, 6], block_table=[], num_slots=5, block_size=4", ([9, 8, 7, 6], [], 5, 4)),
             ("free_blocks=[9, 8], block_table=[3, 4], num_slots=12, block_size=4", ([9, 8], [3, 4], 12, 4)),
             ("free_blocks=[9, 8], block_table=[3], num_slots=12, block_size=4", ([9, 8], [3], 12, 4)),
             ("free_blocks=[9], block_table=[3], num_slots=12, block_size=4", ([9], [3], 12, 4))]
    _compare_in_place(fn, reserve_slots, fixed + _table_cases(seed=salted(11), keep=False), _table_outcome)


def check_release_slots(fn: Callable) -> None:
    fixed = [("free_blocks=[1], block_table=[5, 6, 7], num_kept=5, block_size=4", ([1], [5, 6, 7], 5, 4)),
             ("free_blocks=[], block_table=[5, 6, 7], num_kept=0, block_size=4", ([], [5, 6, 7], 0, 4))]
    _compare_in_place(fn, release_slots, fixed + _table_cases(seed=salted(12), keep=True), _release_outcome)


def _mapping_cases() -> list[tuple[str, tuple]]:
    rng = random.Random(salted(13))
    cases = []
    for _ in range(120):
        block_size = rng.choice([1, 2, 4, 5, 16])
        rows = rng.randrange(1, 5)
        ids = rng.sample(range(60), 60)
        tables, starts, counts = [], [], []
        for _ in range(rows):
            start = rng.randrange(0, 3 * block_size + 2)
            count = rng.randrange(0, 2 * block_size + 2)
            n_blocks = blocks_for(start + count, block_size) + rng.randrange(0, 2)
            tables.append([ids.pop() for _ in range(n_blocks)])
            starts.append(start)
            counts.append(count)
        cases.append((f"block_tables={tables}, starts={starts}, counts={counts}, block_size={block_size}",
                       (tables, starts, counts, block_size)))
    return cases


def check_slot_mapping(fn: Callable) -> None:
    mistakes, history = for_exercise("slot_mapping"), []
    for description, args in _mapping_cases():
        label = f"slot_mapping({description})"
        expected = slot_mapping(*args)
        try:
            got = fn(*copy.deepcopy(args))
        except NotImplementedError as err:
            raise not_implemented(fn, label, err) from None
        except Exception as err:
            history.append((args, err))
            raise CheckFailure(f"{label} raised {type(err).__name__}: {err}.{diagnose(mistakes, history, rel=0.0)}") from None
        if not isinstance(got, torch.Tensor) or got.is_floating_point() or got.dim() != 1:
            raise CheckFailure(f"{label}: return a 1-D integer tensor (int64), got {got!r}")
        history.append((args, got))
        if not torch.equal(got.long(), expected):
            where = ""
            if got.shape == expected.shape:
                i = int((got.long() != expected).nonzero()[0])
                row = next(b for b in range(len(args[2])) if i < sum(args[2][: b + 1]))
                where = f" The first wrong one is token {i} (row {row}): slot {int(expected[i])}, yours {int(got[i])}."
            raise CheckFailure(f"{label}: expected {expected.tolist()}, got {got.tolist()}.{where}"
                               f"{diagnose(mistakes, history, rel=0.0)}")
        if got.dtype != torch.int64:
            raise CheckFailure(f"{label}: the right slots, but as {got.dtype}; the statement asks for int64 (the "
                               "dtype the attention kernels index the cache with).")


# ---- commit_round ---------------------------------------------------------------------------
def _commit_outcome(args: tuple, returned: Any) -> Outcome:
    seqs = args[0]
    return (("the emitted tokens", returned), ("output", [s.output for s in seqs]),
            ("status", [s.status.name if isinstance(s.status, SeqStatus) else s.status for s in seqs]),
            ("num_computed", [s.num_computed for s in seqs]),
            ("draft_computed", [s.draft_computed for s in seqs]))


def _random_row(rng: random.Random, seq_id: int) -> tuple[Seq, list[int], int]:
    vocab = 6
    while True:
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
        output = [rng.randrange(vocab) for _ in range(rng.randrange(0, 5))]
        stop_ids = tuple(rng.sample(range(vocab), rng.randrange(0, 2)))
        sequences = tuple(tuple(rng.randrange(vocab) for _ in range(rng.randrange(2, 4))) for _ in range(rng.randrange(0, 2)))
        stop = StopCriteria(len(output) + rng.randrange(1, 7), stop_ids, sequences)
        if not output or not accept_until_stop([], output, StopCriteria(10**6, stop_ids, sequences))[1]:
            break
    gamma = rng.choice([0, 1, 2, 3, 4, 5])
    committed = [rng.randrange(vocab) for _ in range(rng.randrange(1, gamma + 2))]
    P = len(prompt) + len(output)
    seq = Seq(seq_id, prompt, stop, output=output, num_computed=P - 1, draft_computed=rng.randrange(max(P - 3, 0), P),
              status=SeqStatus.WAITING if seq_id == 3 else SeqStatus.RUNNING)  # a status commit_round must leave alone
    return seq, committed, gamma


def check_commit_round(fn: Callable) -> None:
    rng = random.Random(salted(14))
    cases = []
    for _ in range(150):
        rows = [_random_row(rng, i) for i in range(rng.randrange(1, 6))]
        seqs, committed, gammas = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
        description = "; ".join(
            f"row {s.seq_id}: P={s.num_tokens}, output={s.output}, max_tokens={s.stop.max_tokens}, "
            f"stop_token_ids={list(s.stop.stop_token_ids)}, stop_sequences={[list(q) for q in s.stop.stop_sequences]}, "
            f"draft_computed={s.draft_computed}, status={s.status.name}, gamma={g}, committed={c}"
            for s, c, g in zip(seqs, committed, gammas))
        cases.append((description, (seqs, committed, gammas)))
    _compare_in_place(fn, commit_round, cases, _commit_outcome)


# ---- schedule_step --------------------------------------------------------------------------
def _named(x: Any, given: list[Seq]) -> str:
    """A returned request as the learner should see it: Seq#3 if it is one of the requests passed in."""
    if any(x is s for s in given):
        return repr(x)
    if isinstance(x, Seq):
        return f"a copy of {x!r} (return the request passed in)"
    return f"{x!r} (not a Seq: return the request itself, not its id)"


def _schedule_outcome(args: tuple, returned: Any) -> Outcome:
    running, waiting = args[0], args[1]
    given = running + waiting
    scheduled = returned[0] if isinstance(returned, tuple) else returned
    preempted = returned[1] if isinstance(returned, tuple) and len(returned) > 1 else None
    if isinstance(scheduled, dict):
        scheduled = {_named(k, given): v for k, v in scheduled.items()}
    if isinstance(preempted, (list, tuple)):
        preempted = [_named(x, given) for x in preempted]
    return (("the schedule {seq: tokens}", scheduled), ("the preempted requests", preempted),
            ("running afterwards (do not change the lists)", [s.seq_id for s in running]),
            ("waiting afterwards", [s.seq_id for s in waiting]),
            ("the requests afterwards (do not change them)",
             [(s.num_computed, len(s.block_table), s.lookahead, s.status) for s in given]))


def _describe(seqs: list[Seq]) -> str:
    return "[" + ", ".join(f"#{s.seq_id}(tokens={s.num_tokens}, computed={s.num_computed}, lookahead={s.lookahead}, "
                           f"blocks={len(s.block_table)})" for s in seqs) + "]"


def _schedule_cases() -> list[tuple[str, tuple]]:
    rng = random.Random(salted(15))
    long_prompt = Seq(7, [1] * 50, StopCriteria(99))
    cases = [("running=[], waiting=[#7(tokens=50, computed=0)], token_budget=16, num_free_blocks=100, block_size=4",
              ([], [long_prompt], 16, 100, 4))]
    for _ in range(400):
        block_size = rng.choice([2, 4, 8])
        ids = iter(rng.sample(range(100), 10))
        block_ids = iter(range(1000))
        running, waiting = [], []
        for _ in range(rng.randrange(0, 6)):
            prompt, output = [1] * rng.randrange(1, 30), [2] * rng.randrange(0, 8)
            seq = Seq(next(ids), prompt, StopCriteria(99), output=output, status=SeqStatus.RUNNING)
            decoding = rng.random() < 0.7
            seq.num_computed = seq.num_tokens - 1 if decoding else rng.randrange(0, seq.num_tokens - 1 or 1)
            seq.lookahead = rng.randrange(0, 5) if decoding else 0
            seq.block_table = [next(block_ids) for _ in range(blocks_for(seq.num_computed, block_size) + rng.randrange(0, 2))]
            running.append(seq)
        for _ in range(rng.randrange(0, 5)):
            waiting.append(Seq(next(ids), [1] * rng.randrange(1, 50), StopCriteria(99), output=[2] * rng.choice([0, 0, 3])))
        budget, free = rng.randrange(1, 90), rng.randrange(0, 14)
        description = (f"running={_describe(running)}, waiting={_describe(waiting)}, token_budget={budget}, "
                       f"num_free_blocks={free}, block_size={block_size}")
        cases.append((description, (running, waiting, budget, free, block_size)))
    for lookahead, budget in ((2, 16), (3, 11)):  # a waiting request's lookahead does not count: it computes its tokens
        waiting = [Seq(40 + lookahead, [1] * 10, StopCriteria(99)), Seq(50 + lookahead, [1] * 6, StopCriteria(99))]
        for seq in waiting:
            seq.lookahead = lookahead
        cases.append((f"running=[], waiting={_describe(waiting)}, token_budget={budget}, num_free_blocks=100, "
                      "block_size=4 (waiting requests want num_tokens - num_computed, whatever their lookahead)",
                      ([], waiting, budget, 100, 4)))
    return cases


def check_schedule_step(fn: Callable) -> None:
    _compare_in_place(fn, schedule_step, _schedule_cases(), _schedule_outcome)


# ---- choose_gamma ---------------------------------------------------------------------------
def _rates(alpha: float, batch: int, step: StepCosts, draft: StepCosts, max_gamma: int) -> list[float]:
    return [batch * expected_tokens_per_round(alpha, g) / (g * draft(batch) + step(batch * (g + 1)))
            for g in range(max_gamma + 1)]


def _gamma_cases() -> list[tuple[str, tuple]]:
    flat, free_draft = StepCosts([1, 1000], [1.0, 1.0]), StepCosts([1, 1000], [0.0, 0.0])
    proportional = StepCosts([1, 1000], [1.0, 1000.0])
    cases = [("alpha=0.0, batch_size=4, flat target, free draft, max_gamma=5", (0.0, 4, flat, free_draft, 5)),
             ("alpha=1.0, batch_size=1, flat target, free draft, max_gamma=6", (1.0, 1, flat, free_draft, 6)),
             ("alpha=1.0, batch_size=1, target time = tokens, free draft, max_gamma=4 (every gamma ties)",
              (1.0, 1, proportional, free_draft, 4)),
             ("alpha=0.9, batch_size=8, flat target, free draft, max_gamma=0", (0.9, 8, flat, free_draft, 0))]
    rng = random.Random(salted(16))
    while len(cases) < 150:
        knee = rng.choice([1, 4, 16, 64, 256])
        base = rng.uniform(1e-3, 2e-2)
        step = StepCosts([1, knee, knee + 1000],
                         [base, base * rng.uniform(1.0, 1.3), base * (1 + 1000 / knee) * rng.uniform(0.5, 2)])
        c = rng.choice([0.0, 0.02, 0.1, 0.3])
        draft = StepCosts([1, 1000], [c * base, c * base * rng.uniform(1, 30)])
        alpha = rng.choice([0.0, 1.0, round(rng.random(), 3), round(rng.uniform(0.6, 0.95), 3)])
        batch, max_gamma = rng.choice([1, 2, 4, 8, 16, 32, 64, 128]), rng.randrange(0, 11)
        rates = sorted(_rates(alpha, batch, step, draft, max_gamma), reverse=True)
        if len(rates) > 1 and rates[0] - rates[1] <= 1e-9 * rates[0]:
            continue  # a near-tie that rounding could decide either way
        description = (f"alpha={alpha}, batch_size={batch}, step_time through {list(zip(step.counts, step.seconds))}, "
                       f"draft_step_time through {list(zip(draft.counts, draft.seconds))}, max_gamma={max_gamma}")
        cases.append((description, (alpha, batch, step, draft, max_gamma)))
    return cases


def check_choose_gamma(fn: Callable) -> None:
    compare_cases(fn, choose_gamma, _gamma_cases(), integer=True)


# ---- visible tests --------------------------------------------------------------------------
def expect_after(fn: Callable, args: dict[str, Any], returned: Any, after: dict[str, Any] | None = None) -> None:
    """Visible test of a function that changes its arguments: call ``fn(**args)`` on copies, then compare
    the return value and the named arguments afterwards. Lists compared ``in any order`` when the name says so."""
    copies = copy.deepcopy(args)
    label = f"{getattr(fn, '__name__', 'function')}({', '.join(f'{k}={fmt(v)}' for k, v in args.items())})"
    try:
        got = fn(**copies)
    except NotImplementedError as err:
        raise not_implemented(fn, label, err) from None
    except Exception as err:
        raise CheckFailure(f"{label} raised {type(err).__name__}: {err}") from None
    wrong = [] if got == returned else [f"it should return {fmt(returned)}, got {fmt(got)}"]
    for name, expected in (after or {}).items():
        key, unordered = name.removesuffix(" (any order)"), name.endswith("(any order)")
        value = copies[key]
        if (sorted(value) if unordered else value) != (sorted(expected) if unordered else expected):
            wrong.append(f"{key} afterwards should be {fmt(expected)}{' in any order' if unordered else ''}, got {fmt(value)}")
    if wrong:
        raise CheckFailure(f"{label}: " + "; ".join(wrong) + ".")


def expect_slots(fn: Callable, args: tuple, expected: list[int]) -> None:
    """Visible test of slot_mapping: the slots, as a list, with where they first differ."""
    label = f"slot_mapping({', '.join(fmt(a) for a in args)})"
    try:
        got = fn(*copy.deepcopy(args))
    except NotImplementedError as err:
        raise not_implemented(fn, label, err) from None
    except Exception as err:
        raise CheckFailure(f"{label} raised {type(err).__name__}: {err}") from None
    if not isinstance(got, torch.Tensor) or got.is_floating_point() or got.dim() != 1:
        raise CheckFailure(f"{label}: return a 1-D integer tensor, got {got!r}")
    if got.tolist() != expected:
        raise CheckFailure(f"{label}: expected {expected}, got {got.tolist()}.{where_lists_differ(expected, got.tolist())}")


def expect_fields(label: str, seqs: list[Seq], **fields: list) -> None:
    """Visible test: each named field of the rows, as a list over rows, equals what is given."""
    wrong = [f"{name} should be {want}, got {[getattr(s, name) for s in seqs]}" for name, want in fields.items()
             if [getattr(s, name) for s in seqs] != want]
    if wrong:
        raise CheckFailure(f"{label}: " + "; ".join(wrong) + ".")
