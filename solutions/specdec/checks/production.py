"""Checks for notebook 13 (speculation in production): prefix caches built from random requests, grammars with
drafts that leave them, toy models whose constrained distribution is enumerated, suffix trees with ties, and
random profiles."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

import torch

from specdec.checks.core import (
    CheckFailure,
    call_recorded,
    diagnose,
    expect_reproducible,
    fmt,
    not_implemented,
    single_threaded,
)
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
def _cache_state(cache: PrefixCache) -> tuple:
    return dict(sorted(cache.block_of.items())), dict(sorted(cache.key_of.items()))


def _published(rng: random.Random, vocab: int, block_size: int) -> tuple[PrefixCache, list[list[int]]]:
    """A cache holding the verified full blocks of a few requests that share beginnings."""
    cache, docs, next_block = PrefixCache(), [], 0
    stem = [rng.randrange(vocab) for _ in range(rng.randrange(block_size, 4 * block_size))]
    for _ in range(rng.randrange(1, 4)):
        doc = stem[: rng.randrange(0, len(stem) + 1)] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 9))]
        table = list(range(next_block, next_block + len(doc) // block_size + 2))
        next_block += len(table)
        publish_blocks(cache, doc, table, len(doc), block_size)
        docs.append(doc)
    if cache.key_of and rng.random() < 0.4:  # a block handed out again since: evicted, the blocks after it stay
        cache.evict(rng.choice(sorted(cache.key_of)))
    return cache, docs


def check_match_prefix(fn: Callable) -> None:
    rng, cases = random.Random(13), []
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
        return (("the return value", returned), ("the cache afterwards", _cache_state(args[0])))

    _compare(fn, match_prefix, cases, outcome,
             "match_prefix returns a list of block ids and changes neither the cache nor the tokens.")


def check_publish_blocks(fn: Callable) -> None:
    rng = random.Random(14)
    # first, cases that tell the catalogued mistakes apart: a partly filled block, then a token with no KV yet
    cases = [("tokens=[1, 2, ..., 10], block_table=[7, 8, 9, 6] (lookahead included), num_computed=9, block_size=4, "
              "start=0, an empty cache", (PrefixCache(), list(range(1, 11)), [7, 8, 9, 6], 9, 4, 0)),
             ("tokens=[1, 2, ..., 12], block_table=[7, 8, 9, 6] (lookahead included), num_computed=11, block_size=4, "
              "start=0, an empty cache", (PrefixCache(), list(range(1, 13)), [7, 8, 9, 6], 11, 4, 0))]
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

    def outcome(args, returned):
        return (("the return value", returned), ("the cache afterwards", _cache_state(args[0])))

    _compare(fn, publish_blocks, cases, outcome)
    _publish_in_the_engine(fn)


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
    rng = random.Random(5)
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
    rng, cases = random.Random(15), []
    for i in range(30):
        grammar = Grammar(PATTERNS[i % len(PATTERNS)])
        matcher = _advanced(rng, grammar, rng.randrange(0, 6))
        drafts = _random_drafts(rng, grammar, matcher, rng.randrange(1, 7))
        cases.append((f"pattern {grammar.pattern!r} after {bytes(t for t in _accepted(matcher))!r}, drafts "
                      f"{bytes(drafts)!r}", (matcher, drafts)))

    def outcome(args, returned):
        return (("the return value", returned), ("the matcher's states afterwards", _matcher_state(args[0])))

    _compare(fn, speculative_masks, cases, outcome,
             "Return (n, masks) with masks a (n + 1, V) bool tensor, and leave the matcher where it started.")


def _accepted(matcher: Matcher) -> list[int]:
    """The tokens a matcher accepted, recovered from its states (for a readable label)."""
    out, grammar = [], matcher.grammar
    for before, after in zip(matcher.states, matcher.states[1:]):
        out.append(next(t for t in range(grammar.vocab_size) if grammar.step(before, t) == after))
    return out


def toy_model(seed: int, vocab: int, scale: float) -> Callable[[list[int]], torch.Tensor]:
    """Logits over ``vocab`` tokens that depend on the last token and the position."""
    g = torch.Generator().manual_seed(seed)
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
    rng = random.Random(16)
    cases = []
    for i in range(30):  # greedy: one right answer, compared token for token, with the matcher afterwards
        grammar = Grammar(PATTERNS[i % len(PATTERNS)])
        matcher = _advanced(rng, grammar, rng.randrange(0, 6))
        if matcher.finished():
            matcher.rollback(1)
        gamma = rng.randrange(1, 6)
        drafts = _random_drafts(rng, grammar, matcher, gamma)
        g = torch.Generator().manual_seed(i)
        logits = 3 * torch.randn(gamma + 1, 256, generator=g, dtype=torch.float64)
        for j, t in enumerate(drafts):  # the target often agrees with the allowed drafts
            if rng.random() < 0.7:
                logits[j, t] += 12
        q = torch.nn.functional.one_hot(torch.tensor(drafts), 256).to(torch.float64)
        cases.append((f"greedy, pattern {grammar.pattern!r} after {bytes(_accepted(matcher))!r}, drafts "
                      f"{bytes(drafts)!r}", (matcher, drafts, q, logits)))

    def outcome(args, returned):
        return (("the committed tokens", returned), ("the matcher's states afterwards", _matcher_state(args[0])))

    _compare(fn, constrained_round, cases, outcome)
    _constrained_sampling_is_exact(fn)


def _constrained_sampling_is_exact(fn: Callable) -> None:
    """At temperature 1, with a draft that ignores the grammar: the output follows constrained target-only
    sampling, enumerated (seeded Monte Carlo, 3,000 samples, the tolerance of specdec.checks.stats)."""
    target, draft, params = toy_model(0, 6, 1.5), toy_model(1, 6, 1.5), SamplingParams(temperature=1.0)
    grammar = Grammar(TOY_PATTERN, vocab_size=6)
    joint = constrained_joint(target, [1, 2], grammar, params, 3)

    def make_args(seed: int) -> tuple:
        return (seed,)

    def run(seed: int) -> tuple:
        return speculate(fn, target, draft, [1, 2], 3, grammar, 2, params, torch.Generator().manual_seed(seed))

    expect_reproducible(run, "a constrained speculative loop around your constrained_round", make_args, seeds=(0,))
    generator = torch.Generator().manual_seed(0)
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
    rng, cases = random.Random(17), []
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

    def outcome(args, returned):
        return (("the return value", returned),)

    _compare(fn, propose_from_tree, cases, outcome,
             "Return (drafts, probability): a list of ints and a float (0.0 when there is no draft).")


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
    rng, cases = random.Random(seed), []
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
        cases.append((f"itl={itl}, rates={rates}", (itl, rates)))
    return cases


def check_k_schedule(fn: Callable) -> None:
    first = [("itl={64: {0: 1.0, 2: 4.0}}, rates=[0.5, 0.5] (speculation off wins)",
              ({64: {0: 1.0, 2: 4.0}}, [0.5, 0.5])),
             ("itl={8: {0: 1.0, 1: 0.75, 2: 1.0}}, rates=[0.5, 0.5] (K = 1 and 2 tie at 2 tokens per second)",
              ({8: {0: 1.0, 1: 0.75, 2: 1.0}}, [0.5, 0.5]))]
    _compare(fn, k_schedule, first + _profiles(18),
             promise="Return a dict from each profiled batch size to its K (ints).")


def check_lookup_k(fn: Callable) -> None:
    rng, cases = random.Random(19), []
    for _ in range(40):
        sizes = sorted(rng.sample([1, 2, 4, 8, 16, 32, 64, 128, 256], rng.randrange(1, 6)))
        schedule = {b: rng.randrange(0, 9) for b in sizes}
        batch = rng.choice([1, 3, 300] + sizes + [s + 1 for s in sizes] + [max(s - 1, 1) for s in sizes])
        cases.append((f"schedule={schedule}, batch_size={batch}", (schedule, batch)))
    _compare(fn, lookup_k, cases)
