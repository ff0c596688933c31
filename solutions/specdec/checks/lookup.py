"""Hidden-test checks for notebook 06 (prompt lookup)."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from specdec import lookup
from specdec.checks.core import (
    CheckFailure,
    call,
    compare_cases,
    describe_types,
    expect_no_loop_over,
    expect_reproducible,
    is_int_list,
    single_threaded,
    torch_function_names,
    upstream_note,
)
from specdec.checks.engine import SAMPLING_PARAMS, expect_token_list, sampling_pair, shipped_pair, target_joint, tiny_pair
from specdec.checks.seeds import salted
from specdec.checks.stats import sample_and_compare
from specdec.engine import target_only_generate
from specdec.greedy import greedy_verify
from specdec.params import GREEDY, SamplingParams
from specdec.recording import RecordingModel

_SEED = 6

#: Hand-picked edge cases: (description, tokens, n).
_MATCH_EDGES = [
    ("two earlier matches: the latest wins", [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3], 3),
    ("a match that overlaps the suffix", [7, 7, 7], 2),
    ("a run of one token", [4, 4, 4, 4, 4], 3),
    ("no earlier match", [1, 2, 3, 4], 2),
    ("n longer than the history", [1, 2], 3),
    ("n equal to the history", [5, 5, 5], 3),
    ("a single token", [9], 1),
    ("the only match is at the start", [3, 1, 4, 3, 1], 2),
    ("ids of several digits: 11 is not 1 followed by 1", [11, 2, 5, 1, 2], 2),
    ("ids of several digits, no match", [1, 23, 5, 1, 2], 2),
    ("ids of several digits, a match", [150, 7, 33, 150, 7], 2),
]


def _as_tuples(cases: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
    """The same cases with the token list given as a tuple: the signature takes any sequence of ints."""
    return [(f"{d} (tokens as a tuple)", (tuple(args[0]), *args[1:])) for d, args in cases]


def _random_sequences(n: int) -> list[tuple[str, list[int], int]]:
    rng = random.Random(salted(_SEED))
    out = []
    for _ in range(n):
        tokens = [rng.randrange(3) for _ in range(rng.randint(1, 14))]
        n_gram = rng.randint(1, 4)
        out.append((f"tokens={tokens}, n={n_gram}", tokens, n_gram))
    return out


def check_find_match(fn: Callable) -> None:
    """Edge cases, then 300 random short sequences over 3 tokens (many repeats)."""
    cases = [(f"{d}: tokens={t}, n={n}", (list(t), n)) for d, t, n in _MATCH_EDGES]
    cases += [(d, (t, n)) for d, t, n in _random_sequences(300)]
    cases += _as_tuples(cases[:12]) + [(f"{d} (ids + {shift})", ([t + shift for t in args[0]], args[1]))
                                      for shift, (d, args) in zip((97, 300) * 30, cases[12:60])]
    for length in (300, 2000):  # the only earlier occurrence is far back: the search has no window
        history = [1, 2, 3] + list(range(10, 10 + length)) + [1, 2, 3]
        cases.append((f"tokens=[1, 2, 3] + list(range(10, {10 + length})) + [1, 2, 3], n=3 (the match is at 0, "
                      f"{length + 3} tokens back)", (history, 3)))
    compare_cases(fn, lookup.find_match, cases, integer=True)


def check_propose_ngram(fn: Callable) -> None:
    """Edge cases (no match, short continuation, fallback to shorter n, gamma cut) and
    random sequences, for several gamma and n ranges."""
    edges = [
        ("the continuation of the latest 3-gram match", [1, 2, 3, 4, 1, 2, 3, 5, 6, 1, 2, 3], 4, 3, 1),
        ("the continuation is cut at gamma", [1, 2, 3, 4, 5, 6, 1, 2], 2, 2, 1),
        ("fewer than gamma tokens follow", [8, 9, 8], 5, 2, 1),
        ("the 3-gram [1, 2, 3] matches at 0 (the 2-gram [2, 3] later, at 4: the longer match wins)",
         [1, 2, 3, 9, 2, 3, 4, 1, 2, 3], 3, 3, 1),
        ("no 3-gram match: fall back to a 2-gram", [5, 2, 3, 9, 8, 7, 4, 1, 2, 3], 3, 3, 1),
        ("no match at all", [1, 2, 3, 4], 3, 3, 1),
        ("only a 1-gram matches but n_min is 2", [1, 2, 3, 1], 3, 3, 2),
        ("n_max longer than the history", [6, 6], 3, 5, 1),
    ]
    cases = [(f"{d}: tokens={t}, gamma={g}, n_max={hi}, n_min={lo}", (list(t), g, hi, lo)) for d, t, g, hi, lo in edges]
    rng = random.Random(salted(_SEED + 1))
    for desc, tokens, _ in _random_sequences(200):
        gamma, n_min = rng.randint(1, 5), rng.randint(1, 2)
        n_max = n_min + rng.randint(0, 2)
        cases.append((f"{desc.split(', n=')[0]}, gamma={gamma}, n_max={n_max}, n_min={n_min}",
                      (tokens, gamma, n_max, n_min)))
    cases += _as_tuples(cases[:8]) + [(f"{d}, ids + 120", ([t + 120 for t in args[0]], *args[1:]))
                                      for d, args in cases[8:40]]
    _compare_lists(fn, cases, requires=[("find_match", check_find_match)])


def _compare_lists(fn: Callable, cases, requires) -> None:
    for description, args in cases:
        label = f"propose_ngram({description})"
        expected = lookup.propose_ngram(*args)
        got = call(fn, label, *args)
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if list(got) != expected if isinstance(got, (list, tuple)) else got != expected:
            raise CheckFailure(f"{label}: expected {expected}, got {got!r}.{_propose_hint(args, got)}"
                               f"{upstream_note(fn, requires)}")
        if not is_int_list(got):
            raise CheckFailure(f"{label}: the right tokens, but as {describe_types(got)}; return a list of ints, "
                               "whatever sequence the tokens came in (list(...) of the slice).")


def _propose_hint(args, got) -> str:
    tokens, gamma, n_max, n_min = args
    for n in range(n_max, n_min - 1, -1):
        start = lookup.find_match(tokens, n)
        if start >= 0:
            if got == list(tokens[start : start + n + gamma])[:gamma] or got == list(tokens[start : start + n]):
                return " That is the match itself: propose what follows it, tokens[start + n : start + n + gamma]."
            if isinstance(got, list) and len(got) > gamma:
                return f" Propose at most gamma = {gamma} tokens."
            break
    for n in range(n_min, n_max + 1):
        start = lookup.find_match(tokens, n)
        if start >= 0 and got == list(tokens[start + n : start + n + gamma]):
            return " Try the longest n first (n_max down to n_min): a longer match is more reliable."
    return ""


def check_find_match_vectorised(fn: Callable) -> None:
    """Agrees with find_match on edge cases and random tensors; no Python loop over positions."""
    cases = [(f"{d}: tokens={t}, n={n}", (torch.tensor(t), n)) for d, t, n in _MATCH_EDGES]
    cases += [(d, (torch.tensor(t), n)) for d, t, n in _random_sequences(300)]
    wide = torch.tensor([[1, 0], [2, 0], [3, 0], [9, 0], [1, 0], [2, 0]])
    cases += [("a non-contiguous tensor (a column of a (6, 2) tensor): tokens=[1, 2, 3, 9, 1, 2], n=2", (wide[:, 0], 2)),
              ("large ids (65535 and more): tokens=[7, 1, 2, 3, 4, 65535, 1, 2, 3, 4], n=5",
               (torch.tensor([7, 1, 2, 3, 4, 65535, 1, 2, 3, 4]), 5)),
              ("ids up to 2**40: tokens=[5, 2**40, 3, 6, 2**40, 3], n=2", (torch.tensor([5, 2**40, 3, 6, 2**40, 3]), 2)),
              ("int32 ids: tokens=[4, 8, 4, 8], n=2", (torch.tensor([4, 8, 4, 8], dtype=torch.int32), 2)),
              ("byte ids and n = 4: tokens=[200, 1, 2, 3, 9, 200, 1, 2, 4, 7, 200, 1, 2, 3], n=4",
               (torch.tensor([200, 1, 2, 3, 9, 200, 1, 2, 4, 7, 200, 1, 2, 3]), 4))]
    rng = random.Random(salted(_SEED + 2))
    for k in range(20):  # the course's 256 ids and longer n-grams: windows must match exactly, id by id
        n = rng.randint(4, 6)
        stem = [rng.randrange(256) for _ in range(n)]
        tokens = [rng.randrange(256) for _ in range(rng.randint(0, 8))] + stem
        tokens += [rng.randrange(256) for _ in range(rng.randint(0, 8))] + stem[:-1] + [(stem[-1] + 1) % 256]
        tokens += [rng.randrange(256) for _ in range(rng.randint(0, 4))] + stem
        cases.append((f"random byte ids, n={n}, case {k}: tokens={tokens}", (torch.tensor(tokens), n)))
    for description, args in cases:
        label = f"find_match_vectorised({description})"
        expected = lookup.find_match(args[0].tolist(), args[1])
        got = call(fn, label, *args)
        if isinstance(got, torch.Tensor) or not isinstance(got, int) or isinstance(got, bool):
            raise CheckFailure(f"{label}: return a Python int (int(...) of the index), got {got!r}.")
        if got != expected:
            raise CheckFailure(f"{label}: expected {expected}, got {got!r}. Compare every window that starts before the "
                               "suffix (tokens[:-1].unfold(0, n, 1)) with the suffix, and take the last hit.")
    # the only earlier match is at the very start, so a loop from either end must walk every position
    small, large = (torch.tensor([1, 2, 3, *range(10, 10 + m), 1, 2, 3]) for m in (10, 400))
    expect_no_loop_over(fn, "find_match_vectorised", (small, 3), (large, 3), "positions")
    used = torch_function_names(fn, large, 3)
    if used & {"tolist", "unbind", "numpy"}:
        raise CheckFailure("find_match_vectorised: the tensor was turned into Python values "
                           f"({', '.join(sorted(used & {'tolist', 'unbind', 'numpy'}))}), so the search is still a Python "
                           "loop over positions. Compare all windows with tensor operations.")


@single_threaded
def check_lookup_generate(fn: Callable) -> None:
    """Greedy: equal to target-only greedy (small random model and the shipped target),
    one target forward per round over [last token] + proposal, cache cropped to P + k;
    sampling: the first three tokens follow the target's exact joint distribution."""
    requires = [("propose_ngram", check_propose_ngram)]
    try:
        _check_lookup_greedy(fn)
        _check_lookup_sampling(fn)
        target = tiny_pair()[0]
        expect_reproducible(fn, "lookup_generate(small random model, prompt=[1, 2, 1, 2, 1], n_tokens=10, gamma=3, "
                                "temperature 1)",
                            lambda seed: (target, [1, 2, 1, 2, 1], 10, 3, SamplingParams(1.0),
                                          torch.Generator().manual_seed(salted(seed))))
    except CheckFailure as failure:
        raise CheckFailure(str(failure) + upstream_note(fn, requires)) from None


def _lookup_cases():
    target, _ = tiny_pair()
    for gamma, prompt, n_max, n_min in ((1, [1, 2, 3, 1, 2, 3, 1, 2], 3, 1), (4, [5, 9, 5, 9, 5], 3, 1), (3, [7], 3, 1),
                                        (3, [4, 4, 2, 4, 4, 2, 4, 1, 4], 2, 2)):
        yield "small random model", target, prompt, 30, gamma, n_max, n_min
    target, _ = shipped_pair()
    from specdec.models import corpus, tokenizer

    for name, text in (("code", corpus.code_prompts(1)[0]), ("math", corpus.math_prompts(1)[0])):
        yield f"shipped target, {name} prompt", target, tokenizer.encode(text), 40, 4, 3, 1


def _check_lookup_greedy(fn: Callable) -> None:
    for what, target, prompt, n_tokens, gamma, n_max, n_min in _lookup_cases():
        label = (f"lookup_generate({what}, len(prompt)={len(prompt)}, n_tokens={n_tokens}, gamma={gamma}, greedy, "
                 f"n_max={n_max}, n_min={n_min})")
        rec = RecordingModel(target, keep_logits=True)
        got = expect_token_list(label, call(fn, label, rec, list(prompt), n_tokens, gamma, GREEDY, None, n_max, n_min),
                                n_tokens)
        if any(c.cache is None for c in rec.calls):
            raise CheckFailure(f"{label}: the target was called without its KV cache.")
        calls = rec.calls
        if len(prompt) > 1:
            if calls[0].cache_len != 0 or calls[0].tokens != prompt[:-1]:
                raise CheckFailure(f"{label}: the first forward should prefill prompt[:-1] into the empty cache.")
            calls = calls[1:]
        sequence = list(prompt)
        for i, c in enumerate(calls, start=1):
            if len(sequence) - len(prompt) >= n_tokens:
                raise CheckFailure(f"{label}, round {i}: {len(sequence) - len(prompt)} new tokens were already "
                                   f"committed (n_tokens = {n_tokens}), yet the loop ran another round: stop as soon "
                                   "as you have n_tokens.")
            proposal = lookup.propose_ngram(sequence, gamma, n_max, n_min)
            if c.cache_len != len(sequence) - 1:
                raise CheckFailure(f"{label}, round {i}: with {len(sequence)} committed tokens the cache should hold "
                                   f"{len(sequence) - 1} entries when the target verifies, but it held {c.cache_len}. "
                                   "Crop it to P + k after each round.")
            if c.tokens != sequence[-1:] + proposal:
                raise CheckFailure(f"{label}, round {i}: the target should be fed the last committed token and the "
                                   f"proposal, {sequence[-1:] + proposal}; it was fed {c.tokens}.")
            sequence += greedy_verify(torch.tensor(proposal, dtype=torch.long), c.logits).tolist()
        expected = target_only_generate(target, prompt, n_tokens)
        if got != expected:
            raise CheckFailure(f"{label}: expected target-only greedy's tokens {expected[:12]}..., got {str(got)[:80]}.")


def _check_lookup_sampling(fn: Callable, n: int = 1500) -> None:
    """Two prompts: one that always has a match, and one of distinct tokens whose first proposal is empty (the
    token is then sampled from the last row at temperature 1, where an argmax shows)."""
    target = sampling_pair()[0]  # tiny_pair(vocab=6, noise=0.5, seed=3)'s target: the same outputs, fewer forwards
    for params, prompt, runs in ((SAMPLING_PARAMS[1], [1, 2, 1, 2, 1], n), (SamplingParams(1.0), [3, 4, 5], n // 2)):
        exact = target_joint(tiny_pair(vocab=6, noise=0.5, seed=3)[0], prompt, params)
        g = torch.Generator().manual_seed(salted(0))
        label = f"lookup_generate(small random model, prompt={prompt}, n_tokens=3, gamma=2, params={params})"
        sample_and_compare(
            lambda: tuple(expect_token_list(label, call(fn, label, target, prompt, 3, 2, params, g), 3)),  # noqa: B023
            runs, exact, f"{label}, seeded runs: the 3 tokens",
            hint="A proposal is deterministic: verify with q one-hot at each draft (accept y with probability p(y); "
                 "on rejection sample from p with y removed). With no proposal, sample the token from the last row's "
                 "p (params.probs), never its argmax.")
