"""The serving engine (notebook 11): greedy output equals batch-1 decoding for every request of
a mixed batch, sampling is exact, no KV block leaks, bad requests fail alone and clearly."""

from __future__ import annotations

import random

import pytest

from conftest import measured_costs
from specdec.checks.engine import shipped_pair, target_joint_after_first, tiny_pair
from specdec.checks.stats import compare_frequencies
from specdec.engine import target_only_generate
from specdec.models import corpus, tokenizer
from specdec.params import SamplingParams
from specdec.serving.engine import Parts, ServingEngine
from specdec.serving.scheduler import schedule_step
from specdec.serving.sequence import SeqStatus


def _until_stop(tokens: list[int], stop_ids: tuple[int, ...], stop_strings: tuple[str, ...]) -> list[int]:
    """The batch-1 reference cut at its first stop token or completed stop string."""
    for i in range(len(tokens)):
        text = tokens[: i + 1]
        if tokens[i] in stop_ids or any(tokenizer.decode(text).endswith(s) for s in stop_strings):
            return text
    return tokens


def _blocks_accounted(engine: ServingEngine) -> None:
    held = [b for s in engine.running + engine.waiting for b in s.block_table]
    everything = held + engine.free_blocks
    assert sorted(everything) == list(range(engine.num_blocks)), "a block is leaked or held twice"


def _run_checked(engine: ServingEngine) -> dict[int, list[int]]:
    """Step to the end, checking the block accounting and the budget after every step; the streamed tokens."""
    streamed: dict[int, list[int]] = {}
    while engine.has_unfinished():
        for seq_id, tokens in engine.step().items():
            streamed.setdefault(seq_id, []).extend(tokens)
        _blocks_accounted(engine)
        assert engine.steps[-1].target_tokens <= engine.token_budget
    assert len(engine.free_blocks) == engine.num_blocks
    return streamed


def _mixed_requests(seed: int, n: int = 18):
    rng = random.Random(seed)
    prompts = corpus.code_prompts(n // 2) + corpus.math_prompts(n - n // 2)
    requests = []
    for i, text in enumerate(prompts):
        prompt = tokenizer.encode(text)[: rng.randrange(1, 160)]
        stop_ids = (rng.choice(b"\n:=)"),) if i % 3 == 0 else ()
        stop_strings = ("return", "= ") if i % 4 == 1 else ()
        requests.append(dict(prompt=prompt, max_tokens=rng.randrange(1, 70), stop_token_ids=stop_ids, stop=stop_strings,
                             gamma=[0, 1, 3, 5, 8, "auto"][i % 6]))
    return requests


@pytest.mark.parametrize("budget, blocks", [(512, 400), (48, 400), (96, 30)],
                         ids=["roomy", "chunked-prefill", "preempting"])
def test_greedy_mixed_batch_equals_batch_one_decoding(budget, blocks):
    """18 greedy requests (prompt lengths 1-159, max_tokens 1-69, stop tokens and strings, gamma 0-8
    and auto) in one engine equal target-only decoding of each alone, token for token (float32, CPU)."""
    target, draft = shipped_pair()
    engine = ServingEngine(target, draft, num_blocks=blocks, block_size=8, token_budget=budget, max_gamma=8,
                           costs=measured_costs(target, draft))  # measured once for the three cases
    requests = _mixed_requests(seed=budget)
    ids = [engine.add_request(**r) for r in requests]
    streamed = _run_checked(engine)
    for seq_id, r in zip(ids, requests):
        expected = _until_stop(target_only_generate(target, r["prompt"], r["max_tokens"]), r["stop_token_ids"], r["stop"])
        seq = engine.done[seq_id]
        assert seq.output == expected, f"request {seq_id} ({r}) differs from batch-1 decoding"
        assert streamed[seq_id] == expected, "the streamed tokens are not the output (a token after a stop was sent?)"
    if blocks == 30:
        assert sum(s.preemptions for s in engine.done.values()) > 0, "the test meant to preempt did not"
    if budget == 48:
        assert any(len(r["prompt"]) > 48 for r in requests)
    assert any(s.accepted for s in engine.done.values())


def test_stop_inside_accepted_drafts_ends_the_request_there():
    """With gamma 8 and a stop token that greedy decoding reaches mid-round, nothing after it is emitted."""
    target, draft = shipped_pair()
    prompt = tokenizer.encode(corpus.code_prompts(1)[0])
    reference = target_only_generate(target, prompt, 40)
    stop = reference[11]  # the 12th token: inside a round of 8 drafts
    first = reference.index(stop)
    engine = ServingEngine(target, draft, num_blocks=64, block_size=4, max_gamma=8)
    seq_id = engine.add_request(prompt, 40, stop_token_ids=(stop,), gamma=8)
    streamed = _run_checked(engine)
    assert engine.done[seq_id].output == reference[: first + 1] == streamed[seq_id]
    assert engine.done[seq_id].accepted > 0


def test_max_tokens_is_never_overrun_by_accepted_drafts():
    target, draft = shipped_pair()
    engine = ServingEngine(target, draft, num_blocks=64, block_size=4)
    prompt = tokenizer.encode(corpus.math_prompts(1)[0])
    ids = {n: engine.add_request(prompt, n, gamma=8) for n in (1, 2, 5, 9, 10)}
    _run_checked(engine)
    reference = target_only_generate(target, prompt, 10)
    for n, seq_id in ids.items():
        assert engine.done[seq_id].output == reference[:n]


def test_sampling_is_exact_in_a_shared_batch():
    """2000 sampled requests with two different prompts (temperature 1, gamma 2 or auto), served about 30 at a time:
    tokens 2-4 of each (the first round of drafts, its bonus included; token 1 comes from the prefill) follow the
    target's exact joint distribution for its prompt, enumerated from the model (5 sigma per outcome)."""
    target, draft = tiny_pair(vocab=6, noise=0.5, seed=3)
    params, prompts = SamplingParams(temperature=1.0), ([1, 2], [4, 0, 3])
    engine = ServingEngine(target, draft, num_blocks=400, block_size=4, token_budget=100, max_gamma=2)
    ids = [engine.add_request(prompts[i % 2], 6, params, gamma=2 if i % 3 else "auto", seed=i) for i in range(2000)]
    engine.measure_costs(rows=(1, 64), per_row=(1, 3))
    _run_checked(engine)
    for k, prompt in enumerate(prompts):
        exact = target_joint_after_first(target, prompt, params)
        compare_frequencies([tuple(engine.done[i].output[1:4]) for i in ids[k::2]], exact,
                            f"serving engine, prompt {prompt}, tokens 2-4")
    assert sum(s.proposed for s in engine.done.values()) > 4000


def test_a_request_output_does_not_depend_on_its_batch():
    """A seeded sampled request with a fixed gamma, with room for everyone (no budget trimming, no preemption),
    gives the same tokens alone and among others."""
    target, draft = tiny_pair(vocab=32, noise=0.3, seed=1)
    params = SamplingParams(temperature=0.8, top_k=10)
    alone = ServingEngine(target, draft, num_blocks=64, block_size=4)
    seq_id = alone.add_request([3, 4, 5], 20, params, gamma=3, seed=42)
    alone.run()
    crowd = ServingEngine(target, draft, num_blocks=64, block_size=4)
    for i in range(5):
        crowd.add_request([i + 1] * (i + 2), 15, params, gamma=i % 4, seed=i)
    other = crowd.add_request([3, 4, 5], 20, params, gamma=3, seed=42)
    crowd.run()
    assert crowd.done[other].output == alone.done[seq_id].output


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(prompt=[1] * 90, max_tokens=10), ValueError, "exceed the model's context of 96"),
    (dict(prompt=[1, 2], max_tokens=0), ValueError, "max_tokens must be >= 1"),
    (dict(prompt=[1, 2], max_tokens=5, stop=5), TypeError, "stop must be a string or a list of strings"),
    (dict(prompt=[1, 2], max_tokens=5, stop=[""]), ValueError, "must not be empty"),
    (dict(prompt=[1, 2], max_tokens=5, stop_token_ids=[99]), TypeError, "stop_token_ids"),
    (dict(prompt=[], max_tokens=5), ValueError, "the prompt is empty"),
    (dict(prompt=[1, 40], max_tokens=5), ValueError, "in [0, 32)"),
    (dict(prompt=[1, 2], max_tokens=5, gamma=-1), ValueError, "gamma must be >= 0"),
    (dict(prompt=[1, 2], max_tokens=5, gamma="fast"), TypeError, "gamma must be an integer"),
    (dict(prompt=[1, 2], max_tokens=5, gamma=9), ValueError, "exceeds this engine's max_gamma=8"),
    (dict(prompt=[1, 2], max_tokens=5, params=SamplingParams(temperature=-1.0)), ValueError, "temperature"),
    (dict(prompt=[1] * 40, max_tokens=50), ValueError, "needs up to 23 blocks of 4 slots; the engine has 20"),
])
def test_bad_requests_fail_alone_with_a_clear_error(kwargs, error, words):
    target, draft = tiny_pair(vocab=32)
    engine = ServingEngine(target, draft, num_blocks=20, block_size=4)
    good = engine.add_request([5, 6, 7], 6, gamma=2)
    with pytest.raises(error, match=_escape(words)):
        engine.add_request(**kwargs)
    assert [s.seq_id for s in engine.waiting] == [good]
    engine.run()
    assert len(engine.done[good].output) == 6 and len(engine.free_blocks) == 20


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_speculation_without_a_draft_is_refused():
    target, _ = tiny_pair(vocab=32)
    engine = ServingEngine(target, num_blocks=20, block_size=4)
    with pytest.raises(ValueError, match="needs a draft model"):
        engine.add_request([1, 2], 4, gamma=3)
    seq_id = engine.add_request([1, 2], 4)
    assert engine.run()[seq_id].output == target_only_generate(target, [1, 2], 4)


def test_engine_settings_are_checked():
    target, draft = tiny_pair(vocab=32)
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        ServingEngine(target, draft, token_budget=0)
    other = tiny_pair(vocab=16)[0]
    with pytest.raises(ValueError, match="vocabularies differ"):
        ServingEngine(target, other)
    with pytest.raises(TypeError, match=r"parts must be a Parts, for example Parts\(commit_round=commit_round\)"):
        ServingEngine(target, draft, parts={"commit_round": lambda *a: None})
    with pytest.raises(TypeError, match="Parts.schedule_step must be a function"):
        Parts(schedule_step=None)


def test_requests_move_through_their_states():
    """WAITING until admitted, RUNNING while decoding, WAITING again if preempted, FINISHED at the end, with
    arrival, first-token and finish times in that order; the scheduler hands back the Seq objects it chose."""
    target, draft = tiny_pair(vocab=32)
    seen = []

    def spying_schedule(running, waiting, *args):
        scheduled, preempted = schedule_step(running, waiting, *args)
        seen.append(all(any(s is r for r in running + waiting) for s in [*scheduled, *preempted]))
        return scheduled, preempted

    engine = ServingEngine(target, draft, num_blocks=8, block_size=4, token_budget=16, parts=Parts(schedule_step=spying_schedule))
    ids = [engine.add_request([i + 1] * 6, 10, gamma=2) for i in range(3)]
    assert all(s.status is SeqStatus.WAITING for s in engine.waiting)
    engine.step()
    assert all(s.status is SeqStatus.RUNNING for s in engine.running) and engine.running
    assert all(s.status is SeqStatus.WAITING for s in engine.waiting)
    done = engine.run()
    assert all(seen) and sum(s.preemptions for s in done.values()) > 0, "the pool was meant to force a preemption"
    for seq_id in ids:
        seq = done[seq_id]
        assert seq.is_finished and seq.status is SeqStatus.FINISHED
        assert seq.arrival_time <= seq.first_token_time <= seq.finish_time


def test_auto_gamma_turns_speculation_off_when_verification_is_costly():
    """With costs where every extra token costs a full forward, "auto" rows only probe (one draft, now and then, to
    keep measuring acceptance); with flat costs they draft deeply. Greedy output is unchanged either way."""
    from specdec.serving.adaptive import StepCosts

    target, draft = tiny_pair(vocab=32, noise=0.1)
    for costs, deep in (((StepCosts([1, 100], [1.0, 100.0]), StepCosts([1, 100], [0.2, 20.0])), False),
                        ((StepCosts([1, 100], [1.0, 1.0]), StepCosts([1, 100], [0.01, 0.01])), True)):
        engine = ServingEngine(target, draft, num_blocks=200, block_size=4, costs=costs, max_gamma=4, measure_gain=False)
        for i in range(6):
            engine.add_request([i + 1, 2], 30, gamma="auto")
        done = engine.run()
        assert (max(s.max_gamma for s in engine.steps) >= 3) == deep
        if not deep:
            assert sum(s.speculating_rows > 0 for s in engine.steps) < len(engine.steps) / 2
        assert all(s.output == target_only_generate(target, s.prompt, 30) for s in done.values())


def test_goodput_gate_overrules_the_model_only_on_a_measured_gain_and_probes_less_often_as_probes_agree():
    """Paired steps (a speculating one beside plain ones, same batch) measure what speculation costs; with the
    tokens a round commits (E(alpha, gamma) until enough rounds were seen) that is the gain, and beyond the margin
    it wins over the model's gamma; the arm not in use is probed at doubling intervals, rarely once the gain is
    far from 1; once two pairs measured the cost, a probe of speculation drafts for a share of the rows only;
    a new batch size starts afresh."""
    from specdec.ledger import expected_tokens_per_round as E
    from specdec.serving.adaptive import GoodputGate

    gate = GoodputGate(margin=0.05, sure=1.0, probe_every=4, max_interval=16, min_rounds=10**9, probe_share=8)
    assert gate.decide(0, 64, 0.8, 4, 4) == (0, 64)  # nothing measured yet: try the other arm (plain) first
    gate.record(0, 64, 0, 0.064, 64, 0.8)
    assert gate.decide(1, 64, 0.8, 4, 4) == (4, 64)
    gate.record(1, 64, 4, 0.320, 200, 0.8)  # a verify step costs 5 plain steps
    assert gate.gain(0.8) == pytest.approx(E(0.8, 4) / 5) and gate.gain(0.99) == pytest.approx(E(0.99, 4) / 5)
    probes = []
    for step in range(2, 40):
        gamma, drafting = gate.decide(step, 64, 0.8, 4, 4)
        seconds = 0.064 + 0.256 * drafting / 64 if gamma else 0.064
        gate.record(step, 64, gamma, seconds, 200 * drafting // 64 if gamma else 64, 0.8, drafting=drafting)
        probes += [(step, drafting)] * (gamma > 0)
    # the measured loss (0.67) overrules the model; probes 4, 8, 16 steps apart; the second pair measured the
    # cost, so the next probe drafts for one row in eight; the one after is of every row again, since the newest
    # pair is max_interval steps old by then
    assert probes == [(5, 64), (13, 8), (29, 64)]
    assert len(gate.pairs) == 3  # one pair per probe of every row, not one per plain step beside it
    gate.record(40, 64, 0, 0.064, 64, 0.8)
    gate.record(41, 64, 4, 0.100, 200, 0.8)  # one cheap probe does not outvote three pairs
    assert gate.decide(42, 64, 0.8, 4, 4) == (0, 64)
    gate.record(45, 8, 3, 0.010, 24, 0.8)  # a new batch size: nothing measured there, so plain is probed first
    assert gate.gain(0.8) is None and gate.decide(46, 8, 0.8, 3, 3) == (0, 8)
    gate.record(46, 8, 0, 0.008, 8, 0.8)  # ratio 1.25 at gamma 3: gain E(0.8, 3) / 1.25 = 2.36
    assert gate.decide(47, 8, 0.8, 0, 3) == (3, 8) and gate.decide(47, 8, 0.8, 2, 3) == (2, 8)  # overrules a 0
    assert gate.decide(48, 8, 0.1, 2, 3) == (0, 8)  # the same costs at alpha 0.1: a loss (E(0.1, 3) / 1.25 = 0.89)
    gate.record(60, 16, 0, 0.016, 16, 0.8)
    gate.record(61, 16, 1, 0.0288, 32, 0.8)  # ratio 1.8 at gamma 1, alpha 0.8: gain 1.0, within the margin
    assert gate.decide(62, 16, 0.8, 0, 3) == (0, 16) and gate.decide(63, 16, 0.8, 2, 3) == (2, 16)

    measured = GoodputGate(min_rounds=16, probe_every=4, max_interval=64)
    measured.record(0, 32, 0, 0.032, 32, 0.9)
    measured.record(1, 32, 1, 0.048, 48, 0.9)  # rounds of one draft commit 1.5 tokens, not E(0.9, 1) = 1.9
    assert measured.tokens_per_round(0.9, 1) == pytest.approx(1.5) and measured.gain(0.9) == pytest.approx(1.0)
    assert measured.tokens_per_round(0.9, 4) == pytest.approx(E(0.9, 4))  # no rounds seen at 4: the model's E
    assert measured.interval == 4  # a gain near 1: probe again soon
    for step in (2, 4):  # plain steps got dearer than a speculating one: noise, so the ratio counts as 1
        measured.record(step, 32, 0, 0.064, 32, 0.9)
        measured.record(step + 1, 32, 1, 0.048, 48, 0.9)
        assert measured.pairs[-1][1] == 1.0
    assert measured.gain(0.9) == pytest.approx(1.5) and measured.interval == 64  # three pairs, far from 1


def test_goodput_gate_pairs_a_probe_with_the_median_of_the_steps_beside_it():
    """One slow plain step (a garbage collection, say) beside a probe does not make the pair: the probe is
    compared with the median of the other arm's unpaired steps of the last pair_within steps."""
    from specdec.serving.adaptive import GoodputGate

    gate = GoodputGate(min_rounds=1, pair_within=4)
    for step, seconds in enumerate((0.032, 0.032, 0.320, 0.032)):  # the third plain step took ten times as long
        gate.record(step, 32, 0, seconds, 32, 0.9)
    gate.record(4, 32, 2, 0.096, 96, 0.9)  # 3 tokens per row for 3 plain steps' time: a gain of 1
    assert gate.pairs[-1][:2] == (2, pytest.approx(3.0)) and gate.gain(0.9) == pytest.approx(1.0)


def test_goodput_gate_keeps_each_batch_sizes_book_and_outlives_an_engine():
    """What the gate measured at a batch size comes back with that batch size (within a quarter), not only while
    the batch stays there; a new engine given the gate goes on from it: no fresh probe of the other arm, and no
    step of the new engine pairs with a step of the old one."""
    from specdec.serving.adaptive import GoodputGate, StepCosts

    gate = GoodputGate(probe_every=4, max_interval=64, min_rounds=10**9, pair_within=4)
    for step in range(0, 6, 2):  # at 64 rows a verify step costs 5 plain steps: three pairs, a clear loss
        gate.record(step, 64, 0, 0.064, 64, 0.8)
        gate.record(step + 1, 64, 4, 0.320, 200, 0.8)
    loss = gate.gain(0.8)
    assert loss < 0.95 and gate.interval == 64
    gate.record(6, 8, 0, 0.008, 8, 0.8)  # the batch moves to 8: nothing known there
    assert gate.gain(0.8) is None and gate.decide(7, 8, 0.8, 3, 3) == (3, 8)
    assert gate.decide(8, 60, 0.8, 4, 4) == (0, 60)  # back near 64: its book, so plain, no probe of speculation
    assert gate.rows == 64 and gate.gain(0.8) == pytest.approx(loss)
    assert gate.decide(8, 8, 0.8, 3, 3) == (3, 8) and gate.pairs == []  # and 8's book, which holds one plain step

    target, draft = tiny_pair(vocab=32, noise=0.1)
    flat = (StepCosts([1, 100], [1.0, 1.0]), StepCosts([1, 100], [0.01, 0.01]))
    clock = gate.clock
    engine = ServingEngine(target, draft, num_blocks=64, block_size=4, costs=flat, gate=gate)
    assert engine.gate is gate and gate.offset == clock + gate.pair_within + 1
    gate.record(0, 8, 4, 0.010, 24, 0.8)  # the new engine's step 0 is later than anything seen: it pairs with
    assert gate.pairs == []  # no plain step of the old engine
    with pytest.raises(ValueError, match="measure_gain=False"):
        ServingEngine(target, draft, costs=flat, gate=gate, measure_gain=False)


def test_a_probe_on_a_share_of_the_rows_drafts_for_the_rows_the_draft_is_closest_to():
    """When the gate probes speculation on a share of the rows, that many "auto" rows draft: those whose draft has
    the fewest tokens to catch up (so the same rows, probe after probe); the others decode plainly, and every
    output is still plain decoding's (greedy)."""
    from specdec.serving.adaptive import GoodputGate, StepCosts

    class ShareGate(GoodputGate):  # probes two rows whenever it may
        def decide(self, step, rows, alpha, model_gamma, fallback_gamma):
            return (3, 2) if step % 3 == 0 else (0, rows)

    target, draft = tiny_pair(vocab=32, noise=0.1)
    flat = (StepCosts([1, 100], [1.0, 1.0]), StepCosts([1, 100], [0.01, 0.01]))
    engine = ServingEngine(target, draft, num_blocks=200, block_size=4, costs=flat, max_gamma=4)
    engine.gate = ShareGate()
    prompts = [[5, 1, 2, 3, 4, 5, 6], [7, 8], [9, 1, 2, 3, 4], [3, 4, 5]]  # the two shortest prompts: ids 1 and 3
    ids = [engine.add_request(prompt, 24, gamma="auto") for prompt in prompts]
    drafting, draft = [], engine._draft
    engine._draft = lambda rows, gammas: (rows and drafting.append({s.seq_id for s in rows})) or draft(rows, gammas)
    _run_checked(engine)
    assert {s.speculating_rows for s in engine.steps if s.speculating_rows} == {2}
    assert drafting[:3] == [{ids[1], ids[3]}] * 3  # while all four run, the rows the draft is closest to
    assert all(s.output == target_only_generate(target, s.prompt, 24) for s in engine.done.values())


def test_auto_rows_estimate_alpha_from_tested_positions_not_the_acceptance_rate():
    """The adaptive rule feeds E(alpha, gamma) with accepted / tested positions (A / (A + R)), which is at least
    the draft acceptance rate accepted / proposed, and above it as soon as a round stops at a rejection."""
    from specdec.serving.adaptive import StepCosts

    target, draft = shipped_pair()
    flat = (StepCosts([1, 100], [1.0, 1.0]), StepCosts([1, 100], [0.01, 0.01]))  # extra positions cost nothing: deep
    engine = ServingEngine(target, draft, max_gamma=8, costs=flat, measure_gain=False)  # drafts, whatever the clock
    ids = [engine.add_request(tokenizer.encode(p), 40, gamma="auto") for p in corpus.math_prompts(2)]
    while engine.has_unfinished():
        engine.step()
    seqs = [engine.done[i] for i in ids]
    accepted, proposed, rejections = (sum(getattr(s, k) for s in seqs) for k in ("accepted", "proposed", "rejections"))
    assert rejections > 0 and proposed > accepted + rejections
    evidence_accepted, evidence_tested = engine.auto_evidence
    assert 0 < evidence_accepted < evidence_tested
    assert evidence_accepted / evidence_tested > accepted / proposed  # decayed evidence, the same ordering
