"""The outside check: our model inside Hugging Face transformers gives the same logits
and the same greedy tokens, and transformers' own assisted generation and prompt lookup
agree with our engine on the same weights."""

import pytest
import torch

pytest.importorskip("transformers")

from specdec.models.hf import hf_generate, to_transformers  # noqa: E402
from specdec.models.model import Llama, LlamaConfig  # noqa: E402
from specdec.paths import DATA_DIR  # noqa: E402
from specdec.recording import SpeculativeEngine  # noqa: E402

TARGET = LlamaConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=160, max_seq_len=128)
DRAFT = LlamaConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=128)
SHIPPED = DATA_DIR / "models" / "target.safetensors"


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    return Llama(TARGET).eval(), Llama(DRAFT).eval()


@torch.no_grad()
def test_logits_agree_with_transformers(pair):
    for model in pair:
        tokens = torch.randint(0, 256, (2, 50), generator=torch.Generator().manual_seed(1))
        ours, theirs = model(tokens), to_transformers(model)(tokens).logits
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (ours - theirs).abs().max()


def test_greedy_and_assisted_generation_agree_with_our_engine(pair):
    target, draft = pair
    hf_target, hf_draft = to_transformers(target), to_transformers(draft)
    prompt = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = SpeculativeEngine(target, draft).generate(prompt, 40, gamma=3).tokens
    assert hf_generate(hf_target, prompt, 40) == ours
    assert hf_generate(hf_target, prompt, 40, assistant_model=hf_draft) == ours
    assert hf_generate(hf_target, prompt, 40, prompt_lookup_num_tokens=3) == ours


@pytest.mark.skipif(not SHIPPED.exists(), reason="no shipped checkpoint")
@torch.no_grad()
def test_shipped_checkpoints_agree_with_transformers():
    """Logits, greedy output and assisted generation (the shipped draft as assistant)."""
    from specdec.models import corpus, tokenizer
    from specdec.models.checkpoints import load_pair

    target, draft = load_pair(SHIPPED.parent)
    hf, hf_draft = to_transformers(target), to_transformers(draft)
    for prompt in (corpus.code_prompts(1)[0], corpus.math_prompts(1)[0]):
        ids = tokenizer.encode(prompt)
        ours, theirs = target(torch.tensor([ids])), hf(torch.tensor([ids])).logits
        assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (ours - theirs).abs().max()
        plain = SpeculativeEngine(target).generate_target_only(ids, 32).tokens
        assert hf_generate(hf, ids, 32) == plain
        assert hf_generate(hf, ids, 32, assistant_model=hf_draft) == plain
