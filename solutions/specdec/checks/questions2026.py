"""Hidden-test checks for notebook 15 (parallel drafting, targets with state, a drafter's life).

Every check draws its inputs from salted seeds (random layouts, batches whose rows differ, ties, extremes) and
compares the learner's answer with the reference's, naming the first input where they part and, where a catalogued
slip reproduces the answer, its hint. The samplers are checked for exactness by enumeration (the hybrid loop) or
seeded Monte Carlo against the distribution the reference computes (the parallel proposals).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from functools import cache

import torch

from specdec.chain import expected_committed_length
from specdec.checks.core import (
    CheckFailure,
    call,
    call_recorded,
    diagnose,
    expect_reproducible,
    expect_value_error,
    single_threaded,
)
from specdec.checks.engine import expect_token_list
from specdec.checks.seeds import salted
from specdec.checks.stats import sample_and_compare
from specdec.mistakes import for_exercise
from specdec.models.model import KVCache, Llama, LlamaConfig
from specdec.params import GREEDY, SamplingParams
from specdec.questions2026 import drift, hybrid, ledger, parallel

SAMPLING = (SamplingParams(1.0), SamplingParams(0.7, top_k=4))


def _agree(a, b) -> bool:
    """Outputs equal for diagnosis: lists of floats (NaN equal to NaN) or of tensors, tuples, tensors."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_agree(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and bool(torch.allclose(a.double(), b.double(), rtol=1e-9, atol=1e-12, equal_nan=True)))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _explain(mistakes, history) -> str:
    """The hint of the first catalogued slip that gives the learner's every output so far (exceptions excluded)."""
    for mistake in mistakes:
        try:
            if all(not isinstance(got, BaseException) and _agree(mistake.fn(*args), got) for args, got in history):
                return f" Hint (a known slip gives exactly this output): {mistake.hint}"
        except Exception:
            continue
    return ""


# -- parallel_training_mask ---------------------------------------------------------------------------------


def _layouts(seed: int):
    """Random training layouts, in the order cod_layout makes them and shuffled (any order is allowed)."""
    g = torch.Generator().manual_seed(salted(seed))
    yield "one real token", torch.tensor([0]), torch.tensor([0])
    yield "real tokens only", torch.arange(5), torch.zeros(5, dtype=torch.long)
    yield "one chain of 3 masks after 4 real tokens", torch.tensor([0, 1, 2, 3, 4, 5, 6]), torch.tensor([0, 0, 0, 0, 1, 2, 3])
    for i in range(6):
        length, gamma = int(torch.randint(3, 12, (1,), generator=g)), int(torch.randint(2, 6, (1,), generator=g))
        retain = sorted(torch.rand(gamma - 1, generator=g).tolist(), reverse=True)
        positions, depths = parallel.cod_layout(length, gamma, [max(r, 0.3) for r in retain], g)
        if i % 2:
            order = torch.randperm(len(positions), generator=g)
            positions, depths = positions[order], depths[order]
        if i == 5:
            positions, depths = positions.to(torch.int32), depths.to(torch.int32)
        yield f"a layout of {length} real tokens, gamma {gamma}{', shuffled' if i % 2 else ''}", positions, depths


def _mask_pair_message(positions: torch.Tensor, depths: torch.Tensor, i: int, j: int, got: bool) -> str:
    p_i, d_i, p_j, d_j = (int(positions[i]), int(depths[i]), int(positions[j]), int(depths[j]))
    who = lambda p, d: f"the real token at position {p}" if d == 0 else f"the depth-{d} mask at position {p} (anchor {p - d})"
    pair = f"query {i} ({who(p_i, d_i)}) and key {j} ({who(p_j, d_j)})"
    anchor = p_i - d_i
    if d_j == 0:
        if got:
            why = (f"it must not see real tokens after its anchor {anchor}: the real token at {p_j} is what it (or a "
                   "later mask of its chain) is trained to predict, a leak the drafter will not have at inference")
        else:
            why = f"it sees every real token up to its anchor {anchor}, as at inference, where they are its prefix"
    elif d_i == 0:
        why = "a real token sees no mask: at inference it comes before any"
    elif p_j - d_j != anchor:
        why = ("masks of another chain (another anchor) are not in its inference context, where the only masks are "
               "its own chain's")
    elif p_j > p_i:
        why = "the later masks of its own chain come after it: causal"
    else:
        why = ("it sees its own chain's masks up to itself (itself included), as at inference, where the masks follow "
               "the prefix under a causal mask")
    return f"{pair}: expected {not got}, got {got}, because {why}"


def check_parallel_training_mask(fn: Callable) -> None:
    name = "parallel_training_mask"
    history: list = []
    mistakes = for_exercise(name)
    failure = None
    for description, positions, depths in _layouts(0):  # every case first: a hint must fit all of them
        label = f"{name}({description}: positions={positions.tolist()}, depths={depths.tolist()})"
        want = parallel.parallel_training_mask(positions, depths)
        got = call_recorded(fn, label, (positions, depths), mistakes, history)
        history.append(((positions, depths), got))
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or got.shape != want.shape:
            kind = (f"a {got.dtype} tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor)
                    else type(got).__name__)
            raise CheckFailure(f"{label}: return a bool tensor of shape {tuple(want.shape)} (N x N), got {kind}.")
        wrong = (got != want).nonzero()
        if len(wrong) and failure is None:
            i, j = (int(v) for v in wrong[0])
            failure = f"{label}: {_mask_pair_message(positions, depths, i, j, bool(got[i, j]))}."
    if failure:
        raise CheckFailure(failure + diagnose(mistakes, history, rel=0.0))


# -- parallel_propose -----------------------------------------------------------------------------------------


@cache
def tiny_drafter(vocab: int = 7, seed: int = 0) -> Llama:
    """A small random parallel drafter: ids 0..vocab-2 are tokens, vocab-1 the mask. Sharpened like the course's
    other small random models so that positions differ."""
    torch.manual_seed(seed)
    model = Llama(LlamaConfig(vocab_size=vocab, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                              max_seq_len=96))
    with torch.no_grad():
        for w in model.parameters():
            w.mul_(6.0)
    return model.eval()


class _ForwardCount:
    def __init__(self, model: Llama) -> None:
        self.model, self.count = model, 0

    def __enter__(self):
        self.handle = self.model.register_forward_hook(lambda *args: setattr(self, "count", self.count + 1))
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def _prefilled(drafter: Llama, rows: int, length: int, g: torch.Generator) -> KVCache:
    cache = KVCache(drafter.config, batch_size=rows)
    if length:
        with torch.no_grad():
            drafter(torch.randint(0, parallel.mask_id(drafter), (rows, length), generator=g), cache)
    return cache


def _propose_case(drafter: Llama, rows: int, cached: int, n: int, gamma: int, seed: int):
    g = torch.Generator().manual_seed(salted(seed))
    feed = torch.randint(0, parallel.mask_id(drafter), (rows, n), generator=g)
    return _prefilled(drafter, rows, cached, torch.Generator().manual_seed(salted(seed))), feed


@single_threaded
def check_parallel_propose(fn: Callable) -> None:
    name = "parallel_propose"
    mistakes, history = for_exercise(name), []
    drafter = tiny_drafter()
    cases = [(1, 0, 1, 1, GREEDY), (3, 5, 1, 4, GREEDY), (2, 0, 3, 3, GREEDY), (3, 4, 2, 5, SAMPLING[0]),
             (2, 7, 1, 3, SAMPLING[1]), (4, 3, 2, 2, GREEDY)]
    for seed, (rows, cached, n, gamma, params) in enumerate(cases):
        cache_mine, feed = _propose_case(drafter, rows, cached, n, gamma, 10 + seed)
        cache_ref, _ = _propose_case(drafter, rows, cached, n, gamma, 10 + seed)
        label = (f"{name}(a small random drafter (mask id {parallel.mask_id(drafter)}), a cache of {cached} positions, "
                 f"feed={feed.tolist()}, gamma={gamma}, params={params})")
        with torch.no_grad():
            want_drafts, want_q = parallel.parallel_propose(drafter, cache_ref, feed, gamma, params,
                                                            torch.Generator().manual_seed(0))
        with _ForwardCount(drafter) as forwards, torch.no_grad():
            try:
                got = call_recorded(fn, label, (drafter, cache_mine, feed, gamma, params,
                                                torch.Generator().manual_seed(0)), mistakes, history)
            except CheckFailure as failure:
                if "invalid multinomial distribution" not in str(failure) and "probability tensor" not in str(failure):
                    raise
                raise CheckFailure(f"{failure} A q that cannot be sampled is not a distribution over the real ids: "
                                   "slice the logits to [..., :mask_id] first, then apply params.probs (a "
                                   "distribution over all ids with the mask's column dropped no longer sums to 1, "
                                   "and is all zeros where the mask was the argmax).") from None
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            raise CheckFailure(f"{label}: return (drafts, q), two tensors; got {type(got).__name__}.")
        drafts, q = got
        if q.shape != want_q.shape:
            extra = (" q covers the real token ids only, 0..mask_id - 1: the mask is never proposed (slice the logits "
                     "to [..., :mask_id])" if q.shape[-1] == want_q.shape[-1] + 1 else "")
            raise CheckFailure(f"{label}: q must have shape (B, gamma, mask_id) = {tuple(want_q.shape)}, got "
                               f"{tuple(q.shape)}.{extra}")
        if q.dtype != torch.float64:
            raise CheckFailure(f"{label}: q must be float64 (params.probs returns it), got {q.dtype}.")
        if forwards.count != 1:
            raise CheckFailure(f"{label}: the drafter ran {forwards.count} forwards; a parallel drafter proposes all "
                               "gamma drafts in one forward over feed and gamma - 1 mask tokens (that is the point).")
        if not torch.allclose(q, want_q, atol=1e-6):
            b, j = (int(v) for v in ((q - want_q).abs().amax(-1) > 1e-6).nonzero()[0])
            hint = _propose_hint(drafter, cache_ref, feed, gamma, params, q)
            if not hint and bool(((want_q[b, j] == 0) & (q[b, j] > 0)).any()):
                hint = (f" It puts probability on tokens that params={params} removes: apply params.probs to the "
                        "logits (temperature, then top_k and top_p), not a softmax of your own.")
            raise CheckFailure(f"{label}: q[{b}, {j}] (the distribution of draft {j + 1} of row {b}) differs from the "
                               f"drafter's: expected {[round(v, 6) for v in want_q[b, j].tolist()]}, got "
                               f"{[round(v, 6) for v in q[b, j].tolist()]}. Draft 1 comes from the output at the last "
                               f"fed token, draft j + 1 from the output at mask j; apply params.probs.{hint}")
        if drafts.shape != want_drafts.shape or drafts.dtype != torch.long:
            raise CheckFailure(f"{label}: drafts must be a long tensor of shape {tuple(want_drafts.shape)}, got "
                               f"{drafts.dtype} of shape {tuple(drafts.shape)}.")
        if params.temperature == 0 and not torch.equal(drafts, want_drafts):
            raise CheckFailure(f"{label}: greedy drafts must be the argmax of each position: expected "
                               f"{want_drafts.tolist()}, got {drafts.tolist()}.")
        picked = q.gather(-1, drafts.clamp(0, q.shape[-1] - 1)[..., None]).squeeze(-1)
        if bool((drafts >= q.shape[-1]).any() | (drafts < 0).any() | (picked <= 0).any()):
            raise CheckFailure(f"{label}: drafts {drafts.tolist()} include a token of probability 0 under its q (or "
                               "the mask): draw draft j from q[:, j].")
        if cache_mine.length != cache_ref.length:
            held = cache_mine.length - cached
            why = (" It still holds the masks: crop it back to the real tokens (cache.crop(start + n)), or the next "
                   "round's real tokens land at the wrong positions." if held > n else
                   " It lost real tokens: keep everything fed (start + n), drop only the masks.")
            raise CheckFailure(f"{label}: afterwards the cache must hold {cache_ref.length} positions (the {cached} it "
                               f"held and the {n} fed), got {cache_mine.length}.{why}")
        if not torch.allclose(cache_mine.k[:, :, :, : cache_ref.length], cache_ref.k[:, :, :, : cache_ref.length],
                              atol=1e-5):
            raise CheckFailure(f"{label}: the cache's keys for the fed tokens differ from a plain forward's: feed the "
                               "tokens at the positions that follow the cache (the default), masks after them.")
    _check_propose_sampling(fn, drafter)
    expect_reproducible(fn, f"{name}(a small random drafter, 2 rows, gamma=3, temperature 1)",
                        lambda seed: (drafter, _propose_case(drafter, 2, 3, 1, 3, 40 + seed)[0],
                                      _propose_case(drafter, 2, 3, 1, 3, 40 + seed)[1], 3, SAMPLING[0],
                                      torch.Generator().manual_seed(seed)))


def _propose_hint(drafter: Llama, cache: KVCache, feed: torch.Tensor, gamma: int, params, q: torch.Tensor) -> str:
    """Name the catalogued slip whose q this is, if one is."""
    for mistake in for_exercise("parallel_propose"):
        length = cache.length
        trial = KVCache(drafter.config, batch_size=feed.shape[0])
        trial.k, trial.v, trial.length = cache.k.clone(), cache.v.clone(), length - feed.shape[1]
        try:
            with torch.no_grad():
                _, wrong_q = mistake.fn(drafter, trial, feed, gamma, params, torch.Generator().manual_seed(0))
        except Exception:
            continue
        if wrong_q.shape == q.shape and torch.allclose(wrong_q.double(), q.double(), atol=1e-6):
            return f" Hint (a known slip gives exactly this q): {mistake.hint}"
    return ""


def _check_propose_sampling(fn: Callable, drafter: Llama, n: int = 3000) -> None:
    """At temperature 1 the pair (draft 1, draft 2) must follow q_1 x q_2 (drawn independently, each from its q)."""
    params, feed = SAMPLING[0], torch.tensor([[1, 4, 2]])
    with torch.no_grad():
        _, q = parallel.parallel_propose(drafter, KVCache(drafter.config), feed, 2, params, torch.Generator())
    exact = {(a, b): float(q[0, 0, a] * q[0, 1, b]) for a in range(q.shape[-1]) for b in range(q.shape[-1])}
    g = torch.Generator().manual_seed(salted(7))
    label = f"parallel_propose(a small random drafter, feed={feed.tolist()}, gamma=2, temperature 1), seeded runs"

    def draw():
        with torch.no_grad():
            drafts, _ = call(fn, label, drafter, KVCache(drafter.config), feed, 2, params, g)
        return tuple(int(t) for t in drafts[0])

    sample_and_compare(draw, n, exact, f"{label}: (draft 1, draft 2)",
                       hint="Draw each draft from its own q (sample(q, generator)), not the argmax, and not from "
                            "logits without params.probs.")


# -- acceptance_by_position ---------------------------------------------------------------------------------


def _rounds(seed: int):
    g = torch.Generator().manual_seed(salted(seed))
    yield "a shorter last round", ([2, 4, 0, 1], [4, 4, 4, 2])
    yield "a shorter first round", ([1, 3, 2], [1, 3, 3])
    yield "one round that accepted everything", ([3], [3])
    for i in range(6):
        gamma = int(torch.randint(1, 7, (1,), generator=g))
        rounds = int(torch.randint(1, 25, (1,), generator=g))
        proposed = [gamma] * rounds
        if i % 2:
            proposed[-1] = int(torch.randint(1, gamma + 1, (1,), generator=g))
        # acceptance falling with depth, like a parallel drafter's
        accepted = []
        for p in proposed:
            k = 0
            while k < p and float(torch.rand((), generator=g)) < 0.9 - 0.15 * k:
                k += 1
            accepted.append(k)
        yield f"{rounds} rounds of gamma {gamma}", (accepted, proposed)
    yield "one round that accepted nothing", ([0], [4])
    yield "no round reaches draft 3", ([0, 1, 0], [3, 3, 3])


def check_acceptance_by_position(fn: Callable) -> None:
    name = "acceptance_by_position"
    mistakes, history = for_exercise(name), []
    for description, (accepted, proposed) in _rounds(1):
        label = f"{name}({description}: accepted={accepted}, proposed={proposed})"
        want = ledger.acceptance_by_position(accepted, proposed)
        got = call_recorded(fn, label, (accepted, proposed), (), [])  # list outputs: hints come from _explain
        history.append(((accepted, proposed), got))
        if not isinstance(got, list) or len(got) != len(want):
            raise CheckFailure(f"{label}: return a list of {len(want)} floats (alpha_1..alpha_max(proposed)), got "
                               f"{got!r}.")
        for k, (a, b) in enumerate(zip(got, want), start=1):
            if isinstance(a, bool) or not isinstance(a, (int, float)):
                raise CheckFailure(f"{label}: alpha_{k} must be a Python float, got {a!r}.")
            if math.isnan(b) != math.isnan(a) or (not math.isnan(b) and not math.isclose(a, b, rel_tol=1e-9)):
                why = (" No round reached that draft: return float('nan'), not 0 or 1 (nothing was measured)."
                       if math.isnan(b) else "")
                hint = _explain(mistakes, history)
                raise CheckFailure(f"{label}: alpha_{k} should be {b!r}, got {a!r}.{why}{hint}")
    for bad, why in ((([2], [1]),  "a round that accepted more than it proposed"),
                     (([1, 0], [2]), "one accepted count and one proposed count per round: the lengths differ"),
                     (([], []), "no rounds at all"),
                     (([-1], [2]), "a negative count")):
        expect_value_error(fn, f"{name}(accepted={bad[0]}, proposed={bad[1]})", *bad, why=why)


# -- best_gamma_by_position -----------------------------------------------------------------------------------------------


class Linear:
    """cost(g) = base + per_token x g: readable in a failure message."""

    def __init__(self, base: float, per_token: float) -> None:
        self.base, self.per_token = base, per_token

    def __call__(self, g: int) -> float:
        return self.base + self.per_token * g

    def __repr__(self) -> str:
        return f"lambda g: {self.base:g} + {self.per_token:g} * g"


class Autoregressive:
    """Drafting g tokens with g forwards of per_forward each."""

    def __init__(self, per_forward: float) -> None:
        self.per_forward = per_forward

    def __call__(self, g: int) -> float:
        return self.per_forward * g

    def __repr__(self) -> str:
        return f"lambda g: {self.per_forward:g} * g"


class Step:
    """cost(g) = low below ``at`` and high from it (a padded shape, a bigger CUDA graph): a curve with two peaks."""

    def __init__(self, low: float, high: float, at: int) -> None:
        self.low, self.high, self.at = low, high, at

    def __call__(self, g: int) -> float:
        return self.low if g < self.at else self.high

    def __repr__(self) -> str:
        return f"lambda g: {self.low:g} if g < {self.at} else {self.high:g}"


def _gamma_cases(seed: int):
    g = torch.Generator().manual_seed(salted(seed))
    verify = Linear(1.0, 0.02)
    yield "alpha 0.8 everywhere, a draft at 5% of a step", ((0.8,) * 6, Autoregressive(0.05), verify)
    yield "a parallel drafter's falling alphas, one pass", ((0.85, 0.7, 0.55, 0.4, 0.3, 0.2, 0.15, 0.1),
                                                             Linear(0.06, 0.002), verify)
    yield "the same alphas drafted autoregressively", ((0.85, 0.7, 0.55, 0.4, 0.3, 0.2, 0.15, 0.1),
                                                       Autoregressive(0.06), verify)
    yield "a tie: alpha_2 = 0 and free drafting", ((0.6, 0.0, 0.9), Linear(0.0, 0.0), Linear(1.0, 0.0))
    yield "one position only", ((0.3,), Autoregressive(0.1), verify)
    yield "a near tie: gamma 5 beats gamma 4 by 0.0009", ((0.9, 0.75, 0.6, 0.45, 0.3, 0.2), Linear(0.1, 0.0), verify)
    yield "a nearer tie: gamma 5 beats gamma 4 by 4e-6", ((0.9, 0.75, 0.6, 0.45, 0.3, 0.2), Linear(0.1, 0.0),
                                                        Linear(1.0, 0.02043))
    yield "two peaks: verifying 4 or more positions needs a bigger batch shape", ((0.95,) * 8, Linear(0.05, 0.0),
                                                                               Step(1.0, 1.6, 4))
    yield "nothing accepted", ((0.0, 0.0), Autoregressive(0.1), verify)
    for _ in range(6):
        n = int(torch.randint(1, 10, (1,), generator=g))
        alphas = tuple(round(a, 3) for a in sorted(torch.rand(n, generator=g).tolist(), reverse=True))
        parallel_draft = bool(torch.rand((), generator=g) < 0.5)
        c = round(float(torch.rand((), generator=g)) * 0.3, 3)
        draft = Linear(c, round(c / 20, 4)) if parallel_draft else Autoregressive(c)
        base = round(float(torch.rand((), generator=g)) * 2 + 0.5, 3)
        per_position = round(float(torch.rand((), generator=g)) * 0.1, 3)
        yield (f"{n} random alphas, {'a parallel' if parallel_draft else 'an autoregressive'} draft",
               (alphas, draft, Linear(base, per_position)))


def check_best_gamma_by_position(fn: Callable) -> None:
    name = "best_gamma_by_position"
    mistakes, history = for_exercise(name), []
    for description, args in _gamma_cases(2):
        alphas, draft, verify = args
        label = f"{name}({description}: alphas={list(alphas)}, draft_cost={draft!r}, verify_cost={verify!r})"
        want = ledger.best_gamma_by_position(*args)
        got = call_recorded(fn, label, args, mistakes, history)
        history.append((args, got))
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailure(f"{label}: return (gamma, speedup), got {got!r}.")
        gamma, speedup = got
        if isinstance(gamma, bool) or not isinstance(gamma, int):
            raise CheckFailure(f"{label}: gamma must be a Python int, got {gamma!r}.")
        speedups = {g: expected_committed_length(alphas[:g]) * verify(0) / (draft(g) + verify(g))
                    for g in range(1, len(alphas) + 1)}
        if gamma != want[0] or not (isinstance(speedup, (int, float)) and math.isclose(speedup, want[1], rel_tol=1e-9)):
            table = ", ".join(f"{g}: {s:.4f}" for g, s in speedups.items())
            tie = (" Ties go to the smaller gamma." if gamma in speedups and speedups[gamma] == want[1] else "")
            raise CheckFailure(f"{label}: expected {want}, got {got!r}. The speedups by gamma: {table}.{tie}"
                               f"{_explain(mistakes, history)}")


# -- select_states ---------------------------------------------------------------------------------------------


def _state_cases(seed: int):
    g = torch.Generator().manual_seed(salted(seed))
    for layers, rows, T in ((1, 1, 1), (2, 3, 4), (3, 4, 6), (1, 5, 2)):
        per_position = [torch.randn(rows, T, 2, 3, 2, generator=g) for _ in range(layers)]
        accepted = torch.randint(0, T, (rows,), generator=g)
        if rows > 2:
            accepted[0], accepted[1] = 0, T - 1  # none accepted, and all
        yield f"{layers} layer(s), {rows} row(s), gamma {T - 1}", per_position, accepted
    per_position = [torch.randn(2, 5, 1, 2, 2, generator=g)]
    yield "int32 accepted", per_position, torch.tensor([3, 1], dtype=torch.int32)
    per_position = [torch.randn(3, 4, 2, 2, 2, generator=g, dtype=torch.float64),
                    torch.randn(3, 4, 2, 2, 2, generator=g).to(torch.bfloat16)]
    yield "float64 and bfloat16 states", per_position, torch.tensor([2, 0, 3])


def check_select_states(fn: Callable) -> None:
    name = "select_states"
    mistakes, history = for_exercise(name), []
    for description, per_position, accepted in _state_cases(3):
        label = f"{name}({description}, accepted={accepted.tolist()})"
        want = hybrid.select_states(per_position, accepted)
        got = call_recorded(fn, label, (per_position, accepted), (), [])  # list outputs: hints come from _explain
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            raise CheckFailure(f"{label}: return a list of {len(want)} tensors, one per recurrent layer, got {got!r:.80}.")
        history.append(((per_position, accepted), got))
        for layer, (a, b) in enumerate(zip(got, want)):
            if isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype != b.dtype:
                raise CheckFailure(f"{label}: layer {layer}'s state must keep its dtype ({b.dtype}), got {a.dtype}: the "
                                   "next round continues from it exactly.")
            if not isinstance(a, torch.Tensor) or a.shape != b.shape:
                raise CheckFailure(f"{label}: layer {layer}'s state must be (B, H, d_key, d_value) = {tuple(b.shape)}, "
                                   f"got {tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__}.")
            if not torch.equal(a, b):
                row = int((a != b).flatten(1).any(1).nonzero()[0])
                per = per_position[layer][row]
                same_as = [t for t in range(per.shape[0]) if torch.equal(per[t], a[row])]
                other = [(r, t) for r in range(per_position[layer].shape[0]) for t in range(per.shape[0])
                         if r != row and torch.equal(per_position[layer][r, t], a[row])]
                which = (f"the state after fed position {same_as[0]}" if same_as else
                         f"row {other[0][0]}'s state (each row keeps its own states)" if other else
                         "no fed position's state")
                raise CheckFailure(
                    f"{label}: row {row} accepted {int(accepted[row])} drafts, so it keeps the state after fed "
                    f"position {int(accepted[row])} (position 0 is the last committed token, position j draft j); "
                    f"layer {layer} got {which}.{_explain(mistakes, history)}")


# -- hybrid_speculative_generate ----------------------------------------------------------------------------------


@cache
def tiny_hybrid(vocab: int = 5, seed: int = 0) -> tuple[hybrid.HybridLM, Llama]:
    """A small random hybrid target (recurrent, attention, recurrent) and a small random draft. A small vocabulary,
    so that drafts are often accepted and rounds keep states after 0, 1, 2 and more drafts."""
    torch.manual_seed(seed)
    target = hybrid.HybridLM(hybrid.HybridConfig(vocab_size=vocab, d_model=32, layout="RAR", n_heads=4, n_kv_heads=2,
                                                 d_ff=64, rec_heads=2, d_key=8, d_value=8, max_seq_len=96))
    with torch.no_grad():
        for name, w in target.named_parameters():
            if not name.endswith("a_proj.bias"):
                w.mul_(6.0)
    draft = Llama(LlamaConfig(vocab_size=vocab, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64,
                              max_seq_len=96))
    with torch.no_grad():
        for w in draft.parameters():
            w.mul_(4.0)
    return target.eval(), draft.eval()


@single_threaded
def check_hybrid_speculative_generate(fn: Callable) -> None:
    name = "hybrid_speculative_generate"
    g = torch.Generator().manual_seed(salted(5))
    target, draft = tiny_hybrid()
    for case in range(6):
        prompt = torch.randint(0, 5, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        gamma, n = 1 + case % 4, 24 + 3 * case
        label = f"{name}(a small random hybrid target and draft, prompt={prompt}, n_tokens={n}, gamma={gamma}, greedy)"
        want = hybrid.hybrid_target_only_generate(target, prompt, n)
        got = expect_token_list(label, call(fn, label, target, draft, prompt, n, gamma, GREEDY, None), n)
        if got != want:
            at = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            raise CheckFailure(f"{label}: greedy output must equal target-only decoding's; it differs from token {at} "
                               f"on: expected {want[at:at + 6]}, got {got[at:at + 6]}."
                               + _hybrid_slip((target, draft, prompt, n, gamma, GREEDY, None), got))
    _check_hybrid_shipped(fn)
    _check_hybrid_sampling(fn)


def _hybrid_slip(args: tuple, got: list[int]) -> str:
    """The hint of the catalogued slip whose greedy output this is, else what to check, in order."""
    for mistake in for_exercise("hybrid_speculative_generate"):
        try:
            if mistake.fn(*args) == got:
                return f" Hint (a known slip gives exactly this output): {mistake.hint}"
        except Exception:
            continue
    return (" Check, in order: the prefill (every prompt token but the last, for both models); each round's target "
            "input (the last committed token, then the drafts); the recurrent states after verification (those after "
            "the last accepted draft, from select_states); and the KV caches, cropped to the committed tokens "
            "(rollback).")


def _check_hybrid_shipped(fn: Callable) -> None:
    from specdec.models import tokenizer
    from specdec.models.checkpoints import load
    from specdec.paths import DATA_DIR

    target, draft = hybrid.load_hybrid(), load(DATA_DIR / "models" / "draft.safetensors")
    prompt = tokenizer.encode("    def close(self):\n        ")
    label = "hybrid_speculative_generate(the course's hybrid target and draft, a code prompt, n_tokens=40, gamma=4)"
    want = hybrid.hybrid_target_only_generate(target, prompt, 40)
    got = expect_token_list(label, call(fn, label, target, draft, prompt, 40, 4, GREEDY, None), 40)
    if got != want:
        raise CheckFailure(f"{label}: greedy output must equal target-only decoding's: expected "
                           f"{tokenizer.decode(want)!r}, got {tokenizer.decode(got)!r}."
                           + _hybrid_slip((target, draft, prompt, 40, 4, GREEDY, None), got))


@torch.no_grad()
def hybrid_joint(target: hybrid.HybridLM, prompt: list[int], params: SamplingParams) -> dict[tuple, float]:
    """The exact probability of every 3-token continuation under the hybrid target, by enumeration."""
    exact = {}
    for seq in itertools.product(range(target.config.vocab_size), repeat=3):
        probs = params.probs(target(torch.tensor([prompt + list(seq[:2])]))[0, -3:])
        exact[seq] = float(probs[0, seq[0]] * probs[1, seq[1]] * probs[2, seq[2]])
    return exact


def _check_hybrid_sampling(fn: Callable, n: int = 1500) -> None:
    target, draft = tiny_hybrid()
    params, prompt = SAMPLING[0], [1, 3]
    exact = hybrid_joint(target, prompt, params)
    g = torch.Generator().manual_seed(salted(9))
    label = f"hybrid_speculative_generate(small random models, prompt={prompt}, n_tokens=3, gamma=2, temperature 1)"
    sample_and_compare(lambda: tuple(expect_token_list(label, call(fn, label, target, draft, prompt, 3, 2, params, g), 3)),
                       n, exact, f"{label}, seeded runs: the 3 tokens",
                       hint="Verify with the request's params (verify_drafts(drafts, q, logits, params, generator)), "
                            "with q what the drafts were drawn from; keep the recurrent state of the last accepted "
                            "draft.")


# -- committed_logprobs ------------------------------------------------------------------------------------------


def _logprob_cases(seed: int):
    g = torch.Generator().manual_seed(salted(seed))
    cases = ((1, 1, 5, None, 3), (3, 4, 7, None, 3), (4, 5, 6, 0.7, 3), (2, 3, 9, 1.6, 3), (3, 6, 4, 1.0, 3),
             (2, 3, 5, None, 400))  # the last: logit gaps of hundreds, where log(softmax) underflows to -inf
    for rows, T, V, temperature, scale in cases:
        logits = torch.randn(rows, T, V, generator=g, dtype=torch.float32) * scale
        n_committed = torch.randint(1, T + 1, (rows,), generator=g)
        if rows > 2:
            n_committed[0], n_committed[1] = 1, T
        committed = torch.randint(0, V, (rows, T), generator=g)
        for b in range(rows):  # padding: any value, out of range in even rows, valid ids (0) in odd ones
            pad = torch.tensor([-1, V + 100])[torch.arange(T - int(n_committed[b])) % 2] if b % 2 == 0 else 0
            committed[b, int(n_committed[b]):] = pad
        yield (f"{rows} row(s), T={T}, V={V}, temperature={temperature}, logits of scale {scale}, "
               f"n_committed={n_committed.tolist()}",
               (logits, committed, n_committed, temperature))


def check_committed_logprobs(fn: Callable) -> None:
    name = "committed_logprobs"
    mistakes, history = for_exercise(name), []
    for description, args in _logprob_cases(4):
        label = f"{name}({description}, committed={args[1].tolist()})"
        want = drift.committed_logprobs(*args)
        got = call_recorded(fn, label, args, (), [])  # list outputs: hints come from _explain
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            raise CheckFailure(f"{label}: return a list of {len(want)} tensors, one per row, got {type(got).__name__}.")
        history.append((args, got))
        for b, (a, w) in enumerate(zip(got, want)):
            if not isinstance(a, torch.Tensor) or a.shape != w.shape:
                raise CheckFailure(f"{label}: row {b} must be a tensor of shape ({len(w)},) (its n_committed), got "
                                   f"{tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__}.")
            if a.dtype != torch.float64:
                raise CheckFailure(f"{label}: row {b} must be float64 (compute the log-softmax in float64), got "
                                   f"{a.dtype}.")
            if not torch.allclose(a, w, rtol=1e-9, atol=1e-12):
                j = int((a - w).abs().argmax())
                if torch.allclose(a, w, rtol=1e-5, atol=1e-6):
                    raise CheckFailure(f"{label}: row {b}, committed token {j}: expected {float(w[j])!r}, got "
                                       f"{float(a[j])!r}: right to about 7 digits, then off, the mark of float32 "
                                       "arithmetic. Cast the logits to float64 before dividing by the temperature "
                                       f"and taking log_softmax.{_explain(mistakes, history)}")
                what = ("the raw distribution (temperature None): log_softmax(logits)" if args[3] is None else
                        f"the distribution after temperature {args[3]}: log_softmax(logits / {args[3]})")
                raise CheckFailure(f"{label}: row {b}, committed token {j}: expected log-probability {float(w[j]):.6f}, "
                                   f"got {float(a[j]):.6f}. Position j of the verify logits scores committed token j; "
                                   f"read {what} there.{_explain(mistakes, history)}")
    expect_value_error(fn, f"{name}(temperature=0)", torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long),
                       torch.ones(1, dtype=torch.long), 0.0,
                       why="temperature 0 is greedy: its distribution is a point mass, with no log-probabilities")
