"""The model runner: one forward of the course's Llama over a ragged batch with a paged KV cache.

A step's batch is flat: the new tokens of every row, one after another, ``N = sum(q_lens)``
of them. Projections and MLPs run on (N, d) with no padding. Attention needs each row's
whole context: its K and V are gathered from the row's blocks into a (B, L_max) view
that exists only for the matmul; the cache itself holds each token once, in its slot.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.models.devices import on_device
from specdec.models.model import Llama, LlamaConfig, apply_rope
from specdec.serving.blocks import blocks_for, slot_mapping


class PagedKV:
    """K and V of every layer in one pool of slots: (n_layers, num_blocks * block_size, n_kv_heads, head_dim), on the
    device of the model that writes them (the serving engine passes its model's)."""

    def __init__(self, config: LlamaConfig, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (config.n_layers, num_blocks * block_size, config.n_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

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


SHORT = 16  # rows feeding at most this many tokens share one padded attention call; longer rows get their own


@dataclass
class _AttentionGroup:
    """Rows whose attention runs as one padded (B, T, L) call: their flat token indices and key slots."""

    tokens: torch.Tensor  # (n,) indices into the step's flat tokens
    rows: torch.Tensor  # (n,) the token's row within the group
    cols: torch.Tensor  # (n,) the token's index among its row's new tokens
    ctx_slots: torch.Tensor  # (B, L) the slot of every context position of every row (0 beyond its length)
    mask: torch.Tensor  # (B, T, L) True where a query may attend
    shape: tuple[int, int, int]  # B, T, L


def _groups(batch: RaggedBatch, block_size: int, device: torch.device | str = "cpu") -> list[_AttentionGroup]:
    """The step's attention groups, built on the host (many small tensors) and moved to ``device`` once each."""
    q_lens = batch.q_lens
    offsets = [0, *itertools.accumulate(q_lens)]
    short = [b for b, n in enumerate(q_lens) if n <= SHORT]
    members = ([short] if short else []) + [[b] for b, n in enumerate(q_lens) if n > SHORT]
    groups = []
    for rows in members:
        lens, starts = [q_lens[b] for b in rows], [batch.starts[b] for b in rows]
        B, T, L = len(rows), max(lens), max(s + n for s, n in zip(starts, lens))
        key_pos = torch.arange(L)
        table = torch.zeros(B, blocks_for(L, block_size), dtype=torch.long)
        for g, b in enumerate(rows):
            t = batch.block_tables[b][: table.shape[1]]
            table[g, : len(t)] = torch.tensor(t, dtype=torch.long)
        ctx_slots = table[:, key_pos // block_size] * block_size + key_pos % block_size  # (B, L)
        tokens = torch.cat([torch.arange(offsets[b], offsets[b] + q_lens[b]) for b in rows])
        row_in_group = torch.repeat_interleave(torch.arange(B), torch.tensor(lens))
        cols = torch.cat([torch.arange(n) for n in lens])
        q_pos = torch.full((B, T), -1, dtype=torch.long)  # padded queries see nothing
        q_pos[row_in_group, cols] = torch.tensor(starts)[row_in_group] + cols
        ctx = torch.tensor([s + n for s, n in zip(starts, lens)])
        mask = (key_pos.view(1, 1, L) <= q_pos.view(B, T, 1)) & (key_pos.view(1, 1, L) < ctx.view(B, 1, 1))
        moved = (t.to(device) for t in (tokens, row_in_group, cols, ctx_slots, mask))
        groups.append(_AttentionGroup(*moved, (B, T, L)))
    return groups


@torch.inference_mode()
def paged_forward(model: Llama, kv: PagedKV, batch: RaggedBatch, logit_rows: list[list[int]] | None = None,
                  mapping: Callable = slot_mapping) -> list[torch.Tensor]:
    """Run the new tokens of every row through the model, writing their K and V into their slots.

    Returns one logits tensor per row, (len(logit_rows[b]), V), for the positions of the row's
    new tokens listed in ``logit_rows[b]`` (default: all of them); the LM head runs on those only.
    ``mapping``: the slot mapping function (notebook 11's exercise; the reference by default).
    The index tensors are built on the host and moved to the device of ``kv`` (the model's) once each.
    """
    c, bs, device = model.config, kv.block_size, kv.k.device
    q_lens = batch.q_lens
    if max(s + n for s, n in zip(batch.starts, q_lens)) > c.max_seq_len:
        raise ValueError(f"a row goes beyond max_seq_len {c.max_seq_len}")
    with on_device("cpu"):  # even under torch.device(the GPU): small index tensors, moved once each
        slots = torch.as_tensor(mapping(batch.block_tables, batch.starts, q_lens, bs), dtype=torch.long)  # (N,)
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(batch.starts, q_lens)])  # (N,)
        groups = _groups(batch, bs, device)
    slots, positions = slots.to(device), positions.to(device)
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]  # (N, hd)
    x = model.embed_tokens(torch.tensor([t for row in batch.tokens for t in row], device=device))  # (N, d)
    for i, layer in enumerate(model.layers):
        attn, h = layer.self_attn, layer.input_layernorm(x)
        q = attn.q_proj(h).view(-1, c.n_heads, c.head_dim).transpose(0, 1)  # (H, N, hd)
        k = attn.k_proj(h).view(-1, c.n_kv_heads, c.head_dim).transpose(0, 1)  # (KV, N, hd)
        v = attn.v_proj(h).view(-1, c.n_kv_heads, c.head_dim)  # (N, KV, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin).transpose(0, 1)
        kv.k[i, slots], kv.v[i, slots] = k.to(kv.k.dtype), v.to(kv.v.dtype)  # write first: a row sees its own new keys
        out = q.new_empty(q.shape[1], c.n_heads, c.head_dim)  # (N, H, hd)
        for g in groups:
            out[g.tokens] = _attend(q[:, g.tokens], kv.k[i], kv.v[i], g, c.n_kv_heads, x.dtype)
        x = x + attn.o_proj(out.reshape(-1, c.n_heads * c.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    offsets = [0, *itertools.accumulate(q_lens)]
    rows = logit_rows if logit_rows is not None else [list(range(n)) for n in q_lens]
    picked = torch.tensor([offsets[b] + j for b, js in enumerate(rows) for j in js], dtype=torch.long, device=device)
    logits = model.lm_head(model.norm(x[picked]))  # (sum of picked, V)
    return list(logits.split([len(js) for js in rows]))


def _attend(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, g: _AttentionGroup, n_kv_heads: int,
            dtype: torch.dtype) -> torch.Tensor:
    """One group's attention: q (H, n, hd) of its flat tokens -> (n, H, hd)."""
    H, _, hd = q.shape
    (B, T, L), groups = g.shape, H // n_kv_heads
    keys = k_pool[g.ctx_slots].to(dtype).permute(0, 2, 3, 1)  # (B, KV, hd, L), gathered from the row's blocks
    values = v_pool[g.ctx_slots].to(dtype).transpose(1, 2)  # (B, KV, L, hd)
    qp = q.new_zeros(H, B, T, hd)
    qp[:, g.rows, g.cols] = q
    # Grouped-query attention as in model.py: the query heads sharing a KV head stacked along the query axis.
    qp = qp.view(n_kv_heads, groups, B, T, hd).permute(2, 0, 1, 3, 4).reshape(B, n_kv_heads, groups * T, hd)
    scores = (qp @ keys) / math.sqrt(hd)  # (B, KV, groups * T, L)
    scores = scores.view(B, n_kv_heads, groups, T, L).masked_fill(~g.mask.view(B, 1, 1, T, L), float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(dtype)  # padded queries: all masked, zeros
    out = probs.view(B, n_kv_heads, groups * T, L) @ values  # (B, KV, groups * T, hd)
    return out.view(B, H, T, hd)[g.rows, :, g.cols]  # (n, H, hd)
