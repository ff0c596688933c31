"""The engine on small random Llamas: greedy equality, cache invariants, exact sampling."""

from __future__ import annotations

import pytest
import torch

from specdec.checks.engine import target_joint, tiny_pair
from specdec.checks.stats import compare_frequencies
from specdec.models.model import Llama, LlamaConfig
from specdec.params import SamplingParams
from specdec.recording import SpeculativeEngine


def _pair(vocab: int = 32, noise: float = 0.3, seed: int = 0) -> tuple[Llama, Llama]:
    return tiny_pair(vocab, noise, seed)


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_output_equals_target_only(gamma):
    target, draft = _pair()
    engine = SpeculativeEngine(target, draft)
    prompt = [1, 2, 3, 4]
    plain = engine.generate_target_only(prompt, 40)
    spec = engine.generate(prompt, 40, gamma)
    assert spec.tokens == plain.tokens
    assert 0 < spec.acceptance_rate < 1 and len(spec.rounds) < 40


def test_cache_lengths_follow_the_walk_the_shapes_rule():
    target, draft = _pair()
    spec = SpeculativeEngine(target, draft).generate([5, 9], 30, 3)
    committed = 2
    saw_full = saw_partial = False
    for r in spec.rounds:
        P = committed
        committed += r.committed
        assert r.target_cache_len == P + r.accepted == committed - 1
        if r.accepted == r.proposed:
            saw_full = True
            assert r.draft_cache_len == committed - 2  # one short: it catches up next round
        else:
            saw_partial = True
            assert r.draft_cache_len == committed - 1
    assert saw_full and saw_partial


def test_sampling_is_exact():
    """The first 3 tokens of speculative sampling follow the target's exact joint distribution
    (enumerated from the model), within 5 sigma per outcome over 1500 seeded runs."""
    target, draft = _pair(vocab=6, noise=0.5, seed=3)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 2]
    exact = target_joint(target, prompt, params)
    engine = SpeculativeEngine(target, draft)
    g = torch.Generator().manual_seed(0)
    runs = [tuple(engine.generate(prompt, 3, 2, params, g).tokens) for _ in range(1500)]
    compare_frequencies(runs, exact, "speculative sampling, first 3 tokens")


def test_top_k_top_p_are_applied():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert (SamplingParams(1.0, top_k=2).probs(logits)[2:] == 0).all()
    p = SamplingParams(1.0, top_p=0.7).probs(logits)
    assert p[0] > 0 and p[1] > 0 and p[3] == 0 and abs(float(p.sum()) - 1) < 1e-12


def test_bad_input():
    target, draft = _pair()
    engine = SpeculativeEngine(target, draft)
    with pytest.raises(ValueError, match="gamma must be >= 1"):
        engine.generate([1], 5, 0)
    with pytest.raises(ValueError, match="exceed the target's context of 96"):
        engine.generate(list(range(30)) * 3, 10, 4)
    with pytest.raises(ValueError, match="non-empty list of token ids"):
        engine.generate([], 5, 2)
    other = Llama(LlamaConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=96))
    with pytest.raises(ValueError, match="vocabularies differ"):
        SpeculativeEngine(target, other)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 32\)"):
        engine.generate([1, 40], 5, 2)
    with pytest.raises(ValueError, match="n_tokens must be >= 1"):
        engine.generate([1], 0, 2)


def test_unknown_or_mismatched_checkpoints(tmp_path):
    from specdec.models.checkpoints import load, load_pair, save

    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load(tmp_path / "nowhere.safetensors")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_pair(tmp_path)
    target, _ = _pair()
    other = Llama(LlamaConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=96))
    save(target, tmp_path / "target.safetensors")
    save(other, tmp_path / "draft.safetensors")
    with pytest.raises(ValueError, match="vocabulary"):
        load_pair(tmp_path)
