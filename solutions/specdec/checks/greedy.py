"""Hidden-test checks for notebook 02 (greedy verification)."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from specdec import greedy
from specdec.checks.core import (
    CheckFailure,
    call,
    describe_types,
    diagnose,
    expect_no_loop_over,
    is_int_list,
    same,
    single_threaded,
    upstream_note,
)
from specdec.checks.seeds import salted
from specdec.mistakes import for_exercise
from specdec.models.toy import ToyLM, greedy_generate

_SEED = 2


def check_round_shapes(fn: Callable) -> None:
    """Every field for P in 1..6, gamma in 1..6 and every k in 0..gamma, and drawn shapes up to P=4096, gamma=32."""
    fields = greedy.RoundShapes.__dataclass_fields__
    rng = random.Random(salted(43))  # and inputs nobody can list in advance (a grading run salts the seed)
    drawn = [(rng.randint(1, 4096), gamma, rng.randint(0, gamma)) for gamma in (rng.randint(1, 32) for _ in range(8))]
    grid = [(P, gamma, k) for P in range(1, 7) for gamma in range(1, 7) for k in range(gamma + 1)]
    for P, gamma, k in grid + drawn:
        label = f"round_shapes(P={P}, gamma={gamma}, k={k})"
        got = call(fn, label, P, gamma, k)
        expected = greedy.round_shapes(P, gamma, k)
        for name in fields:
            value = getattr(got, name, None)
            if value != getattr(expected, name):
                raise CheckFailure(
                    f"{label}.{name}: expected {getattr(expected, name)}, got {value!r}."
                    + diagnose(for_exercise("round_shapes"), [((P, gamma, k), got)])
                )
            if not is_int_list([value]):
                raise CheckFailure(f"{label}.{name}: the right value, but as {type(value).__name__} "
                                   f"({value!r}); every field is a count of tokens or positions: an int.")


def _verify_cases(rng: random.Random, n: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(draft (gamma,), logits (gamma + 1, V), k): the first k drafts match, then a mismatch,
    then random drafts (which sometimes match again, to catch counting past the mismatch)."""
    g = torch.Generator().manual_seed(salted(rng.randrange(2**31)))
    cases = []
    for _ in range(n):
        V, gamma = rng.choice([2, 3, 5, 10, 50]), rng.randint(1, 8)
        logits = torch.randn(gamma + 1, V, generator=g)
        target = logits.argmax(-1)
        k = rng.randint(0, gamma)
        draft = torch.randint(0, V, (gamma,), generator=g)
        draft[:k] = target[:k]
        if k < gamma:
            draft[k] = (target[k] + rng.randint(1, V - 1)) % V
            if k + 1 < gamma and rng.random() < 0.5:
                draft[k + 1 :] = target[k + 1 : gamma]  # matches again after the mismatch
        cases.append((draft, logits, k))
    return cases


def _tied_cases(rng: random.Random, n: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Vocabularies of 10, 17 and the course's 256 with logits on three levels, so every row has tied maxima: the target's
    token is the lowest tied id, and a draft of another tied id (or of the highest, as a last-index argmax
    would pick) is a mismatch."""
    g = torch.Generator().manual_seed(salted(rng.randrange(2**31)))
    cases = []
    for _ in range(n):
        gamma, V = rng.randint(1, 6), rng.choice([10, 17, 256])  # topk's tie order differs from argmax's at some V
        logits = torch.randint(0, 3, (gamma + 1, V), generator=g).float()
        target = logits.argmax(-1)
        k = rng.randint(0, gamma)
        draft = target[:gamma].clone()
        if k < gamma:
            tied = (logits[k] == logits[k].max()).nonzero().flatten()
            if len(tied) > 1:
                draft[k] = tied[-1] if rng.random() < 0.5 else tied[rng.randrange(1, len(tied))]
            else:  # no tie in this row (some seeds draw one): a plain mismatch
                draft[k] = (target[k] + 1 + rng.randrange(V - 1)) % V
        cases.append((draft, logits, k))
    return cases


def _near_tie_logits(g: torch.Generator, shape: tuple[int, ...], V: int, dtype: torch.dtype) -> torch.Tensor:
    """Random logits whose every row has its maximum at a higher id and, below it by the smallest gap the dtype
    keeps (1e-12 in float64, 1e-3 in float32), a runner-up at a lower id: a float32 softmax, or a cast to bfloat16,
    turns the pair into a tie that goes to the lower id."""
    logits = torch.rand(*shape, V, generator=g, dtype=dtype)
    rows = logits.reshape(-1, V)
    gap = 1e-12 if dtype == torch.float64 else 1e-3
    for row in rows:
        low, high = sorted(torch.randperm(V, generator=g)[:2].tolist())
        row[high], row[low] = 2.0, 2.0 - gap
    return logits


def _near_tie_cases(rng: random.Random, n: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(draft, logits, k) at V = 256 with near-tied maxima in float64 and float32 logits."""
    g = torch.Generator().manual_seed(salted(rng.randrange(2**31)))
    cases = []
    for i in range(n):
        gamma = rng.randint(1, 5)
        logits = _near_tie_logits(g, (gamma + 1,), 256, torch.float64 if i % 2 == 0 else torch.float32)
        target = logits.argmax(-1)
        k = rng.randint(0, gamma)
        draft = target[:gamma].clone()
        if k < gamma:
            draft[k] = (target[k] + rng.randint(1, 255)) % 256
        cases.append((draft, logits, k))
    return cases


def _tie_note(logits: torch.Tensor) -> str:
    tied = [(i, (row == row.max()).nonzero().flatten().tolist()) for i, row in enumerate(logits)]
    tied = [(i, ids) for i, ids in tied if len(ids) > 1]
    if not tied:
        top2 = logits.reshape(-1, logits.shape[-1]).double().topk(2, -1).values
        gap = float((top2[:, 0] - top2[:, 1]).min())
        if gap < 1e-2:
            return (f" Two logits of a row differ by only {gap:.0e} ({logits.dtype}): take the argmax of target_logits "
                    "as they are; a softmax in float32 or a cast to a lower precision rounds them to a tie, which goes "
                    "to the lower id.")
        return ""
    i, ids = tied[0]
    return (f" Row {i} of target_logits has its maximum at ids {ids[:4] + ['...'] if len(ids) > 4 else ids}: the target's "
            f"token is the lowest of them, {ids[0]} (torch.argmax), and any other tied id is a mismatch.")


def check_greedy_verify(fn: Callable) -> None:
    """200 random rounds: every k from 0 to gamma, V from 2 to 50, matches after a mismatch; then 40 rounds at
    V = 256 with tied maxima."""
    rng = random.Random(salted(_SEED))
    cases = _verify_cases(rng, 200) + _tied_cases(rng, 40) + _near_tie_cases(rng, 20)
    cases += [(draft.int(), logits, k) for draft, logits, k in cases[:10]]  # int32 token ids are token ids too
    for draft, logits, k in cases:
        label = (f"greedy_verify(draft={draft.tolist()}{'' if draft.dtype == torch.long else f' as {draft.dtype}'}, "
                 f"{logits.dtype} target_logits with argmax={logits.argmax(-1).tolist()})")
        got = call(fn, label, draft, logits)
        expected = greedy.greedy_verify(draft, logits)
        if not isinstance(got, torch.Tensor) or got.ndim != 1:
            raise CheckFailure(f"{label}: return a 1-D tensor of token ids, got {got!r}")
        if not same(got, expected):
            raise CheckFailure(
                f"{label}: {k} draft(s) match before the first mismatch, so expected {expected.tolist()}, "
                f"got {got.tolist()}." + (diagnose(for_exercise("greedy_verify"), [((draft, logits), got)])
                                          or _tie_note(logits))
            )
        if got.dtype != torch.long:
            raise CheckFailure(f"{label}: the right tokens, but as {got.dtype}; return a long (int64) tensor, the dtype "
                               "of token ids everywhere in the course (argmax gives one).")


def _batch(B: int, gamma: int, V: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(B, gamma + 1, V, generator=torch.Generator().manual_seed(salted(seed)))
    return logits[:, :gamma].argmax(-1), logits


def check_greedy_verify_batched(fn: Callable) -> None:
    """Ragged batches (B = 1, 2, 7, 64) against the single-sequence reference, row by row; tied and near-tied
    maxima, int32 drafts, non-contiguous logits; the same number of torch operations whatever B and gamma (no Python
    loop)."""
    rng = random.Random(salted(_SEED + 1))
    g = torch.Generator().manual_seed(salted(_SEED))
    for B in (1, 2, 7, 64):
        for gamma in (1, 3, 5):
            V = rng.choice([3, 10, 50])
            logits = torch.randn(B, gamma + 1, V, generator=g)
            if B in (7, 64):  # logits on three levels: tied maxima in every row (V = 256, the course's, and 10)
                V = 256 if B == 7 else 10
                logits = torch.randint(0, 3, (B, gamma + 1, V), generator=g).float()
            draft = _agreeing_drafts(rng, g, logits)
            if B == 2:
                draft = draft.int()  # int32 ids: the outputs are long all the same
            _compare_batched(fn, f"greedy_verify_batched(B={B}, gamma={gamma}, V={V}, draft of {draft.dtype})", draft,
                             logits)
    for dtype in (torch.float64, torch.float32):
        logits = _near_tie_logits(g, (5, 4), 256, dtype)
        _compare_batched(fn, f"greedy_verify_batched(B=5, gamma=3, V=256, {dtype} logits whose two largest differ by "
                         f"{1e-12 if dtype == torch.float64 else 1e-3:g})", _agreeing_drafts(rng, g, logits), logits)
    strided = torch.randn(6, 4, 10, generator=g)[::2]  # every other sequence of a batch: not contiguous
    transposed = torch.randn(3, 10, 4, generator=g).transpose(1, 2)  # (B, V, gamma + 1) seen as (B, gamma + 1, V)
    for what, logits in (("logits[::2] of a batch of 6", strided), ("logits.transpose(1, 2)", transposed)):
        _compare_batched(fn, f"greedy_verify_batched(B=3, gamma=3, V=10, non-contiguous {what})",
                         _agreeing_drafts(rng, g, logits), logits)
    logits = torch.randn(3, 4, 10, generator=g)
    drafts = _agreeing_drafts(rng, g, logits)
    _compare_batched(fn, "greedy_verify_batched(B=3, gamma=3, V=10, a non-contiguous draft: draft.T.contiguous().T)",
                     drafts.T.contiguous().T, logits)
    label = "greedy_verify_batched"
    expect_no_loop_over(fn, label, _batch(8, 4), _batch(64, 4), "rows")
    expect_no_loop_over(fn, label, _batch(8, 2), _batch(8, 6), "positions")


def _agreeing_drafts(rng: random.Random, g: torch.Generator, logits: torch.Tensor) -> torch.Tensor:
    """Random drafts (B, gamma) where row b agrees with the target's argmax on a random prefix."""
    B, gamma, V = logits.shape[0], logits.shape[1] - 1, logits.shape[2]
    target = logits.argmax(-1)
    draft = torch.randint(0, V, (B, gamma), generator=g)
    for b in range(B):
        k = rng.randint(0, gamma)
        draft[b, :k] = target[b, :k]
    return draft


def _compare_batched(fn: Callable, label: str, draft: torch.Tensor, logits: torch.Tensor) -> None:
    B, gamma = draft.shape
    target = logits.argmax(-1)
    got = call(fn, label, draft, logits)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailure(f"{label}: return (tokens, n_committed), got {type(got).__name__}")
    tokens, n_committed = got
    expected_tokens, expected_n = greedy.greedy_verify_batched(draft, logits)
    if not isinstance(tokens, torch.Tensor) or tuple(tokens.shape) != (B, gamma + 1):
        raise CheckFailure(f"{label}: tokens must have shape (B, gamma + 1) = ({B}, {gamma + 1}), got "
                           f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}")
    if not isinstance(n_committed, torch.Tensor) or not same(n_committed.reshape(-1), expected_n):
        raise CheckFailure(f"{label}: n_committed should be {expected_n.tolist()}, got "
                           f"{n_committed.tolist() if isinstance(n_committed, torch.Tensor) else n_committed!r}."
                           + (diagnose(for_exercise("greedy_verify_batched"), [((draft, logits), got)])
                              or _tie_note(logits)))
    if tuple(n_committed.shape) != (B,):
        raise CheckFailure(f"{label}: n_committed must have shape (B,) = ({B},), got {tuple(n_committed.shape)}")
    if not same(tokens, expected_tokens):
        row = next(b for b in range(B) if not torch.equal(tokens[b].long(), expected_tokens[b]))
        raise CheckFailure(
            f"{label}: row {row} (draft {draft[row].tolist()}, target argmax {target[row].tolist()}) should be "
            f"{expected_tokens[row].tolist()}, got {tokens[row].tolist()} (PAD = {greedy.PAD})."
            + (diagnose(for_exercise("greedy_verify_batched"), [((draft, logits), got)]) or _tie_note(logits[row]))
        )
    if tokens.dtype != torch.long or n_committed.dtype != torch.long:
        raise CheckFailure(f"{label}: the right values, but tokens are {tokens.dtype} and n_committed "
                           f"{n_committed.dtype}, as the statement asks for long. Return long (int64) tensors, "
                           "the dtype of token ids.")


class CountingLM:
    """Wraps a ToyLM and counts calls, to check one target call per round."""

    def __init__(self, model: ToyLM) -> None:
        self._model, self.calls = model, 0  # private: a learner's code reaching it would call it uncounted
        self.vocab_size = model.vocab_size

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self._model.logits(tokens)

    def next_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self._model.next_logits(tokens)


@single_threaded
def check_speculative_greedy_generate(fn: Callable) -> None:
    """Output equals target-only greedy decoding, rounds equal the reference's, one target call per round."""
    try:
        _check_generate(fn)
    except CheckFailure as failure:
        note = upstream_note(fn, [("greedy_verify", check_greedy_verify)])
        if note:  # the round itself may be right: point at the function that is wrong
            raise CheckFailure(str(failure).split(" Hint (a known slip")[0] + note) from None
        raise


def _check_generate(fn: Callable) -> None:
    for seed, V, noise in ((0, 10, 1.0), (1, 10, 3.0), (2, 5, 0.0), (3, 30, 2.0)):
        target = ToyLM(V, seed=seed)
        draft = target.noisy_copy(noise, seed=seed + 100)
        for prompt in ([1], [5 % V, 9 % V], [2, 3, 4]):
            int32 = seed == 3 and len(prompt) == 3  # token ids of another integer dtype: the output is int64
            prompt_t = torch.tensor(prompt, dtype=torch.int32 if int32 else torch.long)
            for gamma in (1, 3, 5):
                for n_tokens in (40, 7, 1):
                    label = (f"speculative_greedy_generate(V={V}, draft noise={noise}, prompt={prompt}"
                             f"{' as int32' if int32 else ''}, n_tokens={n_tokens}, gamma={gamma})")
                    counting = CountingLM(target)
                    got = call(fn, label, counting, draft, prompt_t, n_tokens, gamma)
                    if not (isinstance(got, tuple) and len(got) == 2):
                        raise CheckFailure(f"{label}: return (tokens, committed per round)")
                    tokens, per_round = got
                    expected = greedy_generate(target, prompt_t, n_tokens)
                    _, expected_rounds = greedy.speculative_greedy_generate(target, draft, prompt_t, n_tokens, gamma)
                    if not isinstance(tokens, torch.Tensor) or not same(tokens, expected):
                        shown = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
                        raise CheckFailure(f"{label}: expected the target's greedy tokens {expected.tolist()}, got {shown}."
                                           + diagnose(for_exercise("speculative_greedy_generate"),
                                                      [((target, draft, prompt_t, n_tokens, gamma), got)]))
                    if list(per_round) != expected_rounds:
                        raise CheckFailure(f"{label}: tokens committed per round should be {expected_rounds}, "
                                           f"got {list(per_round)}."
                                           " Each round commits the accepted drafts plus one target token."
                                           + diagnose(for_exercise("speculative_greedy_generate"),
                                                      [((target, draft, prompt_t, n_tokens, gamma), got)]))
                    if tokens.dtype != torch.long or not is_int_list(list(per_round)):
                        raise CheckFailure(f"{label}: the right values, but tokens are {tokens.dtype} and the counts "
                                           f"{describe_types(per_round)}; return a long (int64) tensor of tokens and a "
                                           "list of Python ints (int(...) each count), as the signature says.")
                    if counting.calls != len(expected_rounds):
                        raise CheckFailure(f"{label}: the target was called {counting.calls} times for "
                                           f"{len(expected_rounds)} rounds; "
                                           "score the last committed token and all gamma drafts in one target.logits call "
                                           "per round.")
