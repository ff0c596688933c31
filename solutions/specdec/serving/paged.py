"""The model runner: one forward of the course's Llama over a ragged batch with a paged KV cache.

A step's batch is flat: the new tokens of every row, one after another, ``N = sum(q_lens)``
of them. Projections and MLPs run on (N, d) with no padding. Attention needs each row's
whole context: its K and V are gathered from the row's blocks into a (B, L_max) view
that exists only for the matmul; the cache itself holds each token once, in its slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.model import Llama, LlamaConfig, apply_rope
from specdec.serving.blocks import blocks_for, slot_mapping


class PagedKV:
    """K and V of every layer in one pool of slots: (n_layers, num_blocks * block_size, n_kv_heads, head_dim)."""

    def __init__(self, config: LlamaConfig, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (config.n_layers, num_blocks * block_size, config.n_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass
class RaggedBatch:
    """What one forward needs, for B rows; row b feeds ``tokens[b]`` at positions ``starts[b]...``."""

    tokens: list[list[int]]
    starts: list[int]  # tokens already in the row's cache
    block_tables: list[list[int]]

    @property
    def q_lens(self) -> list[int]:
        return [len(t) for t in self.tokens]


@torch.inference_mode()
def paged_forward(model: Llama, kv: PagedKV, batch: RaggedBatch, logit_rows: list[list[int]] | None = None) -> list[torch.Tensor]:
    """Run the new tokens of every row through the model, writing their K and V into their slots.

    Returns one logits tensor per row, (len(logit_rows[b]), V), for the positions of the row's
    new tokens listed in ``logit_rows[b]`` (default: all of them); the LM head runs on those only.
    """
    c, bs = model.config, kv.block_size
    q_lens, B = batch.q_lens, len(batch.tokens)
    starts = torch.tensor(batch.starts)
    if max(s + n for s, n in zip(batch.starts, q_lens)) > c.max_seq_len:
        raise ValueError(f"a row goes beyond max_seq_len {c.max_seq_len}")
    slots = slot_mapping(batch.block_tables, batch.starts, q_lens, bs)  # (N,)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(batch.starts, q_lens)])  # (N,)
    row_of = torch.repeat_interleave(torch.arange(B), torch.tensor(q_lens))  # (N,)
    ctx_lens = starts + torch.tensor(q_lens)  # (B,)
    L, T = int(ctx_lens.max()), max(q_lens)
    # The row's context gathered from its blocks, (B, L): slot of each cached position (0 beyond ctx_len).
    key_pos = torch.arange(L)
    table = torch.zeros(B, blocks_for(L, bs), dtype=torch.long)
    for b, t in enumerate(batch.block_tables):
        table[b, : len(t)] = torch.tensor(t[: table.shape[1]], dtype=torch.long)
    ctx_slots = table[:, key_pos // bs] * bs + key_pos % bs  # (B, L)
    # Padded query layout (B, T): where each flat token sits, and the mask over keys.
    col = positions - starts[row_of]  # (N,): index among the row's new tokens
    q_pos = torch.zeros(B, T, dtype=torch.long)
    q_pos[row_of, col] = positions
    mask = (key_pos.view(1, 1, L) <= q_pos.view(B, T, 1)) & (key_pos.view(1, 1, L) < ctx_lens.view(B, 1, 1))  # (B, T, L)

    cos, sin = model.rope_cos[positions], model.rope_sin[positions]  # (N, hd)
    x = model.embed_tokens(torch.tensor([t for row in batch.tokens for t in row]))  # (N, d)
    groups = c.n_heads // c.n_kv_heads
    for i, layer in enumerate(model.layers):
        attn, h = layer.self_attn, layer.input_layernorm(x)
        q = attn.q_proj(h).view(-1, c.n_heads, c.head_dim).transpose(0, 1)  # (H, N, hd)
        k = attn.k_proj(h).view(-1, c.n_kv_heads, c.head_dim).transpose(0, 1)  # (KV, N, hd)
        v = attn.v_proj(h).view(-1, c.n_kv_heads, c.head_dim)  # (N, KV, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin).transpose(0, 1)
        kv.k[i, slots], kv.v[i, slots] = k.to(kv.k.dtype), v.to(kv.v.dtype)  # write first: a row sees its own new keys
        keys = kv.k[i, ctx_slots].to(x.dtype).permute(0, 2, 3, 1)  # (B, KV, hd, L)
        values = kv.v[i, ctx_slots].to(x.dtype).transpose(1, 2)  # (B, KV, L, hd)
        qp = q.new_zeros(c.n_heads, B, T, c.head_dim)
        qp[:, row_of, col] = q
        qp = qp.view(c.n_kv_heads, groups, B, T, c.head_dim).permute(2, 0, 1, 3, 4).reshape(B, c.n_kv_heads, groups * T, c.head_dim)
        scores = (qp @ keys) / math.sqrt(c.head_dim)  # (B, KV, groups * T, L)
        scores = scores.view(B, c.n_kv_heads, groups, T, L).masked_fill(~mask.view(B, 1, 1, T, L), float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(x.dtype)  # padded query rows: all masked
        out = probs.view(B, c.n_kv_heads, groups * T, L) @ values  # (B, KV, groups * T, hd)
        out = out.view(B, c.n_heads, T, c.head_dim)[row_of, :, col]  # (N, H, hd)
        x = x + attn.o_proj(out.reshape(-1, c.n_heads * c.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    offsets = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    rows = logit_rows if logit_rows is not None else [list(range(n)) for n in q_lens]
    picked = torch.tensor([offsets[b] + j for b, js in enumerate(rows) for j in js], dtype=torch.long)
    logits = model.lm_head(model.norm(x[picked]))  # (sum of picked, V)
    return list(logits.split([len(js) for js in rows]))

