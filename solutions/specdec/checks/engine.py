"""Hidden-test checks for notebook 05 (the KV cache and a real speculative loop).

The learner's functions run on real Llama models wrapped in a :class:`RecordingModel`,
so the checks see every forward: which tokens were fed, and how long the cache was
before. From that record they check the walk-the-shapes rule round by round, not only
the final tokens (a loop without the draft's catch-up still produces the right greedy
output, only slower).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import cache

import torch

from specdec import engine
from specdec.checks.core import CheckFailure, call, diagnose, expect_reproducible, single_threaded, upstream_note
from specdec.checks.memo import memoized
from specdec.checks.seeds import salted
from specdec.checks.stats import sample_and_compare
from specdec.greedy import greedy_verify
from specdec.mistakes import for_exercise
from specdec.models.model import KVCache, Llama, LlamaConfig
from specdec.params import GREEDY, SamplingParams, StopCriteria, accept_until_stop
from specdec.paths import DATA_DIR
from specdec.recording import RecordingModel, SpeculativeEngine

SAMPLING_PARAMS = (SamplingParams(1.0), SamplingParams(0.8, top_k=4, top_p=0.9))


@cache
def tiny_pair(vocab: int = 32, noise: float = 0.3, seed: int = 0) -> tuple[Llama, Llama]:
    """A small random target and a draft that is the target with noisy weights (so most,
    not all, drafts pass). Fast enough for thousands of seeded runs. Not salted: the models are the course's
    fixture (the checks' power was measured on them); what a grading run salts is the inputs and the draws."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=96)
    target = Llama(config)
    with torch.no_grad():
        for w in target.parameters():
            w.mul_(8.0)  # sharper distributions than the 0.02 init gives
    draft = Llama(config)
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for w in draft.parameters():
            w.add_(noise * w.std() * torch.randn_like(w))
    return target.eval(), draft.eval()


@cache
def sampling_pair() -> tuple[Llama, Llama]:
    """``tiny_pair(vocab=6, noise=0.5, seed=3)``, what the sampling checks run a loop on a thousand times and more,
    with a memory of forwards (:mod:`specdec.checks.memo`): the same outputs bit for bit, so the same verdicts, with
    each distinct forward computed once instead of at every run."""
    target, draft = tiny_pair(vocab=6, noise=0.5, seed=3)
    return memoized(target), memoized(draft)


@cache
def shipped_pair() -> tuple[Llama, Llama]:
    """The course's trained target and draft from data/models."""
    from specdec.models.checkpoints import load_pair

    return load_pair(DATA_DIR / "models")


def _filled_cache(config: LlamaConfig, length: int) -> KVCache:
    cache = KVCache(config)
    cache.advance(length)
    return cache


def expect_token_list(label: str, got, n_tokens: int) -> list[int]:
    """The generate exercises return exactly n_tokens Python ints."""
    if isinstance(got, torch.Tensor):
        raise CheckFailure(f"{label}: return a list of Python ints, not a tensor (use .tolist()).")
    if not isinstance(got, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in got):
        shown = [type(t).__name__ for t in got[:3]] if isinstance(got, list) else type(got).__name__
        raise CheckFailure(f"{label}: return a list of Python ints; got {shown}... Convert with int(...) or .tolist() "
                           "(for example greedy_verify(...).tolist(), int(sample(...))).")
    if len(got) != n_tokens:
        raise CheckFailure(f"{label}: return exactly n_tokens = {n_tokens} new tokens (cut the surplus of the last "
                           f"round), got {len(got)}.")
    return got


# -- target_only_generate --------------------------------------------------------------


@single_threaded
def check_target_only_generate(fn: Callable) -> None:
    """Greedy: equal to the reference on small random models and the shipped ones, one
    cached forward per token; sampling: three tokens follow the exact joint distribution."""
    for what, target, _, prompt, n_tokens, _ in _greedy_cases():
        label = f"target_only_generate({what}, len(prompt)={len(prompt)}, n_tokens={n_tokens}, greedy)"
        rec = RecordingModel(target)
        got = expect_token_list(label, call(fn, label, rec, list(prompt), n_tokens, GREEDY, None), n_tokens)
        if any(c.cache is None for c in rec.calls):
            raise CheckFailure(f"{label}: the target was called without a KV cache. Prefill prompt[:-1] once, then feed "
                               "one token per step: each step then costs one position, not the whole sequence.")
        steps = rec.calls[1:] if len(prompt) > 1 else rec.calls
        if len(prompt) > 1 and (rec.calls[0].cache_len != 0 or rec.calls[0].tokens != prompt[:-1]):
            raise CheckFailure(f"{label}: the first forward should prefill prompt[:-1] into the empty cache (the last "
                               "prompt token is the first step's input).")
        if len(steps) != n_tokens or any(len(c.tokens) != 1 or c.cache_len != len(prompt) - 1 + i
                                         for i, c in enumerate(steps)):
            raise CheckFailure(f"{label}: after the prefill, expected {n_tokens} forwards of one token each, at cache "
                               f"lengths {len(prompt) - 1}, {len(prompt)}, ...; got "
                               f"{[(c.cache_len, len(c.tokens)) for c in steps][:6]} (cache length, tokens fed).")
        expected = engine.target_only_generate(target, prompt, n_tokens)
        if got != expected:
            raise CheckFailure(f"{label}: expected {expected[:12]}..., got {str(got)[:80]}. Greedy picks the argmax "
                               "of the last position's logits (params.probs gives a one-hot at temperature 0).")
    _check_sampling(fn, "target_only_generate")
    target = tiny_pair()[0]
    expect_reproducible(fn, "target_only_generate(small random model, prompt=[1, 2], n_tokens=8, temperature 1)",
                        lambda seed: (target, [1, 2], 8, SamplingParams(1.0), torch.Generator().manual_seed(salted(seed))))


# -- rollback -----------------------------------------------------------------------


def check_rollback(fn: Callable) -> None:
    """Cache lengths and the pending tokens for P in {3, 7}, gamma in {1, 3, 4}, every k."""
    config = tiny_pair()[0].config
    for P, gamma, repeated in [(P, g, False) for P, g in itertools.product((7, 3), (4, 3, 1))] + [(5, 4, True)]:
        for k in sorted(range(gamma + 1), key=lambda k: (k != gamma // 2, k)):  # a middle k first: clearest hints
            # repeated: the drafts are one token over and over (indentation in code), and the target's correction is
            # that token too, so only k, never the values, tells a full acceptance from a rejection
            drafts = [12] * gamma if repeated else [10 + i for i in range(gamma)]
            committed = drafts[:k] + [12 if repeated else 30]
            target_cache = _filled_cache(config, P + gamma)  # after verifying gamma + 1 positions
            draft_cache = _filled_cache(config, P + gamma - 1)  # it never fed its last draft
            label = (f"rollback(P={P}, drafts={drafts}, committed={committed}) with the target cache at "
                     f"{P + gamma} and the draft cache at {P + gamma - 1}")
            pending = call(fn, label, target_cache, draft_cache, P, list(drafts), list(committed))
            want_target = P + k
            if target_cache.length != want_target:
                raise CheckFailure(f"{label}: the target cache should be cropped to P + k = {want_target} (k = {k} "
                                   f"accepted), but it has length {target_cache.length}."
                                   f"{_target_hint(target_cache.length, P, k, gamma)}")
            want_draft = P + k if k < gamma else P + gamma - 1
            if draft_cache.length != want_draft:
                raise CheckFailure(f"{label}: the draft cache should have length {want_draft}, got {draft_cache.length}."
                                   + (" After a full acceptance it holds P + gamma - 1 entries: every accepted draft "
                                      "but the last, which it never fed. Leave it as it is." if k == gamma else
                                      " Crop it like the target's: P + k entries."))
            want_pending = committed[-1:] if k < gamma else [drafts[-1], committed[-1]]
            if not isinstance(pending, list) or pending != want_pending:
                raise CheckFailure(f"{label}: the draft's pending input should be {want_pending}, got {pending!r}."
                                   + (" After a full acceptance the draft must catch up: it never fed its own last "
                                      "draft, so next round it feeds that draft and the bonus token, in one forward."
                                      if k == gamma else " Only the new target token is still unfed."))


def _target_hint(got: int, P: int, k: int, gamma: int) -> str:
    if got == P + gamma:
        return " It was not cropped at all: the rejected drafts' entries stay in the cache (no rollback)."
    if got == P + k + 1:
        return " Off by one: the new token (the target's correction or bonus) has no KV entry yet; it is the next input."
    if got == P + k - 1:
        return " Off by one: you dropped the last accepted draft's entry."
    if got in (P - 1, P):
        return (" The accepted drafts are missing: the cache must advance by the k accepted tokens, not go back to the "
                "round's start.")
    return ""


# -- propose ------------------------------------------------------------------------


@single_threaded
def check_propose(fn: Callable) -> None:
    """Drafts, q rows and cache growth for greedy and sampling, 1 or 2 pending tokens;
    then the joint distribution of two sampled drafts by seeded Monte Carlo."""
    draft = tiny_pair()[1]
    context = [3, 1, 4, 1, 5, 9, 2, 6]
    for params, n_pending, gamma in itertools.product((GREEDY, *SAMPLING_PARAMS), (1, 2), (1, 3)):
        label = f"propose(gamma={gamma}, pending={context[-n_pending:]}, params={params}) after {context[:-n_pending]}"
        cache = KVCache(draft.config)
        draft(torch.tensor([context[:-n_pending]]), cache)
        recorder = RecordingModel(draft)
        got = call(fn, label, recorder, cache, context[-n_pending:], gamma, params, torch.Generator().manual_seed(salted(0)))
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailure(f"{label}: return (drafts, q), got {got!r}")
        drafts, q = got
        if not isinstance(drafts, list) or len(drafts) != gamma or not all(isinstance(t, int) for t in drafts):
            raise CheckFailure(f"{label}: drafts should be a list of {gamma} Python ints, got {drafts!r}")
        if not isinstance(q, torch.Tensor) or q.shape != (gamma, draft.config.vocab_size):
            raise CheckFailure(f"{label}: q should be a tensor of shape ({gamma}, V={draft.config.vocab_size}), got "
                               f"{getattr(q, 'shape', q)!r}")
        if q.dtype != torch.float64:
            raise CheckFailure(f"{label}: q is {q.dtype}; the docstring promises float64 (params.probs gives it): the "
                               "verifier divides p by q, and rounding q to float32 moves acceptance probabilities.")
        if any(c.cache is not cache for c in recorder.calls):
            raise CheckFailure(f"{label}: call the draft with the cache it was given, every time.")
        if len(recorder.calls) != gamma:
            raise CheckFailure(f"{label}: the draft ran {len(recorder.calls)} forwards (fed "
                               f"{[c.tokens for c in recorder.calls]}); {gamma} drafts need exactly gamma = {gamma}: "
                               "all pending tokens in the first forward, then each new draft alone, never the last.")
        if cache.length != len(context) + gamma - 1:
            extra = cache.length - (len(context) + gamma - 1)
            raise CheckFailure(
                f"{label}: the draft cache should grow from {len(context) - n_pending} to {len(context) + gamma - 1} "
                f"(the pending tokens and drafts 1..gamma-1), but it is {cache.length}."
                + (" You also fed the last draft: it is not needed yet (the target checks it; if it is accepted the "
                   "draft catches up next round)." if extra == 1 else "")
                + (" Feed every pending token in the first forward: after a full acceptance there are two (the "
                   "draft's own last draft and the bonus)." if extra == -1 and n_pending == 2 else ""))
        with torch.no_grad():
            full = draft(torch.tensor([context + drafts[:-1]]))[0, len(context) - 1 :]  # (gamma, V), no cache
        want = params.probs(full)
        if not torch.allclose(q.to(torch.float64), want, atol=1e-4):  # cached vs full forward: float32 rounding
            row = int((q.to(torch.float64) - want).abs().amax(-1).argmax())
            raise CheckFailure(
                f"{label}: q[{row}] is not the distribution draft {row} was drawn from. Expected "
                f"{[round(x, 4) for x in want[row].tolist()]}, got {[round(x, 4) for x in q[row].tolist()]}. "
                "q must be params.probs(logits) of the draft's last position, the same processed distribution the "
                "token is sampled from (one-hot at temperature 0), at the right position.")
        if params.temperature == 0 and drafts != want.argmax(-1).tolist():
            raise CheckFailure(f"{label}: greedy drafts should be the argmax of q each time: expected "
                               f"{want.argmax(-1).tolist()}, got {drafts}.")
    _check_propose_samples(fn, sampling_pair()[1])

    def fresh(seed: int) -> tuple:
        cache = KVCache(draft.config)
        draft(torch.tensor([context[:-1]]), cache)
        return draft, cache, context[-1:], 4, SamplingParams(1.0), torch.Generator().manual_seed(salted(seed))

    expect_reproducible(lambda *a: fn(*a)[0], "propose(small random draft, gamma=4, temperature 1): the drafts", fresh)


def _check_propose_samples(fn: Callable, draft: Llama, n: int = 1500) -> None:
    params, context, gamma = SamplingParams(1.0), [3, 1, 4, 1, 5], 2
    with torch.no_grad():
        first = params.probs(draft(torch.tensor([context]))[0, -1])
        second = params.probs(draft(torch.tensor([context + [y] for y in range(draft.config.vocab_size)]))[:, -1])
    exact = {(a, b): float(first[a] * second[a, b]) for a in range(len(first)) for b in range(len(first))}
    g = torch.Generator().manual_seed(salted(5))
    label = f"propose(gamma={gamma}, params={params}) after {context}, seeded runs"

    def draw() -> tuple:
        cache = KVCache(draft.config)
        with torch.no_grad():  # the check's own prefill (the same K and V; no autograd graph, so it is memoized)
            draft(torch.tensor([context[:-1]]), cache)
        drafts, _ = call(fn, label, draft, cache, context[-1:], gamma, params, g)
        return tuple(drafts)
    sample_and_compare(draw, n, exact, label + ": the pair of drafts",
                       hint="Sample each draft from q with the generator (e.g. specdec.sampling.sample(q, generator)).")


# -- speculative_generate -------------------------------------------------------------


@single_threaded
def check_speculative_generate(fn: Callable) -> None:
    """Greedy on a small random pair and on the shipped checkpoints: output equal to
    target-only greedy and every round's cache lengths per the walk-the-shapes rule;
    sampling: the first three tokens follow the target's exact joint distribution."""
    requires = [("propose", check_propose), ("rollback", check_rollback)]
    try:
        _check_greedy(fn)
        _check_sampling(fn, "speculative_generate")
        target, draft = tiny_pair()
        expect_reproducible(fn, "speculative_generate(small random models, prompt=[1, 2], n_tokens=10, gamma=3, "
                                "temperature 1)",
                            lambda seed: (target, draft, [1, 2], 10, 3, SamplingParams(1.0),
                                          torch.Generator().manual_seed(salted(seed))))
    except CheckFailure as failure:
        note = upstream_note(fn, requires)
        raise CheckFailure(str(failure) + note) from None


def _greedy_cases():
    target, draft = tiny_pair()
    for gamma, prompt in ((1, [5, 9]), (3, [1, 2, 3, 4]), (5, [7])):
        yield "small random models", target, draft, prompt, 30, gamma
    target, draft = shipped_pair()
    from specdec.models import corpus, tokenizer

    for name, text in (("math", corpus.math_prompts(1)[0]), ("code", corpus.code_prompts(1)[0])):
        yield f"shipped models, {name} prompt", target, draft, tokenizer.encode(text), 40, 4


def _check_greedy(fn: Callable) -> None:
    for what, target, draft, prompt, n_tokens, gamma in _greedy_cases():
        label = f"speculative_generate({what}, len(prompt)={len(prompt)}, n_tokens={n_tokens}, gamma={gamma}, greedy)"
        t_rec, d_rec = RecordingModel(target, keep_logits=True), RecordingModel(draft)
        got = expect_token_list(label, call(fn, label, t_rec, d_rec, list(prompt), n_tokens, gamma, GREEDY, None),
                                n_tokens)
        _check_rounds(label, prompt, gamma, t_rec, d_rec, n_tokens)
        expected = engine.target_only_generate(target, prompt, n_tokens)
        if got != expected:
            first = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
            raise CheckFailure(f"{label}: expected target-only greedy's {n_tokens} tokens; yours differ from new token "
                               f"{first} on (expected {expected[first:first + 5]}..., got {str(got)[:80]}).")


def _check_rounds(label: str, prompt: list[int], gamma: int, t_rec: RecordingModel, d_rec: RecordingModel,
                  n_tokens: int | None = None) -> None:
    """Replay the record: per round, the target's cache must hold P - 1 entries and be fed
    [last committed token, gamma drafts]; the draft must make gamma forwards, each continuing
    the sequence it should have seen (committed tokens, then this round's drafts); with
    ``n_tokens``, no round may start once n_tokens new tokens are committed."""
    for who, rec in (("target", t_rec), ("draft", d_rec)):
        if any(c.cache is None for c in rec.calls):
            raise CheckFailure(f"{label}: the {who} was called without a KV cache: every forward must continue its "
                               "cache (recomputing the whole sequence each round is exactly the cost the cache avoids).")
    verify = t_rec.calls
    if len(prompt) > 1:
        if not verify or verify[0].cache_len != 0 or verify[0].tokens != prompt[:-1]:
            raise CheckFailure(f"{label}: the first target forward should prefill prompt[:-1] into an empty cache (the "
                               "last prompt token is the first round's input).")
        verify = verify[1:]
    sequence, previous = list(prompt), -1
    for i, c in enumerate(verify, start=1):
        P = len(sequence)
        if n_tokens is not None and P - len(prompt) >= n_tokens:
            raise CheckFailure(f"{label}, round {i}: {P - len(prompt)} new tokens were already committed (n_tokens = "
                               f"{n_tokens}), yet the loop ran another round: stop as soon as you have n_tokens; the "
                               "extra round costs a draft pass and a target forward for tokens that are thrown away.")
        if len(c.tokens) != gamma + 1:
            raise CheckFailure(f"{label}, round {i}: feed the target the last committed token and the {gamma} drafts "
                               f"({gamma + 1} positions) in one forward; it got {len(c.tokens)}.")
        if c.cache_len != P - 1:
            raise CheckFailure(f"{label}, round {i}: {P} tokens were committed before this round, so the target cache "
                               f"should hold P - 1 = {P - 1} entries when it verifies, but it held {c.cache_len}. After "
                               "each round crop it to P + k (the prefix and the k accepted drafts).")
        if c.tokens[0] != sequence[-1]:
            raise CheckFailure(f"{label}, round {i}: the target's first input should be the last committed token "
                               f"{sequence[-1]}, got {c.tokens[0]}.")
        working = sequence + c.tokens[1:]  # what the draft should have seen by now
        this_round = [dc for dc in d_rec.calls if previous < dc.order < c.order]
        fed = sum(len(dc.tokens) for dc in this_round if not (i == 1 and dc.cache_len == 0))
        if fed > gamma + 1:
            raise CheckFailure(f"{label}, round {i}: the draft was fed {fed} tokens; a round needs at most gamma + 1 = "
                               f"{gamma + 1} (two pending tokens and gamma - 1 drafts). Roll its cache back instead of "
                               "refilling it.")
        drafting = [dc for dc in this_round if not (i == 1 and dc.cache_len == 0 and len(prompt) > 1)]  # no prefill
        if len(drafting) != gamma:
            raise CheckFailure(f"{label}, round {i}: the draft ran {len(drafting)} forwards for {gamma} drafts; it "
                               f"should run exactly gamma = {gamma}: the pending tokens (one, or two after a full "
                               "acceptance) go into the first forward together, then one forward per new draft, and "
                               "the last draft is never fed.")
        for dc in this_round:
            if working[dc.cache_len : dc.cache_len + len(dc.tokens)] != dc.tokens:
                raise CheckFailure(
                    f"{label}, round {i}: the draft was fed {dc.tokens} at cache position {dc.cache_len}, but the "
                    f"sequence there is {working[dc.cache_len : dc.cache_len + len(dc.tokens)]}. After a full "
                    "acceptance the draft must catch up (feed its own last draft and the bonus); after a rejection its "
                    "cache must be cropped to P + k.")
        previous = c.order
        sequence += greedy_verify(torch.tensor(c.tokens[1:]), c.logits).tolist()


@torch.no_grad()
def target_joint(target: Llama, prompt: list[int], params: SamplingParams) -> dict[tuple[int, int, int], float]:
    """The exact probability of every 3-token continuation under the target, by enumeration."""
    exact = {}
    for seq in itertools.product(range(target.config.vocab_size), repeat=3):
        probs = params.probs(target(torch.tensor([prompt + list(seq[:2])]))[0, -3:])  # (3, V)
        exact[seq] = float(probs[0, seq[0]] * probs[1, seq[1]] * probs[2, seq[2]])
    return exact


def target_joint_after_first(target: Llama, prompt: list[int], params: SamplingParams) -> dict[tuple[int, int, int], float]:
    """P(t2, t3, t4) under the target, enumerated: the sum over t1 of P(t1) P(t2, t3, t4 | t1). For loops whose
    first token comes from the prefill, so that the first round of drafts decides tokens 2 to 4."""
    with torch.no_grad():
        first = params.probs(target(torch.tensor([prompt]))[0, -1])
    joint: dict[tuple[int, int, int], float] = {}
    for t1 in range(target.config.vocab_size):
        for seq, p in target_joint(target, prompt + [t1], params).items():
            joint[seq] = joint.get(seq, 0.0) + float(first[t1]) * p
    return joint


def _check_sampling(fn: Callable, name: str, n: int = 1500, through: Callable | None = None) -> None:
    """``through``: runs ``fn`` on ``through(model)`` instead of each model (the same weights behind another
    implementation, :mod:`specdec.models.pretrained`); the exact joint is always the course model's."""
    target, draft = tiny_pair(vocab=6, noise=0.5, seed=3)
    params, prompt = SAMPLING_PARAMS[1], [1, 2]
    exact = target_joint(target, prompt, params)
    g = torch.Generator().manual_seed(salted(0))
    models = (target, draft) if through is not None else sampling_pair()  # the same outputs, fewer forwards
    models = models[:1] if name == "target_only_generate" else models
    models = tuple(map(through, models)) if through is not None else models
    gamma = () if name == "target_only_generate" else (2,)
    label = f"{name}(small random models, prompt={prompt}, n_tokens=3{', gamma=2' if gamma else ''}, params={params})"
    sample_and_compare(lambda: tuple(expect_token_list(label, call(fn, label, *models, prompt, 3, *gamma, params, g), 3)),
                       n, exact, f"{label}, seeded runs: the 3 tokens",
                       hint="Sample with the request's params: params.probs(logits) applies temperature and top-k."
                        + (" At temperature > 0 verify with verify_chain(params.probs(target logits), q, drafts, "
                           "generator), where q is what the drafts were drawn from." if gamma else ""))


# -- accept_until_stop -------------------------------------------------------------------


def _stop_cases(seed: int = 0, n: int = 300):
    """(description, (output, committed, stop)) for hand-picked and random valid states: the output
    so far has hit no stop yet (a finished request gets no further rounds)."""
    S = StopCriteria
    yield "no stop in this round", ([1, 2], [3, 4, 5], S(10))
    yield "stop token in the middle", ([1, 2], [3, 0, 5, 6], S(10, (0,)))
    yield "stop token first", ([1], [0, 5, 6], S(10, (0,)))
    yield "stop token last (the target's own token)", ([1], [5, 6, 0], S(10, (0,)))
    yield "two stops: the first ends it", ([1], [5, 7, 6, 0], S(10, (0, 6)))
    yield "max_tokens inside the round", ([1, 2], [3, 4, 5], S(4))
    yield "max_tokens at the round's last token", ([1, 2], [3, 4], S(4))
    yield "max_tokens at the first token", ([1, 2, 3], [4, 5, 6], S(4))
    yield "max_tokens before a stop token in the same round", ([1, 2], [3, 4, 0, 5], S(3, (0,)))
    yield "stop sequence inside the round", ([1], [5, 8, 9, 6], S(10, stop_sequences=((8, 9),)))
    yield "stop sequence across rounds", ([7, 8], [9, 1, 2], S(10, stop_sequences=((8, 9),)))
    yield "stop sequence across two rounds back", ([7, 8], [9, 4, 2], S(10, stop_sequences=((7, 8, 9),)))
    yield "stop sequence longer than the output", ([8], [9, 4], S(10, stop_sequences=((5, 8, 9),)))
    yield "stop sequence of one token", ([1], [2, 3, 4], S(10, stop_sequences=((3,),)))
    yield "empty output, stop at once", ([], [0, 1], S(5, (0,)))
    yield "stop token already in the prompt's last token is no stop", ([], [4, 5], S(5, (3,)))
    rng = torch.Generator().manual_seed(salted(seed))

    def rand(hi: int, size: int = 1) -> list[int]:
        return torch.randint(0, hi, (size,), generator=rng).tolist()

    made = 0
    while made < n:
        stop_ids = tuple(sorted(set(rand(6, rand(3)[0]))))
        sequences = tuple(tuple(rand(4, 1 + rand(3)[0])) for _ in range(rand(3)[0]))
        output = rand(6, rand(6)[0])
        committed = rand(6, 1 + rand(6)[0])
        stop = StopCriteria(len(output) + 1 + rand(8)[0], stop_ids, sequences)
        hit = any(t in stop_ids for t in output) or any(
            output[: j + 1][-len(s):] == list(s) for j in range(len(output)) for s in sequences)
        if hit:
            continue  # not a reachable state: the request would have finished earlier
        made += 1
        yield f"random case {made}", (output, committed, stop)


def check_accept_until_stop(fn: Callable) -> None:
    """Equal to the reference on hand-picked and random reachable states; returns (list of ints,
    bool); leaves the caller's lists alone."""
    history = []
    for description, (output, committed, stop) in _stop_cases():
        label = f"accept_until_stop({description}: output={output}, committed={committed}, {stop})"
        before = (list(output), list(committed))
        got = call(fn, label, output, committed, stop)
        if (output, committed) != before:
            raise CheckFailure(f"{label}: your function changed its arguments (output is now {output}, committed "
                               f"{committed}). Build a new list: the caller's output must only grow by what you return.")
        history.append(((list(output), list(committed), stop), got))
        expected = accept_until_stop(output, committed, stop)
        ok_type = (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], list)
                   and all(isinstance(t, int) and not isinstance(t, bool) for t in got[0]) and isinstance(got[1], bool))
        if not ok_type:
            raise CheckFailure(f"{label}: return a tuple (emitted, finished): a list of Python ints and a bool; got "
                               f"{got!r}.")
        if got[0] is committed:
            raise CheckFailure(f"{label}: emitted is the caller's committed list itself; return a new list "
                               "(list(committed) or a slice): the caller keeps using committed after the call.")
        if got != expected:
            hint = diagnose(for_exercise("accept_until_stop"), history, rel=0.0)
            raise CheckFailure(f"{label}: expected {expected}, got {got}. Walk the committed tokens in order; the "
                               "first one that is the max_tokens-th new token, a stop token, or the end of a stop "
                               "sequence (which may start in output) is the last one emitted, and finished is True."
                               f"{hint}")


# -- generate_until_stop -----------------------------------------------------------------


@cache
def _stop_scenarios(task: str, gamma: int = 4, n: int = 40) -> tuple[list[int], list[tuple]]:
    """The shipped models' prompt for ``task`` and stops placed where the reference run commits
    several tokens in one round, so that tokens follow the stop inside its round:
    (description, StopCriteria, expected output, target forwards the run needs)."""
    from specdec.models import corpus, tokenizer

    target, draft = shipped_pair()
    prompt = tokenizer.encode(corpus.math_prompts(2)[1] if task == "math" else corpus.code_prompts(2)[1])
    base = engine.target_only_generate(target, prompt, n)
    ends, position = [], 0
    for r in SpeculativeEngine(target, draft).generate(prompt, n, gamma).rounds:
        position += r.committed
        ends.append(position - 1)  # index of each round's last new token

    def forwards(j: int) -> int:  # the prefill, then every round up to the one that commits new token j
        return 1 + next(i for i, end in enumerate(ends) if end >= j) + 1

    inside = [j for j in range(2, n - 1) if j not in ends and j - 1 not in ends]
    spanning = [j for j in range(2, n - 1) if j not in ends and j - 1 in ends]
    scenarios = [("max_tokens only", StopCriteria(n), base, forwards(n - 1))]
    if task == "math":
        j = next(j for j in inside if base[j] not in base[:j])  # a stop token not seen before new token j
        scenarios.append((f"stop token {base[j]} at new token {j}, inside a round", StopCriteria(n, (base[j],)),
                          base[: j + 1], forwards(j)))
    else:
        j = next(j for j in spanning if not any(base[i - 1 : i + 1] == base[j - 1 : j + 1] for i in range(1, j)))
        scenarios.append((f"stop sequence {base[j - 1 : j + 1]} ending at new token {j}, starting in the previous "
                          "round", StopCriteria(n, stop_sequences=(tuple(base[j - 1 : j + 1]),)),
                          base[: j + 1], forwards(j)))
    j = inside[len(inside) // 2]
    scenarios.append((f"max_tokens = {j + 1}, inside a round", StopCriteria(j + 1), base[: j + 1], forwards(j)))
    return prompt, scenarios


@torch.inference_mode()
def _check_cache_holds(label: str, who: str, model: Llama, cache, sequence: list[int], lengths: set[int]) -> None:
    if not isinstance(cache, KVCache):
        raise CheckFailure(f"{label}: return (output, target_cache, draft_cache) with the two KVCache objects; got a "
                           f"{type(cache).__name__} for the {who}'s cache.")
    config, k = model.config, getattr(cache, "k", None)  # the course's cache (a Hugging Face one has no k)
    if k is not None and (tuple(k.shape[:3]) != (config.n_layers, 1, config.n_kv_heads) or k.shape[-1] != config.head_dim):
        raise CheckFailure(f"{label}: the cache returned as the {who}'s has {k.shape[0]} layers of "
                           f"{k.shape[2]} KV heads of size {k.shape[-1]}, not the {who}'s "
                           f"{config.n_layers} x {config.n_kv_heads} x {config.head_dim}: return (output, target_cache, "
                           "draft_cache) in that order.")
    if cache.length not in lengths:
        want = " or ".join(str(n) for n in sorted(lengths))
        raise CheckFailure(f"{label}: the {who}'s cache holds {cache.length} entries; after the last round it should "
                           f"hold {want} (the prompt and the output but the last token{' or two' if len(lengths) > 1 else ''}"
                           "). Roll back with the emitted tokens, not everything the round committed: the KV of tokens "
                           "after the stop (and of rejected drafts) must go.")
    rest = sequence[cache.length:]
    got = model(torch.tensor([rest]), cache)[0, -1]
    fresh = model(torch.tensor([sequence]))[0, -1]
    if not torch.allclose(got, fresh, atol=1e-4, rtol=1e-4):
        raise CheckFailure(f"{label}: the {who}'s cache has the right length but not the right contents: continuing it "
                           "with the missing tokens does not give the logits of a fresh forward over prompt + output.")


@single_threaded
def check_generate_until_stop(fn: Callable) -> None:
    """Greedy on the shipped models: stops inside rounds and across rounds give target-only greedy
    cut at the stop, no forward after the finishing round, rounds per the walk-the-shapes rule and
    caches that hold exactly the output; sampling: the truncated 3-token joint distribution."""
    requires = [("accept_until_stop", check_accept_until_stop), ("propose", check_propose),
                ("rollback", check_rollback)]
    try:
        _check_stops_greedy(fn)
        _check_stops_sampling(fn)
        target, draft = tiny_pair()
        stop = StopCriteria(12, (5,))
        expect_reproducible(lambda *a: fn(*a)[0], f"generate_until_stop(small random models, prompt=[1, 2], {stop}, "
                                                  "gamma=3, temperature 1): the output",
                            lambda seed: (target, draft, [1, 2], stop, 3, SamplingParams(1.0),
                                          torch.Generator().manual_seed(salted(seed))))
    except CheckFailure as failure:
        raise CheckFailure(str(failure) + upstream_note(fn, requires)) from None


def _check_stops_greedy(fn: Callable) -> None:
    target, draft = shipped_pair()
    gamma = 4
    for task in ("math", "code"):
        prompt, scenarios = _stop_scenarios(task, gamma)
        for description, stop, expected, n_forwards in scenarios:
            label = f"generate_until_stop(shipped models, {task} prompt, {description}, gamma={gamma}, greedy)"
            t_rec, d_rec = RecordingModel(target, keep_logits=True), RecordingModel(draft)
            result = call(fn, label, t_rec, d_rec, list(prompt), stop, gamma, GREEDY, None)
            if not (isinstance(result, tuple) and len(result) == 3):
                raise CheckFailure(f"{label}: return (output, target_cache, draft_cache); got {type(result).__name__}.")
            output, t_cache, d_cache = result
            got = expect_token_list(label, output, len(output) if isinstance(output, list) else -1)
            if got != expected:
                first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
                raise CheckFailure(
                    f"{label}: expected {len(expected)} new tokens ending {expected[-4:]} (target-only greedy cut at "
                    f"the stop), got {len(got)} ending {got[-4:]}; they first differ at new token {first}. Nothing "
                    "after the token that ends the request may be emitted, and the request ends there.")
            _check_rounds(label, prompt, gamma, t_rec, d_rec)
            if len(t_rec.calls) != n_forwards:
                raise CheckFailure(f"{label}: the target ran {len(t_rec.calls)} forwards; the request ends in the round "
                                   f"that reaches the stop, {n_forwards} forwards with the prefill. Stop the loop as "
                                   "soon as a round finishes the request.")
            L = len(prompt) + len(expected) - 1
            _check_cache_holds(label, "target", target, t_cache, prompt + expected, {L})
            _check_cache_holds(label, "draft", draft, d_cache, prompt + expected, {L, L - 1})


def _check_stops_sampling(fn: Callable, n: int = 1500) -> None:
    params, prompt = SAMPLING_PARAMS[1], [1, 2]
    stop = StopCriteria(3, stop_token_ids=(0,))
    exact: dict[tuple[int, ...], float] = {}
    for seq, prob in target_joint(tiny_pair(vocab=6, noise=0.5, seed=3)[0], prompt, params).items():
        cut = next((i + 1 for i, t in enumerate(seq) if t == 0), 3)
        exact[seq[:cut]] = exact.get(seq[:cut], 0.0) + prob
    g = torch.Generator().manual_seed(salted(0))
    target, draft = sampling_pair()  # the same outputs, fewer forwards
    label = f"generate_until_stop(small random models, prompt={prompt}, {stop}, gamma=2, params={params})"

    def draw() -> tuple:
        result = call(fn, label, target, draft, prompt, stop, 2, params, g)
        output = result[0] if isinstance(result, tuple) and result else result
        return tuple(expect_token_list(label, output, len(output) if isinstance(output, list) else -1))
    sample_and_compare(draw, n, exact, f"{label}, seeded runs: the output",
                       hint="Verify as in speculative_generate, then cut the committed tokens at the first stop.")
