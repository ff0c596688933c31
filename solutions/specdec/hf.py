"""The course's checkpoints inside Hugging Face transformers: the outside check.

``to_transformers(model)`` builds a ``LlamaForCausalLM`` with the same weights (our
parameter names are Hugging Face's, under ``model.``), so logits and greedy tokens can be
compared with an implementation nobody here wrote, and the benchmark can run
transformers' own assisted generation and prompt lookup on the same checkpoints.
transformers is optional: ``pip install -e ".[hf]"`` (the test extra includes it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdec.model import Llama

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "the Hugging Face check needs transformers: pip install -e \".[hf]\" (or transformers==5.23.0)"
        ) from error
    return transformers


def to_transformers(model: Llama, attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A transformers LlamaForCausalLM holding exactly ``model``'s weights (float32, eval mode)."""
    transformers = _transformers()
    c = model.config
    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # bytes: no special tokens
    )
    config._attn_implementation = attn_implementation
    hf = transformers.LlamaForCausalLM(config)
    state = {name if name.startswith("lm_head.") else f"model.{name}": tensor
             for name, tensor in model.state_dict().items()}
    hf.load_state_dict(state, strict=True)
    return hf.float().eval()


@torch.no_grad()
def hf_generate(hf: LlamaForCausalLM, prompt: list[int], n_tokens: int, **kwargs) -> list[int]:
    """Greedy generation of exactly n_tokens new tokens with transformers (batch 1).

    Extra keyword arguments go to ``generate``: ``assistant_model=`` for assisted
    generation, ``prompt_lookup_num_tokens=`` for prompt lookup.
    """
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                      do_sample=False, pad_token_id=0, **kwargs)
    return out[0, len(prompt):].tolist()
