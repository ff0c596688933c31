"""Notebook 11, "lossless is not bitwise": the same logits from a one-token decode step and from a verify
forward over several positions, compared bit for bit, with the verify run by the same attention code or by a
second kernel (PyTorch's fused scaled_dot_product_attention, which reduces in blocks, as GPU servers use one
kernel for decode and another for multi-token verification)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specdec.models.model import KVCache, Llama, apply_rope


@torch.inference_mode()
def forward_fused_attention(model: Llama, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """model(tokens, cache) with attention computed by F.scaled_dot_product_attention: (B, T, V)."""
    c = model.config
    B, T = tokens.shape
    start = cache.length
    cos, sin = model.rope_cos[start : start + T], model.rope_sin[start : start + T]
    x = model.embed_tokens(tokens)
    for i, layer in enumerate(model.layers):
        attn, h = layer.self_attn, layer.input_layernorm(x)
        q = attn.q_proj(h).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = attn.k_proj(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = cache.write(i, k, v)
        mask = torch.ones(T, k.shape[2], dtype=torch.bool, device=q.device).tril(k.shape[2] - T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, H, T, hd)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    cache.advance(T)
    return model.lm_head(model.norm(x))


@dataclass
class Comparison:
    positions: int = 0
    max_abs_diff: float = 0.0
    identical_positions: int = 0
    flips: list[dict] = field(default_factory=list)  # where the argmax differs: the two top-2 lists


@torch.inference_mode()
def decode_vs_verify(model: Llama, prompts: list[list[int]], dtype: torch.dtype, fused_verify: bool,
                     context: int = 60, positions: int = 40, gamma: int = 4) -> Comparison:
    """Logits of ``positions`` tokens after ``context`` tokens of each prompt, computed (a) one token at a
    time and (b) gamma + 1 positions per forward (a verify), in ``dtype``; how they differ."""
    model = copy.deepcopy(model).to(dtype)
    result = Comparison()
    for p, tokens in enumerate(prompts):
        decode_cache, verify_cache = KVCache(model.config, dtype=dtype), KVCache(model.config, dtype=dtype)
        model(torch.tensor([tokens[:context]]), decode_cache)
        model(torch.tensor([tokens[:context]]), verify_cache)
        span = tokens[context : context + positions]
        decoded = torch.cat([model(torch.tensor([[t]]), decode_cache)[0] for t in span])  # (positions, V)
        chunks = [span[i : i + gamma + 1] for i in range(0, len(span), gamma + 1)]
        verified = torch.cat([(forward_fused_attention(model, torch.tensor([c]), verify_cache) if fused_verify
                               else model(torch.tensor([c]), verify_cache))[0] for c in chunks])
        diff = (decoded.float() - verified.float()).abs().amax(-1)  # (positions,)
        result.positions += len(span)
        result.max_abs_diff = max(result.max_abs_diff, float(diff.max()))
        result.identical_positions += int((diff == 0).sum())
        for j in torch.nonzero(decoded.argmax(-1) != verified.argmax(-1)).flatten().tolist():
            top = [[(int(i), float(v)) for v, i in zip(*row.float().topk(2))] for row in (decoded[j], verified[j])]
            result.flips.append({"prompt": p, "position": context + j, "decode_top2": top[0], "verify_top2": top[1],
                                 "decode_argmax": int(decoded[j].argmax()), "verify_argmax": int(verified[j].argmax())})
    return result
