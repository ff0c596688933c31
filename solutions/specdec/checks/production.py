"""Checks for notebook 13 (speculation in production): prefix caches built from random requests, grammars with
drafts that leave them, toy models whose constrained distribution is enumerated, suffix trees with ties, and
random profiles."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import torch

from specdec.checks.core import (
    CheckFailure,
    call_recorded,
    diagnose,
    expect_no_global_draws,
    expect_reproducible,
    expect_value_error,
    fmt,
    global_rng_state,
    not_implemented,
    single_threaded,
)
from specdec.checks.seeds import salted
from specdec.checks.stats import compare_frequencies
from specdec.mistakes import for_exercise
from specdec.params import SamplingParams
from specdec.production.grammar import Grammar, Matcher, constrained_round, masked_logits, speculative_masks
from specdec.production.knobs import k_schedule, lookup_k
from specdec.production.suffix import SuffixTree, propose_from_tree
from specdec.sampling import sample
from specdec.serving.prefix_cache import PrefixCache, match_prefix, publish_blocks


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool and value.ndim == 2:
            return f"bool tensor of shape {tuple(value.shape)}"
        return f"tensor({value.tolist()})" if value.numel() <= 16 else f"tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return fmt(value) if not isinstance(value, (list, dict)) else repr(value)


def _agree(got: Any, expected: Any) -> bool:
    if isinstance(expected, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype
                and bool(torch.equal(got, expected)))
    if isinstance(expected, tuple):
        return isinstance(got, tuple) and len(got) == len(expected) and all(_agree(g, e) for g, e in zip(got, expected))
    if isinstance(expected, float):
        return isinstance(got, float) and abs(got - expected) <= 1e-12 * max(1.0, abs(expected))
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(
            type(g) is int and g == e for g, e in zip(got, expected))
    if isinstance(expected, dict):  # keys and values of the promised types (an int K, not 4.0)
        return (isinstance(got, dict) and len(got) == len(expected)
                and all(any(type(k) is type(e) and k == e for k in got) for e in expected)
                and all(_agree(got[e], v) for e, v in expected.items()))
    return type(got) is type(expected) and got == expected


def _compare(fn: Callable, reference: Callable, cases: Iterable[tuple[str, tuple]],
             outcome: Callable[[tuple, Any], tuple] | None = None, promise: str = "") -> None:
    """fn and reference on copies of every case's arguments; ``outcome(args, returned)`` names what must agree
    (the return value by default; also what the call left in its arguments). Fails at the first disagreement."""
    name = reference.__name__
    outcome = outcome or (lambda args, returned: (("the return value", returned),))
    mistakes = [m for m in for_exercise(name)]
    wrapped = [type(m)(m.exercise, m.name, _outcome_of(m.fn, outcome), m.hint) for m in mistakes]
    history: list = []
    for description, args in cases:
        label = f"{name}({description})"
        expected = _outcome_of(reference, outcome)(*args)
        got = call_recorded(_outcome_of(fn, outcome), label, args, wrapped, history, named=fn)
        history.append((args, got))
        if not all(_agree(g, e) for (_, g), (_, e) in zip(got, expected)):
            wrong = [f"{what} should be {_show(want)}, got {_show(have)}"
                     for (what, have), (_, want) in zip(got, expected) if not _agree(have, want)]
            raise CheckFailure(f"{label}: " + "; ".join(wrong) + "." + (f" {promise}" if promise else "")
                               + diagnose(wrapped, history, rel=1e-12))


def _outcome_of(fn: Callable, outcome: Callable[[tuple, Any], tuple]) -> Callable[..., tuple]:
    def run(*args: Any) -> tuple:
        copies = copy.deepcopy(args)
        return outcome(copies, fn(*copies))
    return run


# ---- prefix caching --------------------------------------------------------------------------
def _tree_state(node) -> tuple:
    """A suffix tree's counts, children in order: a lookup must leave it as it was."""
    return node.count, tuple((token, _tree_state(child)) for token, child in node.children.items())


def _cache_state(cache: PrefixCache, ordered: bool = False) -> tuple:
    """What a caller can see of a cache: both sides of the map, and the hit counters (the engine counts hits);
    ``ordered``: the maps' entries in their order too (a lookup must leave even that as it was)."""
    if ordered:
        maps = (tuple(cache.block_of.items()), tuple(cache.key_of.items()))
    else:
        maps = (dict(sorted(cache.block_of.items())), dict(sorted(cache.key_of.items())))
    return (*maps, {"queried_tokens": cache.queried_tokens, "hit_tokens": cache.hit_tokens})


def _published(rng: random.Random, vocab: int, block_size: int) -> tuple[PrefixCache, list[list[int]]]:
    """A cache holding the verified full blocks of a few requests that share beginnings."""
    cache, docs = PrefixCache(), []
    free = rng.sample(range(100), 100)  # block ids in no particular order, as a free list hands them out
    stem = [rng.randrange(vocab) for _ in range(rng.randrange(block_size, 4 * block_size))]
    for _ in range(rng.randrange(1, 4)):
        doc = stem[: rng.randrange(0, len(stem) + 1)] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 9))]
        table = [free.pop() for _ in range(len(doc) // block_size + 2)]
        publish_blocks(cache, doc, table, len(doc), block_size)
        docs.append(doc)
    if cache.key_of and rng.random() < 0.4:  # a block handed out again since: evicted, the blocks after it stay
        cache.evict(rng.choice(sorted(cache.key_of)))
    return cache, docs


def check_match_prefix(fn: Callable) -> None:
    rng = random.Random(salted(13))
    # first, the case of the section's key: the same tokens after a different prefix are another block
    shared = PrefixCache()
    publish_blocks(shared, [1, 1, 1, 1, 3, 3, 3, 3, 5], [10, 11, 12], 8, 4)  # [1]*4 + [3]*4: blocks 10, 11
    publish_blocks(shared, [2, 2, 2, 2, 6], [20, 21], 4, 4)  # [2]*4: block 20 (its next block never computed)
    cases = [("a cache holding the blocks of [1, 1, 1, 1, 3, 3, 3, 3] (10, 11) and of [2, 2, 2, 2] (20), "
              "tokens=[2, 2, 2, 2, 3, 3, 3, 3, 7] (block 1 holds the tokens of block 11, after another prefix), "
              "block_size=4", (shared, [2, 2, 2, 2, 3, 3, 3, 3, 7], 4))]
    holed = PrefixCache()  # block 0 is a block like any other; block 5, once [1, 2, 3, 4], was handed out again
    publish_blocks(holed, list(range(1, 10)), [0, 5, 3, 8, 9], 9, 2)
    holed.evict(5)
    for tokens in (list(range(1, 10)), list(range(1, 12)), [1, 2, 3]):
        cases.append((f"a cache holding blocks 0, 3 and 8 for the prefixes of [1, 2], [1, ..., 6] and [1, ..., 8] "
                      f"(block 5, once [1, 2, 3, 4], was evicted), tokens={tokens}, block_size=2", (holed, tokens, 2)))
    for i in range(40):
        bs, vocab = rng.choice([2, 3, 4]), rng.choice([2, 3, 50])
        cache, docs = _published(rng, vocab, bs)
        doc = rng.choice(docs)
        k = rng.randrange(0, len(doc) // bs + 1)
        query = doc[: k * bs + rng.choice([0, 0, 1, 2])]  # often exactly k full blocks: the last token stays
        if query and rng.random() < 0.3:  # a change inside: the prefix stops matching there
            j = rng.randrange(len(query))
            query = query[:j] + [(query[j] + 1) % vocab] + query[j + 1:]
        if rng.random() < 0.2:
            query = query + [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
        query = tuple(query) if i % 5 == 4 else query  # any sequence of ints
        cases.append((f"a cache of {len(cache.key_of)} published blocks, tokens={list(query)}, block_size={bs}",
                      (cache, query, bs)))

    def outcome(args, returned):
        return (("the return value", returned), ("the cache afterwards (its entries in order)",
                                                 _cache_state(args[0], ordered=True)),
                ("the tokens afterwards", list(args[1])))

    _compare(fn, match_prefix, cases, outcome,
             "match_prefix returns a list of block ids, in the order of the prompt, and changes neither the cache "
             "(its maps, their order, or its hit counters: the engine counts the hits) nor the tokens.")


def check_publish_blocks(fn: Callable) -> None:
    rng = random.Random(salted(14))
    # first, cases that tell the catalogued mistakes apart: a partly filled block, then a token with no KV yet
    cases = [("tokens=[1, 2, ..., 10], block_table=[7, 8, 9, 6] (lookahead included), num_computed=9, block_size=4, "
              "start=0, an empty cache", (PrefixCache(), list(range(1, 11)), [7, 8, 9, 6], 9, 4, 0)),
             ("tokens=[1, 2, ..., 12], block_table=[7, 8, 9, 6] (lookahead included), num_computed=11, block_size=4, "
              "start=0, an empty cache", (PrefixCache(), list(range(1, 13)), [7, 8, 9, 6], 11, 4, 0)),
             ("tokens=[1, 2, ..., 8], block_table=[7, 8] (no lookahead block), num_computed=8 (every token has its K "
              "and V), block_size=4, start=0, an empty cache", (PrefixCache(), list(range(1, 9)), [7, 8], 8, 4, 0)),
             _holed_case()]
    for i in range(40):
        bs, vocab = rng.choice([2, 3, 4]), rng.choice([2, 3, 50])
        cache, _ = _published(rng, vocab, bs) if i % 3 else (PrefixCache(), [])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 6 * bs))]
        if i % 4 == 1:
            tokens = tokens[: max(bs, len(tokens) // bs * bs)] or tokens  # a whole number of blocks
        computed = max(len(tokens) - rng.choice([1, 1, 2, bs]), 0)  # the last committed token has no KV yet
        lookahead = rng.randrange(0, 3 * bs)
        first = 1_000 + 100 * i
        table = list(range(first, first - (-(len(tokens) + lookahead) // bs)))
        start = rng.randrange(0, computed // bs + 1) if i % 2 else 0
        cases.append((f"tokens={tokens}, block_table={table} (lookahead included), num_computed={computed}, "
                      f"block_size={bs}, start={start}, a cache of {len(cache.key_of)} blocks",
                      (cache, tokens, table, computed, bs, start)))

    for i in range(6):  # every committed token computed, and a table with no block to spare
        bs = rng.choice([2, 3, 4])
        tokens = [rng.randrange(50) for _ in range(bs * rng.randrange(1, 5))]
        table = [2_000 + 10 * i + j for j in range(len(tokens) // bs)]
        cases.append((f"tokens={tokens}, block_table={table} (no lookahead block), num_computed={len(tokens)}, "
                      f"block_size={bs}, start=0, an empty cache", (PrefixCache(), tokens, table, len(tokens), bs, 0)))

    def outcome(args, returned):
        return (("the return value", returned), ("the cache afterwards", _cache_state(args[0])),
                ("the tokens and the block table afterwards", (list(args[1]), list(args[2]))))

    _compare(fn, publish_blocks, cases, outcome,
             "publish_blocks publishes with cache.add, returns the new start, and leaves tokens and block_table as "
             "they were.")
    _publish_in_the_engine(fn)


def _holed_case() -> tuple[str, tuple]:
    """A row that recomputed a prefix the cache holds, except for one block evicted since: the prefixes still
    published stay with their blocks, the evicted one and those after the held ones are the row's to publish."""
    cache = PrefixCache()
    publish_blocks(cache, [1, 2, 3, 4, 5, 6, 7, 8], [50, 51, 52, 53], 8, 2)
    cache.evict(51)
    tokens = list(range(1, 12))
    return (f"tokens={tokens}, block_table=[60, 61, 62, 63, 64, 65], num_computed=10, block_size=2, start=0, a cache "
            "holding blocks 50, 52 and 53 for the prefixes of [1, 2], [1, 2, 3, 4, 5, 6] and [1, ..., 8] (block 51, "
            "once [1, 2, 3, 4], was evicted)", (cache, tokens, [60, 61, 62, 63, 64, 65], 10, 2, 0))


def _publish_in_the_engine(fn: Callable) -> None:
    """The learner's publish_blocks inside the serving engine: requests that resend prompts hit the cache, every
    greedy output equals batch-1 decoding, and every published block holds its prefix's K and V."""
    from specdec.checks.engine import tiny_pair
    from specdec.engine import target_only_generate
    from specdec.serving.engine import Parts, ServingEngine
    from specdec.serving.paged import PagedKV, RaggedBatch, paged_forward

    target, draft = tiny_pair(vocab=32, noise=0.6)  # many rejections: lookahead left half-written
    engine = ServingEngine(target, draft, num_blocks=80, block_size=4, max_gamma=6, prefix_caching=True,
                           parts=Parts(publish_blocks=fn))
    rng = random.Random(salted(5))
    systems = [[rng.randrange(32) for _ in range(rng.randrange(9, 20))] for _ in range(2)]
    requests = [(rng.choice(systems) + [rng.randrange(32) for _ in range(rng.randrange(1, 4))], rng.randrange(6, 14))
                for _ in range(8)]
    ids = []
    for prompt, n in requests:
        ids.append(engine.add_request(prompt, n, gamma=6))
        try:
            engine.run()
        except NotImplementedError as err:
            raise not_implemented(fn, "publish_blocks inside the serving engine", err) from None
        except Exception as err:
            raise CheckFailure(f"the serving engine with your publish_blocks raised {type(err).__name__}: {err}") \
                from None
    for i, (prompt, n) in zip(ids, requests):
        expected = target_only_generate(target, prompt, n)
        if engine.done[i].output != expected:
            raise CheckFailure(f"with your publish_blocks, the request with prompt {prompt} got "
                               f"{engine.done[i].output}, but decoding it alone gives {expected}: a later request "
                               "reused a block whose K and V are not what its key says.")
    bs = engine.block_size
    for block, key in engine.prefix_cache.key_of.items():
        if len(key) % bs:
            raise CheckFailure(f"publish_blocks inside the serving engine: block {block} was published under a key "
                               f"of {len(key)} tokens, not a whole number of blocks: publish full blocks of verified "
                               "tokens only.")
        scratch = PagedKV(target.config, len(key) // bs, bs)
        paged_forward(target, scratch, RaggedBatch([list(key)], [0], [list(range(len(key) // bs))]))
        for layer in range(target.config.n_layers):
            if not torch.allclose(engine.kv.k[layer, block * bs:(block + 1) * bs], scratch.k[layer, len(key) - bs:],
                                  atol=1e-4, rtol=1e-4):
                raise CheckFailure(f"publish_blocks inside the serving engine: block {block} is published under the "
                                   f"prefix {list(key)}, but its slots do not "
                                   "hold that prefix's keys: a block of lookahead slots (or one whose last token had "
                                   "no K and V yet) was published.")
    if engine.prefix_cache.hit_tokens == 0:
        raise CheckFailure("publish_blocks inside the serving engine: requests that resend the same system prompt "
                           "never hit the cache: publish every full "
                           "block of verified tokens.")


# ---- grammar-constrained speculation ----------------------------------------------------------
PATTERNS = ['\\{"[a-z]+": \\d+(, "[a-z]+": \\d+)*\\}', "(ab|a[cd]e)+f?", "[0-9]+(\\.[0-9]+)?", "x(yz)*w"]


def _random_drafts(rng: random.Random, grammar: Grammar, matcher: Matcher, gamma: int) -> list[int]:
    """Drafts the grammar allows for a while, then (often) a forbidden one, then anything."""
    drafts, state = [], matcher.state
    cut = rng.randrange(0, gamma + 1)
    for i in range(gamma):
        allowed = grammar.mask(state).nonzero().flatten().tolist() if state >= 0 else []
        token = rng.choice(allowed) if i < cut and allowed else rng.randrange(grammar.vocab_size)
        drafts.append(token)
        state = grammar.step(state, token) if state >= 0 else -1
    return drafts


def _advanced(rng: random.Random, grammar: Grammar, steps: int) -> Matcher:
    matcher = Matcher(grammar)
    for _ in range(steps):
        allowed = matcher.allowed().nonzero().flatten().tolist()
        if not allowed:
            break
        matcher.accept([rng.choice(allowed)])
    return matcher


def _matcher_state(matcher: Matcher) -> list[int]:
    return list(matcher.states)


def check_speculative_masks(fn: Callable) -> None:
    rng, cases = random.Random(salted(15)), []
    for i in range(30):
        grammar = Grammar(PATTERNS[i % len(PATTERNS)])
        matcher = _advanced(rng, grammar, rng.randrange(0, 6))
        drafts = _random_drafts(rng, grammar, matcher, rng.randrange(1, 7))
        cases.append((f"pattern {grammar.pattern!r} after {bytes(t for t in _accepted(matcher))!r}, drafts "
                      f"{bytes(drafts)!r}", (matcher, drafts)))
    for i in range(4):  # no drafts at all (a proposer with no match): one row, the mask at the bonus position
        grammar = Grammar(PATTERNS[i])
        matcher = _advanced(rng, grammar, rng.randrange(0, 4))
        cases.append((f"pattern {grammar.pattern!r} after {bytes(_accepted(matcher))!r}, no drafts (drafts=[])",
                      (matcher, [])))

    def outcome(args, returned):
        return (("the return value", returned), ("the matcher's states afterwards", _matcher_state(args[0])),
                ("the drafts afterwards", list(args[1])))

    _compare(fn, speculative_masks, cases, outcome,
             "Return (n, masks) with masks a (n + 1, V) bool tensor, and leave the matcher where it started and "
             "the drafts as they were.")


def _accepted(matcher: Matcher) -> list[int]:
    """The tokens a matcher accepted, recovered from its states (for a readable label)."""
    out, grammar = [], matcher.grammar
    for before, after in zip(matcher.states, matcher.states[1:]):
        out.append(next(t for t in range(grammar.vocab_size) if grammar.step(before, t) == after))
    return out


def toy_model(seed: int, vocab: int, scale: float) -> Callable[[list[int]], torch.Tensor]:
    """Logits over ``vocab`` tokens that depend on the last token and the position."""
    g = torch.Generator().manual_seed(salted(seed))
    by_last, by_position = scale * torch.randn(vocab, vocab, generator=g), scale * torch.randn(3, vocab, generator=g)
    return lambda prefix: by_last[prefix[-1]] + by_position[len(prefix) % 3]


TOY_PATTERN = "([\x00-\x02][\x03-\x05]|\x05\x00)+"  # over tokens 0-5: some paths end, many drafts are forbidden


def constrained_joint(target: Callable, prompt: list[int], grammar: Grammar, params: SamplingParams,
                      n_tokens: int) -> dict[tuple[int, ...], float]:
    """The exact distribution of constrained target-only sampling's first n_tokens (fewer where the grammar
    ends), by enumeration."""
    joint: dict[tuple[int, ...], float] = {}

    def walk(prefix: list[int], matcher: Matcher, mass: float) -> None:
        if len(prefix) == n_tokens or matcher.finished():
            joint[tuple(prefix)] = joint.get(tuple(prefix), 0.0) + mass
            return
        p = params.probs(masked_logits(target(prompt + prefix)[None], matcher.allowed()[None]))[0]
        for token in p.nonzero().flatten().tolist():
            matcher.accept([token])
            walk(prefix + [token], matcher, mass * float(p[token]))
            matcher.rollback(1)

    walk([], Matcher(grammar), 1.0)
    return joint


def speculate(round_fn: Callable, target: Callable, draft: Callable, prompt: list[int], n_tokens: int,
              grammar: Grammar, gamma: int, params: SamplingParams, generator: torch.Generator,
              draft_follows_grammar: bool = False) -> tuple[int, ...]:
    """A speculative loop around ``round_fn`` on toy models (functions prefix -> logits)."""
    tokens, matcher = list(prompt), Matcher(grammar)
    while len(tokens) - len(prompt) < n_tokens and not matcher.finished():
        drafts, q_rows, shadow = [], [], Matcher(grammar)
        shadow.states = list(matcher.states)
        for _ in range(gamma):
            logits = draft(tokens + drafts)[None]
            if draft_follows_grammar:
                logits = torch.zeros_like(logits) if shadow.finished() else masked_logits(logits, shadow.allowed()[None])
            q = params.probs(logits)[0]
            drafts.append(int(sample(q, generator)))
            q_rows.append(q)
            shadow.accept(drafts[-1:])
        logits = torch.stack([target(tokens + drafts[:i]) for i in range(gamma + 1)])
        committed = round_fn(matcher, drafts, torch.stack(q_rows), logits, params, generator)
        if not isinstance(committed, list) or not committed and not matcher.finished():
            raise CheckFailure(f"constrained_round returned {committed!r}: it must return the committed tokens, a "
                               "non-empty list of ints (until the grammar ends).")
        tokens += committed
    return tuple(tokens[len(prompt):][:n_tokens])


@single_threaded
def check_constrained_round(fn: Callable) -> None:
    rng = random.Random(salted(16))
    cases = []
    for i in range(30):  # greedy: one right answer, compared token for token, with the matcher afterwards
        grammar = Grammar(PATTERNS[i % len(PATTERNS)])
        matcher = _advanced(rng, grammar, rng.randrange(0, 6))
        if matcher.finished():
            matcher.rollback(1)
        gamma = rng.randrange(1, 6)
        drafts = _random_drafts(rng, grammar, matcher, gamma)
        g = torch.Generator().manual_seed(salted(i))
        logits = 3 * torch.randn(gamma + 1, 256, generator=g, dtype=torch.float64)
        for j, t in enumerate(drafts):  # the target often agrees with the allowed drafts
            if rng.random() < 0.7:
                logits[j, t] += 12
        q = torch.nn.functional.one_hot(torch.tensor(drafts), 256).to(torch.float64)
        cases.append((f"greedy, pattern {grammar.pattern!r} after {bytes(_accepted(matcher))!r}, drafts "
                      f"{bytes(drafts)!r}", (matcher, drafts, q, logits)))
    cases += _rounds_to_the_end(random.Random(salted(26))) + _rounds_without_drafts(random.Random(salted(27))) + \
        _rounds_with_filters(random.Random(salted(28)))

    def outcome(args, returned):
        return (("the committed tokens", returned), ("the matcher's states afterwards", _matcher_state(args[0])),
                ("the drafts afterwards", list(args[1])), ("q afterwards", _summary(args[2])),
                ("the logits afterwards", _summary(args[3])))

    _compare(fn, constrained_round, cases, outcome,
             "Return the committed tokens (a list of ints), advance the matcher over them, and leave drafts, q and "
             "logits as they were given.")
    _a_perfect_draft_is_always_accepted(fn)
    _one_round_is_exact(fn)
    _one_round_is_exact(fn, *RESIDUAL_SCENARIO)
    _constrained_sampling_is_exact(fn)


def _summary(t: torch.Tensor) -> str:
    """A tensor argument as the caller sees it afterwards: enough to show that it was written into."""
    finite = t[torch.isfinite(t)]
    return (f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}, {int(torch.isinf(t).sum())} infinite entries, "
            f"finite entries summing to {float(finite.sum()):.12g}")


ENDING = ["[ab][cd]e", "x(yz)?w", "(ab|cd)(e|fg)"]  # grammars that end after a few tokens


def _greedy_logits(rng: random.Random, grammar: Grammar, matcher: Matcher, drafts: list[int], seed: int,
                   agree: float) -> torch.Tensor:
    """(gamma + 1, 256) logits that favour each draft with probability ``agree``, another allowed token otherwise."""
    g = torch.Generator().manual_seed(salted(seed))
    logits = 3 * torch.randn(len(drafts) + 1, 256, generator=g, dtype=torch.float64)
    state = matcher.state
    for j, t in enumerate(drafts):
        allowed = grammar.mask(state).nonzero().flatten().tolist() if state >= 0 else []
        logits[j, t if rng.random() < agree or not allowed else rng.choice(allowed)] += 12
        state = grammar.step(state, t) if state >= 0 else -1
    return logits


def _rounds_to_the_end(rng: random.Random) -> list[tuple[str, tuple]]:
    """Greedy rounds whose drafts follow the grammar to its end (then, sometimes, one more token), with the target
    rejecting some of them on the way: at most n tokens may be committed, and a rejection before the end keeps its
    correction."""
    cases = []
    for i in range(12):
        grammar = Grammar(ENDING[i % len(ENDING)])
        matcher = _advanced(rng, grammar, rng.randrange(0, 2))
        drafts, state = [], matcher.state
        while grammar.mask(state).any():
            drafts.append(rng.choice(grammar.mask(state).nonzero().flatten().tolist()))
            state = grammar.step(state, drafts[-1])
        drafts += [rng.randrange(256) for _ in range(i % 2)]
        logits = _greedy_logits(rng, grammar, matcher, drafts, 100 + i, agree=0.6)
        q = torch.nn.functional.one_hot(torch.tensor(drafts), 256).to(torch.float64)
        cases.append((f"greedy, pattern {grammar.pattern!r} (it ends) after {bytes(_accepted(matcher))!r}, drafts "
                      f"{bytes(drafts)!r}", (matcher, drafts, q, logits)))
    return cases


def _rounds_without_drafts(rng: random.Random) -> list[tuple[str, tuple]]:
    """No drafts (a proposer with no match): the round is one plain constrained step."""
    cases = []
    for i in range(4):
        grammar = Grammar(PATTERNS[i])
        matcher = _advanced(rng, grammar, rng.randrange(0, 4))
        if matcher.finished():
            matcher.rollback(1)
        logits = 3 * torch.randn(1, 256, generator=torch.Generator().manual_seed(salted(200 + i)), dtype=torch.float64)
        cases.append((f"greedy, pattern {grammar.pattern!r} after {bytes(_accepted(matcher))!r}, no drafts "
                      "(drafts=[], q of shape (0, 256), logits of shape (1, 256))",
                      (matcher, [], torch.zeros(0, 256, dtype=torch.float64), logits)))
    return cases


def _rounds_with_filters(rng: random.Random) -> list[tuple[str, tuple]]:
    """Sampled rounds whose top-k or top-p leaves one token per position: the output is then deterministic (a
    one-hot draft is accepted exactly when the filtered, masked target keeps it), so it is compared token for
    token. The target often favours a forbidden token, over a flat rest: the filters must act on the masked
    distribution (its best allowed token), not on the unmasked one."""
    cases = []
    for i in range(12):
        grammar = Grammar(PATTERNS[i % len(PATTERNS)])
        matcher = _advanced(rng, grammar, rng.randrange(0, 6))
        if matcher.finished():
            matcher.rollback(1)
        drafts = _random_drafts(rng, grammar, matcher, rng.randrange(1, 6))
        logits = 0.5 * torch.randn(len(drafts) + 1, 256, generator=torch.Generator().manual_seed(salted(300 + i)),
                                   dtype=torch.float64)
        state = matcher.state
        for j in range(len(drafts) + 1):
            forbidden = (~grammar.mask(state)).nonzero().flatten().tolist() if state >= 0 else []
            if j < len(drafts) and (rng.random() < 0.5 or not forbidden):
                logits[j, drafts[j]] += 12
            elif forbidden:
                logits[j, rng.choice(forbidden)] += 12
            if j < len(drafts):
                state = grammar.step(state, drafts[j]) if state >= 0 else -1
        q = torch.nn.functional.one_hot(torch.tensor(drafts), 256).to(torch.float64)
        params = SamplingParams(temperature=1.0, top_k=1) if i % 2 else SamplingParams(temperature=0.7, top_p=1e-9)
        what = "top_k=1" if i % 2 else "temperature 0.7, top_p=1e-9"
        cases.append((f"{what} (one token left at each position), pattern {grammar.pattern!r} after "
                      f"{bytes(_accepted(matcher))!r}, drafts {bytes(drafts)!r}, a generator seeded {i}",
                      (matcher, drafts, q, logits, params, torch.Generator().manual_seed(salted(i)))))
    return cases


def _a_perfect_draft_is_always_accepted(fn: Callable) -> None:
    """A draft that samples from the masked target itself (q = p' at every position) is accepted every time:
    min(1, p'(x) / q(x)) = 1, so each round commits all its drafts and a bonus token."""
    target, params = toy_model(0, 6, 1.5), SamplingParams(temperature=1.0)
    grammar = Grammar(TOY_PATTERN, vocab_size=6)  # never ends: every round has its bonus

    def watched(matcher: Matcher, drafts: list[int], q: torch.Tensor, logits: torch.Tensor, *rest: Any) -> Any:
        before, rng = bytes(_accepted(matcher)), global_rng_state(rest)
        committed = fn(matcher, drafts, q, logits, *rest)
        expect_no_global_draws("constrained_round (a perfect draft, temperature 1)", rng)
        if not isinstance(committed, list) or list(committed[: len(drafts)]) != list(drafts) \
                or len(committed) != len(drafts) + 1:
            raise CheckFailure(
                f"constrained_round with a draft that samples from the masked target itself (q = p' at every "
                f"position, temperature 1, toy models over 6 tokens, after {list(before)}): the drafts {drafts} "
                f"should all be accepted, then one bonus token, but it committed {committed!r}. Verify every draft "
                "with verify_drafts against the masked target: a draft x is accepted with probability "
                "min(1, p'(x) / q(x)), which is 1 here.")
        return committed

    generator = torch.Generator().manual_seed(salted(3))
    for _ in range(20):
        try:
            speculate(watched, target, target, [1, 2], 6, grammar, 3, params, generator, draft_follows_grammar=True)
        except NotImplementedError as err:
            raise not_implemented(fn, "constrained_round", err) from None
        except CheckFailure:
            raise
        except Exception as err:
            raise CheckFailure(f"constrained_round raised {type(err).__name__}: {err} (temperature 1, a draft that "
                               "samples from the masked target itself, toy models over 6 tokens)") from None


#: (p, q, runs): the draft mostly forbidden, so most rounds end in a correction, and p' - q keeps both allowed tokens
#: while the unmasked p - q keeps token 0 alone: a correction from the unmasked p gives token 1 a share of 0.02, not
#: p'(1) = 0.0625 (9 sigma at 3,000 runs, so the verdict does not depend on the seed).
RESIDUAL_SCENARIO = ([0.30, 0.02, 0.34, 0.34], [0.10, 0.02, 0.44, 0.44], 3000)


def _one_round_is_exact(fn: Callable, target: list[float] = (0.05, 0.05, 0.45, 0.45),
                        draft: list[float] = (0.45, 0.05, 0.25, 0.25), runs: int = 1000) -> None:
    """One round, one sampled draft, four tokens of which the grammar allows 0 and 1: the first committed token
    must follow p', the masked target distribution, whatever the draft. By default p' = (1/2, 1/2); the draft favours
    token 0 and the forbidden tokens, the target the forbidden ones, so a cut draft resampled from p' or an
    acceptance test against the unmasked p moves token 0's share well off 1/2 (see RESIDUAL_SCENARIO for the
    correction)."""
    grammar = Grammar("[\x00\x01]+", vocab_size=4)
    p = torch.tensor([list(target), [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([list(draft)], dtype=torch.float64)
    masked = p[0, :2] / p[0, :2].sum()
    params, generator, firsts = SamplingParams(temperature=1.0), torch.Generator().manual_seed(salted(4)), []
    label = (f"constrained_round, one round at temperature 1 (tokens 0-3, the grammar allows 0 and 1; target p = "
             f"{list(target)}, so p' = [{float(masked[0]):.4g}, {float(masked[1]):.4g}, 0, 0]; the draft's q = "
             f"{list(draft)}, its token drawn from q)")
    for _ in range(runs):
        drafts = [int(sample(q[0], generator))]
        rng = global_rng_state((generator,))
        try:
            committed = fn(Matcher(grammar), drafts, q.clone(), p.log(), params, generator)
        except NotImplementedError as err:
            raise not_implemented(fn, "constrained_round", err) from None
        except Exception as err:
            raise CheckFailure(f"{label} raised {type(err).__name__}: {err}") from None
        expect_no_global_draws(label, rng)
        if not isinstance(committed, list) or not committed:
            raise CheckFailure(f"{label}: returned {committed!r} for drafts {drafts}, not a non-empty list of ints.")
        firsts.append(committed[0])
    compare_frequencies(firsts, {0: float(masked[0]), 1: float(masked[1])}, f"{label}: the first committed token",
                        hint=" Accept an allowed draft with probability min(1, p'(x) / q(x)); at a rejection (a "
                             "forbidden draft is rejected for certain) the correction comes from max(p' - q, 0), "
                             "with p' the masked, renormalised target distribution.")


def _constrained_sampling_is_exact(fn: Callable) -> None:
    """At temperature 1, with a draft that ignores the grammar: the output follows constrained target-only
    sampling, enumerated (seeded Monte Carlo, 3,000 samples, the tolerance of specdec.checks.stats)."""
    target, draft, params = toy_model(0, 6, 1.5), toy_model(1, 6, 1.5), SamplingParams(temperature=1.0)
    grammar = Grammar(TOY_PATTERN, vocab_size=6)
    joint = constrained_joint(target, [1, 2], grammar, params, 3)

    def make_args(seed: int) -> tuple:
        return (seed,)

    def run(seed: int) -> tuple:
        return speculate(fn, target, draft, [1, 2], 3, grammar, 2, params, torch.Generator().manual_seed(salted(seed)))

    expect_reproducible(run, "a constrained speculative loop around your constrained_round", make_args, seeds=(0,))
    generator = torch.Generator().manual_seed(salted(0))
    try:
        samples = [speculate(fn, target, draft, [1, 2], 3, grammar, 2, params, generator) for _ in range(3000)]
    except NotImplementedError as err:
        raise not_implemented(fn, "constrained_round", err) from None
    except CheckFailure:
        raise
    except Exception as err:
        raise CheckFailure(f"constrained_round raised {type(err).__name__}: {err} (temperature 1, toy models over 6 "
                           "tokens)") from None
    compare_frequencies(samples, joint, "constrained_round in a speculative loop: the first 3 tokens (toy models, "
                        "temperature 1, a draft that ignores the grammar)",
                        hint=" At a forbidden draft the round must end with a rejection whose correction comes from "
                             "max(p' - q, 0), with p' the masked target distribution: keep that draft in the round.")


# ---- suffix decoding --------------------------------------------------------------------------
def check_propose_from_tree(fn: Callable) -> None:
    rng, cases = random.Random(salted(17)), []
    for i in range(40):
        vocab = rng.choice([2, 3, 4, 40])
        tree = SuffixTree(depth=rng.choice([3, 5, 8]))
        for doc in range(rng.randrange(1, 4)):
            base = [rng.randrange(vocab) for _ in range(rng.randrange(2, 8))]
            tree.extend(doc, base * rng.randrange(1, 4) + [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))])
        query = [rng.randrange(vocab) for _ in range(rng.randrange(1, 8))]
        max_drafts, factor = rng.randrange(1, 9), rng.choice([0.5, 1.0, 2.0, 4.0])
        min_prob = _unambiguous(tree, query, max_drafts, factor, rng.choice([0.0, 0.1, 0.25, 0.5, 1.0]))
        cases.append((f"a tree of depth {tree.depth} over {tree.root.count} tokens, tokens={query}, "
                      f"max_drafts={max_drafts}, factor={factor}, min_prob={min_prob}",
                      (tree, query, max_drafts, factor, min_prob)))
    cases += _caps_and_thresholds(random.Random(salted(29)))

    def outcome(args, returned):
        return (("the return value", returned), ("the tree afterwards (every count)", _tree_state(args[0].root)))

    _compare(fn, propose_from_tree, cases, outcome,
             "Return (drafts, probability): a list of ints and a float (0.0 when there is no draft).")


def _caps_and_thresholds(rng: random.Random) -> list[tuple[str, tuple]]:
    """Caps that int() rounds down (a 3-token match at factor 0.5 earns 1 draft, not 2), and thresholds just above
    an estimate of the walk (by one part in a million): the walk stops there, with no tolerance."""
    periodic = SuffixTree(depth=8)
    periodic.extend(0, [1, 2, 3, 4, 5, 6] * 3)
    cases = [(f"a tree of depth 8 over [1, 2, 3, 4, 5, 6] * 3, tokens={q}, max_drafts=8, factor={f}, min_prob=0.1 "
              f"(a {len(q) - 1}-token match: int({f} * {len(q) - 1}) = {int(f * (len(q) - 1))} drafts)",
              (periodic, q, 8, f, 0.1)) for q, f in (([9, 1, 2, 3], 0.5), ([9, 5, 6], 0.75), ([9, 2, 3, 4], 1.5))]
    for i in range(10):
        vocab = rng.choice([2, 3, 4])
        tree = SuffixTree(depth=rng.choice([4, 6]))
        for doc in range(rng.randrange(1, 4)):
            tree.extend(doc, [rng.randrange(vocab) for _ in range(rng.randrange(6, 16))])
        query = [rng.randrange(vocab) for _ in range(rng.randrange(2, 6))]
        length, node = tree.longest_match(query)
        estimates, prob = [], Fraction(1)
        while node is not None and node.children and len(estimates) < 8:
            token, child = max(node.children.items(), key=lambda item: (item[1].count, -item[0]))
            prob *= Fraction(child.count, node.count)
            estimates.append(prob)
            node = child
        if not estimates or length == 0:
            continue
        j = rng.randrange(len(estimates))
        min_prob = float(estimates[j]) * (1 + 1e-6)  # the walk stops before the draft that brings it to j
        cases.append((f"a tree of depth {tree.depth} over {tree.root.count} tokens, tokens={query}, max_drafts=8, "
                      f"factor=4.0, min_prob={min_prob!r} (just above {estimates[j]}, an estimate on the walk: it stops "
                      "before reaching it)",
                      (tree, query, 8, 4.0, min_prob)))
    return cases


def _unambiguous(tree: SuffixTree, tokens: list[int], max_drafts: int, factor: float, min_prob: float) -> float:
    """min_prob, moved off the walk's estimates where floating point could decide the comparison either way.

    An estimate that equals min_prob exactly (as a fraction) stays a test of "at or above" only when every ratio
    on the way is a binary fraction (then any order of multiplying gives the exact value); otherwise min_prob moves
    by 1e-9, so that prob * c / n and prob * (c / n), both correct, agree."""
    length, node = tree.longest_match(tokens)
    prob, dyadic, steps = Fraction(1), True, 0
    while node is not None and node.children and steps < min(max_drafts, int(factor * length)):
        token, child = max(node.children.items(), key=lambda item: (item[1].count, -item[0]))
        ratio = Fraction(child.count, node.count)
        dyadic = dyadic and (ratio.denominator & (ratio.denominator - 1)) == 0
        prob *= ratio
        if prob == Fraction(min_prob) and not dyadic:
            return min_prob + 1e-9
        if prob < Fraction(min_prob):
            break
        node, steps = child, steps + 1
    return min_prob


# ---- knobs ------------------------------------------------------------------------------------
def _profiles(seed: int) -> list[tuple[str, tuple]]:
    rng, cases = random.Random(salted(seed)), []
    for i in range(30):
        K = rng.randrange(1, 9)
        rates, r = [], 1.0
        for _ in range(K):
            r *= rng.choice([0.5, 0.75, 0.875, 1.0])  # binary fractions: sums are exact in any order
            rates.append(r)
        sizes = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64, 128, 256], rng.randrange(1, 6)))
        itl = {}
        for b in sizes:
            base = rng.choice([1.0, 2.0, 4.0]) * b ** 0.5
            per = rng.choice([0.0625, 0.125, 0.25, 0.5]) * b / 32
            ks = sorted({0} | set(rng.sample(range(1, K + 1), rng.randrange(1, K + 1))))
            itl[b] = {k: base + per * k for k in ks}
            if rng.random() < 0.3:  # an exact tie: K and 0 give the same goodput (powers of two, exact products)
                k = ks[-1]
                itl[b][0] = 2.0 ** rng.randrange(-2, 3)
                itl[b][k] = itl[b][0] * (1 + sum(rates[:k]))
            row = list(itl[b].items())
            rng.shuffle(row)  # a profile is a mapping: its K need not come in order
            itl[b] = dict(row)
        sizes_in_order = list(itl.items())
        rng.shuffle(sizes_in_order)
        itl = dict(sizes_in_order)
        cases.append((f"itl={itl}, rates={rates}", (itl, rates)))
    return cases


def _profile_state(itl: Mapping[int, Mapping[int, float]], rates: Sequence[float]) -> tuple:
    return {b: dict(row) for b, row in itl.items()}, tuple(rates)


BAD_PROFILE = ("the profile is invalid: keep the template's first line, check_profile(itl, rates), which rejects it "
               "with a ValueError")


def _rejects_bad_profiles(fn: Callable) -> None:
    bad = [("itl={8: {1: 1.0, 2: 1.5}}, rates=[0.5, 0.5] (no K = 0 entry)", ({8: {1: 1.0, 2: 1.5}}, [0.5, 0.5])),
           ("itl={8: {0: 1.0, 3: 1.5}}, rates=[0.5, 0.5] (K = 3 has no rate)", ({8: {0: 1.0, 3: 1.5}}, [0.5, 0.5])),
           ("itl={8: {0: 1.0, 2: 1.5}}, rates=[0.5, 0.75] (a rate that grows with the position)",
            ({8: {0: 1.0, 2: 1.5}}, [0.5, 0.75]))]
    for description, args in bad:
        expect_value_error(fn, f"k_schedule({description})", *copy.deepcopy(args), why=BAD_PROFILE)


def check_k_schedule(fn: Callable) -> None:
    first = [("itl={64: {0: 1.0, 2: 4.0}}, rates=[0.5, 0.5] (speculation off wins)",
              ({64: {0: 1.0, 2: 4.0}}, [0.5, 0.5])),
             ("itl={8: {0: 1.0, 1: 0.75, 2: 1.0}}, rates=[0.5, 0.5] (K = 1 and 2 tie at 2 tokens per second)",
              ({8: {0: 1.0, 1: 0.75, 2: 1.0}}, [0.5, 0.5]))]
    last = [("itl={8: {2: 1.0, 1: 0.75, 0: 1.0}}, rates=[0.5, 0.5] (the K listed from the largest down; K = 1 and 2 "
             "tie)", ({8: {2: 1.0, 1: 0.75, 0: 1.0}}, [0.5, 0.5])),
            (f"itl={{4: {{0: 1.0, 2: {2 * (1 - 2 ** -16)!r}}}}}, rates=[0.5, 0.5] (K = 2 beats K = 0 by one part in "
             "65,536: a near tie is not a tie)", ({4: {0: 1.0, 2: 2 * (1 - 2 ** -16)}}, [0.5, 0.5]))]

    def outcome(args, returned):
        types = (tuple(sorted({(type(b).__name__, type(k).__name__) for b, k in returned.items()}))
                 if isinstance(returned, dict) else type(returned).__name__)
        return (("the return value", returned), ("the types of its keys and values (batch size, K)", types),
                ("the profile (itl, rates) afterwards", _profile_state(*args)))

    _compare(fn, k_schedule, first + _profiles(18) + last, outcome,
             promise="Return a dict from each profiled batch size to its K (ints), and leave itl and rates as they "
                     "were.")
    _rejects_bad_profiles(fn)


def check_lookup_k(fn: Callable) -> None:
    rng, cases = random.Random(salted(19)), []
    for _ in range(40):
        sizes = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64, 128, 256], rng.randrange(1, 6)))
        schedule = {b: rng.randrange(0, 9) for b in sizes}
        batch = rng.choice([1, 3, 300] + sizes + [s + 1 for s in sizes] + [max(s - 1, 1) for s in sizes])
        cases.append((f"schedule={schedule}, batch_size={batch}", (schedule, batch)))
    for i in range(20):  # sizes that are not powers of two, then listed in any order (a schedule is a mapping)
        sizes = rng.sample([1, 3, 6, 12, 24, 48, 80, 96, 160, 200], rng.randrange(2, 6))
        schedule = {b: rng.randrange(0, 9) for b in (sorted(sizes) if i < 10 else sizes)}
        batch = rng.choice([1, 2, 300] + sizes + [s + 1 for s in sizes] + [max(s - 1, 1) for s in sizes])
        cases.append((f"schedule={schedule}, batch_size={batch}", (schedule, batch)))
    unsorted = {32: 2, 128: 0, 1: 6, 8: 4}
    cases += [(f"schedule={unsorted}, batch_size={b}", (unsorted, b)) for b in (200, 7, 40)]
    above = {16: 1, 4: 3, 64: 0}  # not in order, and the batch is below every size: the smallest size's K
    cases += [(f"schedule={above}, batch_size={b}", (above, b)) for b in (2, 3)]

    def outcome(args, returned):
        return (("the return value", returned), ("the schedule afterwards", dict(args[0])))

    _compare(fn, lookup_k, cases, outcome, "Return the K of the largest profiled batch size not above batch_size "
             "(or of the smallest), whatever order the schedule lists its sizes in, and leave the schedule as it was.")
