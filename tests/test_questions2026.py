"""Notebook 15's package: the parallel drafter's layout and proposals, the hybrid target's two forms and rollback,
the moved target and the log-probabilities read from the verify pass."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.checks.questions2026 import hybrid_joint, tiny_drafter, tiny_hybrid
from specdec.engine import target_only_generate
from specdec.models.checkpoints import load, load_pair
from specdec.params import GREEDY, SamplingParams
from specdec.paths import DATA_DIR
from specdec.questions2026 import drift, hybrid, ledger, parallel


def test_cod_layout_keeps_whole_chains_within_the_window():
    g = torch.Generator().manual_seed(0)
    positions, depths = parallel.cod_layout(64, 8, [max(0.7 ** k, 0.2) for k in range(1, 8)], g)
    chains = {(int(p) - int(d), int(d)) for p, d in zip(positions, depths)}
    for anchor, depth in chains:
        assert depth == 0 or (anchor, depth - 1) in chains, "a kept mask's chain is whole (conditional drop)"
        assert anchor + depth <= 63, "every mask's label lies in the window"
    per_depth = [int((depths == k).sum()) for k in range(8)]
    assert per_depth[0] == 64 and all(a >= b for a, b in zip(per_depth, per_depth[1:]))
    with pytest.raises(ValueError, match="retain"):
        parallel.cod_layout(8, 4, [0.5], g)


def test_training_mask_reproduces_inference_for_every_token():
    """The drafter's output for each token of a training sequence equals its output in that token's inference
    layout (the prefix up to its anchor, then its chain's masks, causal)."""
    drafter = tiny_drafter()
    g = torch.Generator().manual_seed(1)
    text = torch.randint(0, parallel.mask_id(drafter), (1, 20), generator=g)
    positions, depths = parallel.cod_layout(20, 5, [0.9, 0.8, 0.7, 0.6], g)
    order = torch.randperm(len(positions), generator=g)  # any order: positions and depths decide
    positions, depths = positions[order], depths[order]
    tokens = torch.where(depths == 0, text[0, positions.clamp(max=19)], torch.tensor(parallel.mask_id(drafter)))
    with torch.no_grad():
        out = drafter(tokens[None], position_ids=positions, mask=parallel.parallel_training_mask(positions, depths))[0]
        for i in range(len(positions)):
            anchor, depth = int(positions[i] - depths[i]), int(depths[i])
            chain = torch.cat([text[:, : anchor + 1], torch.full((1, depth), parallel.mask_id(drafter))], 1)
            assert torch.allclose(drafter(chain)[0, -1], out[i], atol=1e-4)


def test_with_mask_token_keeps_the_drafts_logits_on_real_tokens():
    _, draft = load_pair()
    drafter = parallel.with_mask_token(draft)
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        assert torch.allclose(drafter(ids)[..., :256], draft(ids), atol=1e-5)
    assert drafter.config.vocab_size == 257 and parallel.mask_id(drafter) == 256


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(1.0)])
def test_parallel_loop_is_exact(params):
    """Greedy: target-only decoding's tokens. Sampling: the verifier's exactness with a prefix-only q (the loop's
    first tokens follow the target's law, by enumeration on small random models)."""
    target, draft = load_pair()
    drafter = load(DATA_DIR / "models" / "parallel_drafter.safetensors")
    prompt = list(b"def area(r):\n    return ")
    if params is GREEDY:
        tokens, stats = parallel.speculative_with_stats(target, parallel.ParallelProposer(drafter), prompt, 40, 6)
        assert tokens == target_only_generate(target, prompt, 40)
        assert all(0 <= a <= p for a, p in zip(stats["accepted"], stats["proposed"]))
        return
    from collections import Counter

    from specdec.checks.engine import target_joint, tiny_pair

    small_target = tiny_pair(vocab=6, noise=0.5, seed=3)[0]
    small_drafter = tiny_drafter()  # vocab 7: six tokens and the mask
    exact = target_joint(small_target, [1, 2], params)
    g = torch.Generator().manual_seed(0)
    n = 1500
    counts = Counter(tuple(parallel.speculative_with_stats(small_target, parallel.ParallelProposer(small_drafter),
                                                           [1, 2], 3, 2, params, g)[0]) for _ in range(n))
    for outcome, p in exact.items():
        assert abs(counts.get(outcome, 0) / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1 / n


def test_hybrid_parallel_form_equals_the_stepwise_form():
    target, _ = tiny_hybrid()
    ids = torch.randint(0, 5, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = target(ids)  # 40 positions: the parallel form
        cache = hybrid.HybridCache(target.config, batch_size=2)
        steps = torch.cat([target(ids[:, t : t + 1], cache) for t in range(40)], 1)  # one at a time
        assert torch.allclose(whole, steps, atol=1e-4)
        cache = hybrid.HybridCache(target.config, batch_size=2)
        target(ids[:, :30], cache)
        _, per_position = target(ids[:, 30:35], cache, keep_states=True)
        assert torch.equal(cache.states[0], per_position[0][:, -1])
        replay = hybrid.HybridCache(target.config, batch_size=2)
        target(ids[:, :33], replay)  # the state after fed position 2 of the five
        assert torch.allclose(replay.states[1], per_position[1][:, 2], atol=1e-5)


def test_hybrid_strategies_agree_and_memory_is_counted():
    target, draft = hybrid.load_hybrid(), load_pair()[1]
    prompt = list(b"    for item in items:\n        ")
    want = hybrid.hybrid_target_only_generate(target, prompt, 40)
    assert hybrid.hybrid_speculative_generate(target, draft, prompt, 40, 4) == want
    tokens, refed = hybrid.hybrid_speculative_generate_recomputing(target, draft, prompt, 40, 4)
    assert tokens == want and refed >= 40
    c = target.config
    assert hybrid.recurrent_state_bytes(c, 2, 4, 2) == 2 * 3 * 5 * 4 * 32 * 64 * 2
    assert hybrid.recurrent_state_bytes(c, 2, 4, 2, per_position=False) == 2 * 3 * 2 * 4 * 32 * 64 * 2
    with pytest.raises(ValueError, match="layout"):
        hybrid.HybridConfig(layout="RXA")
    with pytest.raises(ValueError, match="keep_states"):
        target(torch.tensor([[1]]), keep_states=True)


def test_hybrid_sampling_is_exact_by_enumeration():
    target, draft = tiny_hybrid()
    params = SamplingParams(1.0)
    exact = hybrid_joint(target, [1, 3], params)
    assert abs(sum(exact.values()) - 1) < 1e-9
    from collections import Counter

    g, n = torch.Generator().manual_seed(0), 1500
    counts = Counter(tuple(hybrid.hybrid_speculative_generate(target, draft, [1, 3], 3, 2, params, g)) for _ in range(n))
    for outcome, p in exact.items():
        assert abs(counts.get(outcome, 0) / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1 / n


def test_moved_target_is_the_target_with_its_update_merged():
    target, _ = load_pair()
    moved = drift.moved_target()
    ids = torch.tensor([list(b"  if x:\n    return y\n")])
    with torch.no_grad():
        assert not torch.allclose(target(ids), moved(ids))
    assert set(drift.reindent("def f():\n    if a:\n        b\n").splitlines()) == {"def f():", "  if a:", "    b"}


def test_logprobs_from_the_verify_pass_equal_target_only_decoding():
    target, draft = load_pair()
    prompt = list(b"Question: Ana has 12 apples.")
    for params, temperature in ((GREEDY, None), (SamplingParams(0.8), 0.8)):
        tokens, logprobs = drift.speculative_with_logprobs(target, draft, prompt, 32, 4, params,
                                                           torch.Generator().manual_seed(0), temperature=temperature)
        plain = drift.target_only_logprobs(target, prompt, tokens, temperature)
        assert len(logprobs) == 32 and max(abs(a - b) for a, b in zip(logprobs, plain)) < 1e-4


def test_ledger_helpers():
    with pytest.raises(ValueError):
        ledger.best_gamma_by_position([], lambda g: 0.0, lambda g: 1.0)
    with pytest.raises(ValueError):
        ledger.best_gamma_by_position([1.5], lambda g: 0.0, lambda g: 1.0)
