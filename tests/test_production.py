"""The serving engine in production (notebook 13): prefix caching with speculation, aborted requests, and
steps that fail without leaving a trace."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import measured_costs
from specdec.checks.engine import tiny_pair
from specdec.engine import target_only_generate
from specdec.serving.adaptive import BatchCosts
from specdec.serving.blocks import blocks_for, release_slots, reserve_slots, slot_mapping
from specdec.serving.commit import commit_round
from specdec.serving.engine import Parts, ServingEngine, StepError
from specdec.serving.paged import PagedKV, RaggedBatch, paged_forward
from specdec.serving.prefix_cache import match_prefix, publish_blocks
from specdec.serving.scheduler import schedule_step
from specdec.serving.sequence import SeqStatus


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=32, noise=0.1)


def _state(engine: ServingEngine) -> tuple:
    """What a step may change, comparable with ==."""
    seqs = []
    for seq in engine.waiting + engine.running:
        values, generator = seq.snapshot()
        seqs.append((values, generator.tolist() if generator is not None else None))
    cache = engine.prefix_cache.state() if engine.prefix_cache is not None else None
    return ([s.seq_id for s in engine.waiting], [s.seq_id for s in engine.running], sorted(engine.done),
            list(engine.free_blocks), dict(engine.refs), len(engine.steps), engine.auto_evidence, cache, seqs)


def _balanced(engine: ServingEngine) -> None:
    """Every block is free or held, never both; a held block's count is the number of tables holding it."""
    held: dict[int, int] = {}
    for seq in engine.waiting + engine.running:
        for block in seq.block_table:
            held[block] = held.get(block, 0) + 1
    assert held == engine.refs, "reference counts differ from the tables that hold the blocks"
    assert not set(held) & set(engine.free_blocks), "a held block is also on the free list"
    assert sorted(list(held) + engine.free_blocks) == list(range(engine.num_blocks)), "a block leaked or is free twice"
    if engine.prefix_cache is not None:
        cache = engine.prefix_cache
        assert all(cache.block_of[key] == block for block, key in cache.key_of.items())
        assert len(cache.block_of) == len(cache.key_of)


def _reference(target, prompt: list[int], max_tokens: int) -> list[int]:
    return target_only_generate(target, prompt, max_tokens)


# ---- prefix caching ------------------------------------------------------------------------------
def _cached_kv_is_its_prefix(engine: ServingEngine) -> None:
    """Each published block holds the target's K and V of exactly the prefix its key names (recomputed alone)."""
    bs = engine.block_size
    for block, key in engine.prefix_cache.key_of.items():
        assert len(key) % bs == 0, f"block {block} is published under a key of {len(key)} tokens, not whole blocks"
        scratch = PagedKV(engine.target.config, len(key) // bs, bs)
        paged_forward(engine.target, scratch, RaggedBatch([list(key)], [0], [list(range(len(key) // bs))]))
        first = len(key) - bs
        for layer in range(engine.target.config.n_layers):
            for pool, ref in ((engine.kv.k, scratch.k), (engine.kv.v, scratch.v)):
                torch.testing.assert_close(pool[layer, block * bs:(block + 1) * bs], ref[layer, first:len(key)],
                                           atol=1e-3, rtol=1e-4, msg=f"block {block} does not hold its prefix")
    # (atol 1e-3: a batched forward and the prefix alone reduce in another order, and entries here reach |20|, so
    # float32 differs by up to ~1e-4 where the entry is near 0; another prefix's K and V differ by O(1).)


def _shared_prefix_requests(rng: random.Random, n: int, vocab: int = 32) -> list[tuple[list[int], int]]:
    """Requests that resend a few system prompts with their own endings, like chat turns."""
    systems = [[rng.randrange(vocab) for _ in range(rng.randrange(9, 30))] for _ in range(3)]
    return [(rng.choice(systems) + [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))], rng.randrange(4, 20))
            for _ in range(n)]


@pytest.mark.parametrize("gamma", [0, 4, "auto"])
def test_prefix_caching_shares_verified_blocks_only_and_changes_no_greedy_token(pair, gamma):
    target, draft = pair
    requests = _shared_prefix_requests(random.Random(1), 24)
    outputs = {}
    for caching in (False, True):
        engine = ServingEngine(target, draft, num_blocks=120, block_size=4, token_budget=40, max_gamma=6,
                               prefix_caching=caching)
        ids = []
        for i, (prompt, max_tokens) in enumerate(requests):  # a few at a time, so later ones can hit earlier ones
            ids.append(engine.add_request(prompt, max_tokens, gamma=gamma))
            if i % 4 == 3:
                while engine.has_unfinished():
                    engine.step()
                    _balanced(engine)
        engine.run()
        outputs[caching] = [engine.done[i].output for i in ids]
        if caching:
            assert engine.prefix_cache.hit_rate > 0.3, "requests that resend a prompt should hit the cache"
            _cached_kv_is_its_prefix(engine)
        _balanced(engine)
        assert not engine.refs
    assert outputs[True] == outputs[False] == [_reference(target, p, m) for p, m in requests]


def test_a_hit_reuses_whole_blocks_and_leaves_the_last_prompt_token_to_compute(pair):
    target, draft = pair
    engine = ServingEngine(target, draft, num_blocks=40, block_size=4, prefix_caching=True)
    first = engine.add_request(list(range(1, 13)), 6, gamma=3)  # 12 prompt tokens: 3 full blocks
    engine.run()
    published = engine.prefix_cache.key_of.copy()
    assert all(len(key) % 4 == 0 for key in published.values())
    second = engine.add_request(list(range(1, 13)), 6, gamma=3)  # the same prompt: 2 blocks reused, not 3
    engine.step()
    by_length = {len(key): block for block, key in published.items()}
    assert engine.running[0].block_table[:2] == [by_length[4], by_length[8]]
    assert engine.prefix_cache.hit_tokens == 8 and engine.prefix_cache.queried_tokens == 24
    engine.run()
    assert engine.done[second].output == engine.done[first].output
    third = engine.add_request(list(range(1, 11)) + [30, 31], 6)  # shares 2 full blocks, then differs
    engine.run()
    assert engine.prefix_cache.hit_tokens == 16
    assert engine.done[third].output == _reference(target, list(range(1, 11)) + [30, 31], 6)


def test_publishing_a_lookahead_block_is_caught():
    """The content check above fails for a cache that publishes the blocks speculation reserved past the
    verified tokens (the mistake notebook 13 warns about), so it is not vacuous."""
    target, draft = tiny_pair(vocab=32, noise=0.6)  # many rejections: lookahead left half-written

    def publish_every_block(cache, tokens, block_table, num_computed, block_size, start=0):
        return publish_blocks(cache, tokens, block_table, len(block_table) * block_size, block_size, start)

    engine = ServingEngine(target, draft, num_blocks=80, block_size=4, max_gamma=6, prefix_caching=True,
                           parts=Parts(publish_blocks=publish_every_block))
    for i in range(6):
        engine.add_request([1 + i % 2, 2, 3, 4, 5, 6, 7], 20, gamma=6)
        engine.run()
    with pytest.raises(AssertionError):
        _cached_kv_is_its_prefix(engine)


def test_cached_blocks_are_handed_out_last_and_forgotten_when_reused(pair):
    target, draft = pair
    engine = ServingEngine(target, draft, num_blocks=12, block_size=4, prefix_caching=True)
    engine.add_request(list(range(1, 10)), 4)  # 9 + 4 tokens: 4 blocks, 2 of them full prompt blocks
    engine.run()
    cached = set(engine.prefix_cache.key_of)
    assert cached and set(engine.free_blocks[: len(cached)]) == cached  # at the front: handed out last
    engine.add_request([20] * 40, 4)  # needs 11 of the 12 blocks: some cached ones must be taken
    engine.run()
    _balanced(engine)
    assert len(engine.prefix_cache.key_of) >= 1 and all(len(k) % 4 == 0 for k in engine.prefix_cache.block_of)
    _cached_kv_is_its_prefix(engine)


# ---- faults --------------------------------------------------------------------------------------
class Flaky:
    """A part that raises on chosen calls and otherwise does what the reference does."""

    def __init__(self, function, fail_on: set[int]) -> None:
        self.function, self.fail_on, self.calls = function, fail_on, 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls in self.fail_on:
            raise ZeroDivisionError("injected")
        return self.function(*args)


# Forward costs of a made-up GPU-like pair (target: 2 ms plus a little per token; draft: a tenth of it), with the
# measured gain off: "auto" then decides the same way on every machine, so the seeded loads below are the same
# loads everywhere (the costs a machine measures would change which gamma "auto" picks, and so the whole run).
SYNTHETIC_COSTS = tuple(BatchCosts([1, 2, 4, 8, 16, 32, 64], [1, 2, 3, 5, 9],
                                   [[base * (1 + 0.02 * rows * per_row) for per_row in (1, 2, 3, 5, 9)]
                                    for rows in (1, 2, 4, 8, 16, 32, 64)]) for base in (2e-3, 2e-4))

PARTS = {"schedule_step": schedule_step, "reserve_slots": reserve_slots, "release_slots": release_slots,
         "slot_mapping": slot_mapping, "commit_round": commit_round, "match_prefix": match_prefix,
         "publish_blocks": publish_blocks}
CACHE_PARTS = {"match_prefix", "publish_blocks"}  # called only with prefix caching on


@pytest.mark.parametrize(("name", "caching"),
                         [(n, c) for n in sorted(PARTS) for c in (False, True) if c or n not in CACHE_PARTS])
def test_a_part_that_raises_leaves_the_engine_as_it_was_and_is_named(pair, name, caching):
    target, draft = pair
    engine = ServingEngine(target, draft, num_blocks=60, block_size=4, token_budget=24, max_gamma=4,
                           prefix_caching=caching, parts=Parts(**{name: Flaky(PARTS[name], {3, 7, 8})}),
                           costs=measured_costs(target, draft))  # measured once for every case, not per engine
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9][: 3 + i] for i in range(5)]
    ids = [engine.add_request(p, 12, gamma=[0, 2, 4, "auto", 3][i]) for i, p in enumerate(prompts)]
    failures = 0
    while engine.has_unfinished():
        before = _state(engine)
        try:
            engine.step()
        except StepError as error:
            failures += 1
            assert f"Parts.{name}" in str(error) and "ZeroDivisionError: injected" in str(error)
            assert "request" in str(error) and "as it was before the step" in str(error)
            assert _state(engine) == before, "a failed step changed the engine"
        _balanced(engine)
    assert failures == 3
    assert [engine.done[i].output for i in ids] == [_reference(target, p, 12) for p in prompts]


def test_a_model_error_is_named_and_undone(pair):
    target, draft = pair
    engine = ServingEngine(target, draft, num_blocks=60, block_size=4, max_gamma=4)
    ids = [engine.add_request([1, 2, 3 + i], 10, gamma=3) for i in range(3)]
    engine.step()
    calls = {"n": 0}

    def fail_once(module, args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("device lost")

    for model, words in ((draft, "the draft's forward"), (target, "the target's forward")):
        handle = model.lm_head.register_forward_pre_hook(fail_once)
        calls["n"] = 0
        before = _state(engine)
        with pytest.raises(StepError, match=words):
            engine.step()
        assert _state(engine) == before
        handle.remove()
        engine.step()
    engine.run()
    assert [engine.done[i].output for i in ids] == [_reference(target, [1, 2, 3 + i], 10) for i in range(3)]


def test_abort_frees_every_block_at_once_and_emits_nothing_more(pair):
    target, draft = pair
    engine = ServingEngine(target, draft, num_blocks=60, block_size=4, max_gamma=6)
    ids = [engine.add_request([1, 2, 3 + i], 30, gamma=6) for i in range(3)]
    for _ in range(3):
        engine.step()
    victim = engine.running[1]
    assert len(victim.block_table) > 0
    held = {b for s in engine.running if s is not victim for b in s.block_table}
    assert engine.abort_request(victim.seq_id) is True
    assert victim.status is SeqStatus.ABORTED and victim.block_table == [] and victim not in engine.running
    assert len(engine.free_blocks) == engine.num_blocks - len(held)
    emitted_before = list(victim.output)
    streamed = []
    while engine.has_unfinished():
        streamed.append(engine.step())
    assert all(victim.seq_id not in step for step in streamed) and victim.output == emitted_before
    assert engine.abort_request(victim.seq_id) is False
    with pytest.raises(KeyError, match="no request 99"):
        engine.abort_request(99)
    for i in ids:
        reference, out = _reference(target, [1, 2, 3 + i], 30), engine.done[i].output
        assert reference[: len(out)] == out if i == victim.seq_id else out == reference


def test_an_abort_during_a_step_drops_that_steps_tokens(pair):
    target, draft = pair
    engine = ServingEngine(target, draft, num_blocks=60, block_size=4, max_gamma=4)

    def commit_and_disconnect(seqs, committed, gammas):  # the client of request 0 leaves mid-round
        emitted = commit_round(seqs, committed, gammas)
        if len(engine.steps) == 4:
            engine.abort_request(0)
        return emitted

    engine.parts = Parts(commit_round=commit_and_disconnect)
    engine.add_request([1, 2, 3], 30, gamma=4)
    engine.add_request([1, 2, 4], 30, gamma=4)
    outputs = []
    while engine.has_unfinished():
        step = engine.step()
        outputs.append(step)
    assert 0 not in outputs[4] and all(0 not in o for o in outputs[4:])
    streamed = [t for o in outputs for t in o.get(0, [])]
    assert engine.done[0].status is SeqStatus.ABORTED and engine.done[0].output == streamed
    assert streamed == _reference(target, [1, 2, 3], 30)[: len(streamed)]
    assert engine.done[1].output == _reference(target, [1, 2, 4], 30)
    assert len(engine.free_blocks) == engine.num_blocks


@pytest.mark.parametrize("caching", [False, True])
def test_seeded_faults_leak_nothing_and_change_no_surviving_token(pair, caching):
    """200 requests through a pool small enough to preempt, with random aborts (between steps and inside
    them, some in steps that then fail), and parts that fail now and then: no block leaks, every request that
    survives equals batch-1 greedy decoding, every aborted one emitted a prefix of it, and no acknowledged abort
    is lost to a failed step's rollback."""
    target, draft = pair
    rng = random.Random(7)
    in_step: list[int] = []  # aborts acknowledged during the current step, by a part (a client leaving mid-step)

    def leaving(part):
        def call(*args):
            live = engine.waiting + engine.running
            if live and rng.random() < 0.01:
                victim = rng.choice(live).seq_id
                assert engine.abort_request(victim) is True
                in_step.append(victim)
            return part(*args)
        return call

    failing = {name: leaving(Flaky(PARTS[name], {rng.randrange(1, 400) for _ in range(4)})) for name in PARTS}
    engine = ServingEngine(target, draft, num_blocks=36, block_size=4, token_budget=48, max_gamma=4,
                           prefix_caching=caching, parts=Parts(**failing), costs=SYNTHETIC_COSTS, measure_gain=False)
    requests = _shared_prefix_requests(rng, 200)
    ids, streamed, failures, aborted = [], {}, 0, set()
    acknowledged_in_failed_steps: set[int] = set()
    pending = list(enumerate(requests))
    while pending or engine.has_unfinished():
        for _ in range(rng.randrange(0, 4)):
            if pending:
                i, (prompt, max_tokens) = pending.pop(0)
                ids.append(engine.add_request(prompt, max_tokens, gamma=[0, 2, 4, "auto"][i % 4]))
        if engine.running and rng.random() < 0.08:
            victim = rng.choice(engine.running + engine.waiting).seq_id
            assert engine.abort_request(victim)
            aborted.add(victim)
        if not engine.has_unfinished():
            continue
        in_step.clear()
        try:
            for seq_id, tokens in engine.step().items():
                assert seq_id not in aborted, "an aborted request emitted tokens"
                streamed.setdefault(seq_id, []).extend(tokens)
        except StepError:
            failures += 1
            acknowledged_in_failed_steps.update(in_step)
        aborted.update(s for s in in_step if s in engine.done and engine.done[s].status is SeqStatus.ABORTED)
        _balanced(engine)
    assert failures >= 5 and aborted and sum(s.preemptions for s in engine.done.values()) > 0
    assert acknowledged_in_failed_steps, "no abort was asked for during a step that failed: the test tests nothing"
    lost = [i for i in acknowledged_in_failed_steps if engine.done[i].status is not SeqStatus.ABORTED]
    assert not lost, f"aborts acknowledged during a failed step were rolled back with it: requests {lost}"
    assert len(engine.free_blocks) == engine.num_blocks and not engine.refs
    for i, (prompt, max_tokens) in zip(ids, requests):
        seq, reference = engine.done[i], _reference(target, prompt, max_tokens)
        assert seq.output == streamed.get(i, [])
        if i in aborted:
            assert seq.status is SeqStatus.ABORTED and reference[: len(seq.output)] == seq.output
        else:
            assert seq.status is SeqStatus.FINISHED and seq.output == reference


# ---- suffix decoding -----------------------------------------------------------------------------
def test_suffix_tree_counts_substrings_within_documents_only():
    from specdec.production.suffix import SuffixTree

    tree = SuffixTree(depth=4)
    tree.extend("a", [1, 2, 3, 1, 2])
    tree.extend("b", [4, 1, 2, 5])
    assert tree.root.count == 9
    assert tree.root.children[1].count == 3 and tree.root.children[1].children[2].count == 3
    assert tree.root.children[1].children[2].children[3].count == 1  # 1 2 3 once; 1 2 5 once
    assert 4 not in tree.root.children[2].children  # "a" ends with 2 and "b" starts with 4: never joined
    assert tree.longest_match([9, 3, 1, 2]) == (3, tree.root.children[3].children[1].children[2])
    assert tree.longest_match([7, 7]) == (0, None)
    tree.extend("a", [3])  # a document grows where it ended: 1 2 3 again
    assert tree.root.children[1].children[2].children[3].count == 2


def test_suffix_proposals_follow_the_most_frequent_continuation_and_grow_with_the_match():
    from specdec.production.suffix import SuffixTree, propose_from_tree

    tree = SuffixTree(depth=8)
    for doc, tokens in enumerate([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 6], [9, 2, 7]]):
        tree.extend(doc, tokens)
    drafts, prob = propose_from_tree(tree, [0, 1, 2], max_drafts=8, factor=2.0, min_prob=0.1)
    assert drafts == [3, 4, 6] and prob == pytest.approx(2 / 3)  # a match of 2 allows up to 4 drafts
    assert propose_from_tree(tree, [0, 1, 2], 8, factor=1.0)[0] == [3, 4]  # factor 1: as long as the match
    assert propose_from_tree(tree, [8, 2], 8, factor=4.0)[0] == [3, 4, 6]  # after 2: 3 three times out of four
    assert propose_from_tree(tree, [8, 2], 8, factor=4.0, min_prob=0.8)[0] == []  # 3/4 < 0.8: no draft
    assert propose_from_tree(tree, [0, 0], 8) == ([], 0.0)  # no match, no draft
    tie = SuffixTree(depth=4)
    tie.extend(0, [5, 9])
    tie.extend(1, [5, 7])
    assert propose_from_tree(tie, [5], 1, factor=1.0, min_prob=0.0)[0] == [7]  # a tie goes to the lower id


def test_suffix_decoding_is_greedy_identical_and_learns_across_requests(pair):
    from specdec.production.suffix import SuffixProposer, proposer_generate

    target, _ = pair
    proposer, forwards = SuffixProposer(depth=16), []
    counter = target.register_forward_hook(lambda *_: forwards.append(1))
    try:
        for turn in range(3):
            prompt = [1, 2, 3, 4, 5, 6, 7, 8][: 5 + turn]
            proposer.start(turn, prompt)
            before = len(forwards)
            out = proposer_generate(target, prompt, 30, lambda tokens: proposer.propose(turn, tokens, 6),
                                    on_commit=lambda tokens: proposer.commit(turn, tokens))
            rounds = len(forwards) - before - 1  # the prefill is one forward
            proposer.finish(turn, prompt + out)
            assert out == _reference(target, prompt, 30)
        assert rounds < 30, "a repeated request should be drafted from the earlier ones"
    finally:
        counter.remove()


def test_suffix_sampling_is_exact():
    """A deterministic proposer's drafts verified as one-hot q: the first three tokens are distributed as the
    target's, enumerated (seeded Monte Carlo, the tolerance of specdec.checks.stats)."""
    from specdec.checks.stats import compare_frequencies
    from specdec.params import SamplingParams
    from specdec.production.suffix import proposer_generate

    target, _ = tiny_pair(vocab=6, noise=0.1)
    params, prompt = SamplingParams(temperature=1.0), [1, 2]
    with torch.no_grad():
        joint: dict[tuple[int, ...], float] = {}
        first = params.probs(target(torch.tensor([prompt]))[0, -1])
        for a in range(6):
            second = params.probs(target(torch.tensor([prompt + [a]]))[0, -1])
            for b in range(6):
                third = params.probs(target(torch.tensor([prompt + [a, b]]))[0, -1])
                for c in range(6):
                    joint[(a, b, c)] = float(first[a] * second[b] * third[c])
    generator = torch.Generator().manual_seed(0)
    samples = [tuple(proposer_generate(target, prompt, 3, lambda tokens: [3, 3, 0], params, generator))
               for _ in range(3000)]
    compare_frequencies(samples, joint, "suffix-style one-hot verification")


# ---- grammar-constrained speculation ---------------------------------------------------------------
def test_the_grammar_compiles_a_regular_expression_over_bytes():
    from specdec.production.grammar import Grammar

    call = Grammar(r'\{"name": "[a-z_]+", "n": \d+(, "ok": (true|false))?\}')
    assert call.matches(list(b'{"name": "read_file", "n": 12}'))
    assert call.matches(list(b'{"name": "x", "n": 0, "ok": false}'))
    for bad in (b'{"name": "", "n": 1}', b'{"name": "a", "n": }', b'{"name": "a", "n": 1, "ok": maybe}',
                b'{"name": "a", "n": 1'):
        assert not call.matches(list(bad)), bad
    assert Grammar("[^a]b*").matches(list(b"zbbb")) and not Grammar("[^a]b*").matches(list(b"ab"))
    for broken in ("(ab", "ab)", "*a", "[ab", "a\\", ""):
        with pytest.raises(ValueError):
            Grammar(broken)


def test_the_matcher_validates_without_advancing_and_rolls_back():
    from specdec.production.grammar import Grammar, Matcher

    m = Matcher(Grammar("ab+c"))
    assert m.validate(list(b"abbx")) == 3 and m.state == 0
    assert not m.accept(list(b"abx")) and m.state == 0, "a refused accept must change nothing"
    assert m.accept(list(b"abb"))
    allowed = {i for i in range(256) if m.allowed()[i]}
    assert allowed == set(b"bc")
    m.rollback(2)
    assert {i for i in range(256) if m.allowed()[i]} == set(b"b")
    assert m.accept(list(b"bc")) and m.finished()
    with pytest.raises(ValueError):
        m.rollback(4)


def test_speculative_masks_give_one_mask_per_position_and_leave_the_matcher_alone():
    from specdec.production.grammar import Grammar, Matcher, speculative_masks

    m = Matcher(Grammar("a[bc]d"))
    n, masks = speculative_masks(m, list(b"abx"))
    assert n == 2 and masks.shape == (3, 256) and m.state == 0
    assert [set(row.nonzero().flatten().tolist()) for row in masks] == [set(b"a"), set(b"bc"), set(b"d")]


def _constrained_samples(round_fn, follows: bool, n: int = 4000) -> tuple[list, dict]:
    """n outputs of a speculative loop around ``round_fn`` on notebook 13's toy models, and the exact distribution."""
    from specdec.checks.production import TOY_PATTERN, constrained_joint, speculate, toy_model
    from specdec.params import SamplingParams
    from specdec.production.grammar import Grammar

    target, draft, params = toy_model(0, 6, 1.5), toy_model(1, 6, 1.5), SamplingParams(temperature=1.0)
    grammar = Grammar(TOY_PATTERN, vocab_size=6)
    generator = torch.Generator().manual_seed(0)
    samples = [speculate(round_fn, target, draft, [1, 2], 3, grammar, 2, params, generator, follows)
               for _ in range(n)]
    return samples, constrained_joint(target, [1, 2], grammar, params, 3)


@pytest.mark.parametrize("follows", [False, True])
def test_constrained_speculation_is_exact_by_enumeration(follows):
    """Speculation under a grammar that forbids much of what the draft proposes and ends early on some paths:
    the output is distributed as constrained target-only sampling's (seeded Monte Carlo, the tolerance of
    specdec.checks.stats), whether the draft ignores the grammar (cuts) or follows it."""
    from specdec.checks.stats import compare_frequencies
    from specdec.production.grammar import constrained_round

    samples, joint = _constrained_samples(constrained_round, follows)
    compare_frequencies(samples, joint, "constrained speculation")


def test_dropping_the_forbidden_draft_instead_of_rejecting_it_is_caught():
    """The mistake the exactness test must see: cut before the forbidden draft and sample from p' there."""
    from specdec.checks.core import CheckFailure
    from specdec.checks.stats import compare_frequencies
    from specdec.production.grammar import constrained_round

    def drop_forbidden(matcher, drafts, q, logits, params, generator):
        n = matcher.validate(drafts)
        return constrained_round(matcher, drafts[:n], q[:n], logits[: n + 1], params, generator)

    samples, joint = _constrained_samples(drop_forbidden, False)
    with pytest.raises(CheckFailure):
        compare_frequencies(samples, joint, "constrained speculation")


@pytest.mark.parametrize("follows", [False, True])
def test_constrained_speculation_is_greedy_identical_and_respects_the_grammar(pair, follows):
    from specdec.production.grammar import Grammar, Matcher, constrained_generate, constrained_target_only

    target, draft = pair
    grammar = Grammar("(\x01[\x02-\x09]*\x0a|[\x0b-\x1f]\x00)+\x1f?\x1e", vocab_size=32)
    for prompt in ([3, 4, 5], [7, 1], [30, 31, 2, 9]):
        expected = constrained_target_only(target, prompt, 40, grammar)
        got = constrained_generate(target, draft, prompt, 40, grammar, 4, draft_follows_grammar=follows)
        assert got == expected, (prompt, got, expected)
        assert Matcher(grammar).validate(got) == len(got), f"the output left the grammar: {got}"


# ---- the allocation contract of prefix caching ------------------------------------------------------
def _serve(engine: ServingEngine, requests: list[tuple[list[int], int, int | str]], script: random.Random
           ) -> tuple[dict[int, list[int]], set[int], str | None]:
    """Feed ``requests`` to ``engine`` a few per step and abort one now and then (the same choices whatever the
    engine, drawn from ``script``); blocks balanced after every step. Returns the streamed outputs, the aborted
    requests and the error that stopped the run (None if every request ended)."""
    pending, streamed, aborted = list(requests), {}, set()
    plan = [(script.randrange(0, 3), script.random() < 0.1, script.random()) for _ in range(10_000)]
    for adds, abort, pick in plan:
        for _ in range(min(adds, len(pending))):
            prompt, max_tokens, gamma = pending.pop(0)
            engine.add_request(prompt, max_tokens, gamma=gamma)
        live = engine.waiting + engine.running
        if abort and live:
            victim = live[int(pick * len(live))].seq_id
            assert engine.abort_request(victim)
            aborted.add(victim)
        if not engine.has_unfinished():
            if not pending:
                return streamed, aborted, None
            continue
        try:
            for seq_id, tokens in engine.step().items():
                streamed.setdefault(seq_id, []).extend(tokens)
        except RuntimeError as error:
            return streamed, aborted, str(error)
        _balanced(engine)
    raise AssertionError("the workload did not end in 10,000 steps")


@pytest.mark.parametrize("seed", range(12))
def test_prefix_caching_never_makes_a_servable_workload_fail(pair, seed):
    """vLLM's contract: a request's matched blocks are referenced only when its allocation succeeds (a waiting
    request holds nothing), so caching never stops a workload that runs without it. Seeded workloads of requests
    sharing prefixes, gamma 0 to 6 and "auto", random aborts, pools down to the smallest that serves the largest
    request alone: whatever completes without caching completes with it, with the same outputs."""
    target, draft = pair
    rng = random.Random(seed)
    block_size, max_gamma = rng.choice([2, 4]), 6
    requests = [(prompt, max_tokens, rng.choice([0, 1, 2, 3, 4, 5, 6, "auto"]))
                for prompt, max_tokens in _shared_prefix_requests(rng, rng.randrange(4, 14))]
    smallest = max(blocks_for(len(p) + m + max_gamma, block_size) for p, m, _ in requests)
    num_blocks, token_budget = smallest + rng.randrange(0, 4), rng.choice([8, 16, 32])
    runs = {}
    for caching in (False, True):
        engine = ServingEngine(target, draft, num_blocks=num_blocks, block_size=block_size, max_gamma=max_gamma,
                               token_budget=token_budget, prefix_caching=caching, costs=SYNTHETIC_COSTS,
                               measure_gain=False)
        runs[caching] = (*_serve(engine, requests, random.Random(seed + 1000)), engine)
    if runs[False][2] is None:
        assert runs[True][2] is None, f"prefix caching made a servable workload fail: {runs[True][2]}"
    for streamed, aborted, error, engine in runs.values():
        for i, (prompt, max_tokens, _) in enumerate(requests):
            reference, out = _reference(target, prompt, max_tokens), streamed.get(i, [])
            assert reference[: len(out)] == out if i in aborted or error else out == reference
        if error is None:
            assert len(engine.free_blocks) == engine.num_blocks and not engine.refs


def test_the_hit_counters_count_a_request_once_however_long_it_waits(pair):
    """A request is looked up once per admission: waiting behind a long prefill for several steps does not dilute
    the hit rate (vLLM counts a request's query when it is scheduled)."""
    target, draft = pair
    engine = ServingEngine(target, draft, num_blocks=60, block_size=4, token_budget=8, prefix_caching=True)
    engine.add_request(list(range(1, 13)), 4)
    engine.run()  # publishes the 3 full blocks of its prompt
    cache = engine.prefix_cache
    assert (cache.queried_tokens, cache.hit_tokens) == (12, 0)
    engine.add_request([20 + i % 7 for i in range(30)], 4)  # 30 prompt tokens: 4 steps of the whole budget
    hitting = engine.add_request(list(range(1, 13)) + [31], 4)
    waited = 0
    while all(s.seq_id != hitting for s in engine.running):
        engine.step()
        waited += 1
        assert all(not s.block_table for s in engine.waiting), "a waiting request holds blocks"
    engine.run()
    assert waited >= 3
    assert (cache.queried_tokens, cache.hit_tokens) == (12 + 30 + 13, 12)
    assert engine.done[hitting].output == _reference(target, list(range(1, 13)) + [31], 4)
