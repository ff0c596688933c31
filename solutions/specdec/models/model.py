"""A small Llama-style decoder with a KV cache, in the spirit of nanoGPT's model.py.

RMSNorm, rotary positions (the "rotate half" layout), SwiGLU MLP, grouped-query
attention, no biases; parameter names follow Hugging Face's LlamaForCausalLM so a
checkpoint converts by renaming nothing. The cache supports appending several
positions in one forward, cropping to a length (the speculative rollback), and an
explicit attention mask over cached + new positions (tree attention, notebook 07).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4
    d_ff: int = 688
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    n_experts: int = 0  # > 0: every MLP is a mixture of that many experts of d_ff each (notebook 14)
    top_k: int = 0  # the experts each token is routed to

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"need n_kv_heads | n_heads | d_model, got {self.n_kv_heads}, {self.n_heads}, {self.d_model}")
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"need 1 <= top_k <= n_experts for a mixture of experts, got {self.top_k} of {self.n_experts}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


class KVCache:
    """K and V for every layer: (n_layers, B, n_kv_heads, max_len, head_dim), valid up to ``length``.

    ``KVCache(config)`` builds the cache of that config's model: a model from elsewhere (a Hugging
    Face checkpoint, :mod:`specdec.models.pretrained`) names its own subclass as ``config.cache_class``, so a
    loop written against this class runs unchanged on it.
    """

    def __new__(cls, config=None, *args, **kwargs):  # config may be absent: copy and pickle call __new__(cls)
        cache_class = getattr(config, "cache_class", None)
        if cls is KVCache and cache_class is not None:
            return super().__new__(cache_class)
        return super().__new__(cls)

    def __init__(self, config: LlamaConfig, batch_size: int = 1, max_len: int | None = None,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        """``dtype`` and ``device`` default to those of the first keys written: the cache follows the model that
        writes it (a bfloat16 model on a GPU fills a bfloat16 cache on that GPU), wherever the cache was made.
        K and V are allocated at that first write, or at a read before it (then in ``dtype`` or torch's default
        dtype, on ``device`` or torch's default device)."""
        self.max_len = max_len or config.max_seq_len
        self._shape = (config.n_layers, batch_size, config.n_kv_heads, self.max_len, config.head_dim)
        self._dtype, self._device = dtype, device
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.length = 0  # positions 0..length-1 hold valid entries

    def _allocate(self, dtype: torch.dtype | None, device: torch.device | str | None) -> None:
        self._k = torch.zeros(self._shape, dtype=dtype, device=device)
        self._v = torch.zeros(self._shape, dtype=dtype, device=device)

    @property
    def k(self) -> torch.Tensor:
        """(n_layers, B, n_kv_heads, max_len, head_dim)."""
        if self._k is None:
            self._allocate(self._dtype, self._device)
        return self._k

    @k.setter
    def k(self, value: torch.Tensor) -> None:
        self._k = value

    @property
    def v(self) -> torch.Tensor:
        if self._v is None:
            self._allocate(self._dtype, self._device)
        return self._v

    @v.setter
    def v(self, value: torch.Tensor) -> None:
        self._v = value

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, n_kv_heads, T, head_dim) at length..length+T-1; return all valid K, V."""
        if self._k is None:  # the first write: the model's dtype and device, unless the cache was given others
            self._allocate(self._dtype or k.dtype, self._device or k.device)
        if self._k.device != k.device:
            raise ValueError(f"this KV cache is on {self._k.device} and the model writing it on {k.device}: make the "
                             "cache with no device (it then follows the model) or on the model's device")
        T = k.shape[2]
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {self.length} cached + {T} new > max_len {self.max_len}")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        """Mark n more positions as valid (after every layer has written them)."""
        self.length += n

    def crop(self, length: int) -> None:
        """Roll back to the first ``length`` positions; later entries are overwritten next time."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length


def rope_tables(config: LlamaConfig, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (max_seq_len, head_dim), in the "rotate half" layout."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float32, device=device) / half))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, hd) rotated by position: cos, sin (T, hd) or (B, 1, T, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class TokenEmbedding(nn.Embedding):
    """nn.Embedding that takes token ids from the host as well: the loops build them from Python lists, and a model
    on a GPU moves them over (a copy it needs anyway) instead of failing."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids.to(self.weight.device))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        d, hd = config.d_model, config.head_dim
        self.q_proj = nn.Linear(d, config.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.n_heads * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                cache: KVCache | None, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        c = self.config
        q = self.q_proj(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        v = self.v_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.write(layer, k, v)  # (B, KV, L, hd): cached + new
        # Grouped-query attention without copying K and V: the `groups` query heads that share
        # a KV head are stacked along the query axis, (B, KV, groups * T, hd).
        groups, L = c.n_heads // c.n_kv_heads, k.shape[2]
        q = q.reshape(B, c.n_kv_heads, groups * T, c.head_dim)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)  # (B, KV, groups * T, L)
        if mask is None and T > 1:  # causal over the new positions, everything cached is visible
            mask = torch.ones(T, L, dtype=torch.bool, device=x.device).tril(L - T)
        elif mask is not None:
            mask = mask.to(x.device)  # a tree mask built on the host (notebook 07)
        if mask is not None:
            scores = scores.view(B, c.n_kv_heads, groups, T, L).masked_fill(~mask, float("-inf")).view_as(scores)
        out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v  # (B, KV, groups * T, hd)
        # (Written out rather than F.scaled_dot_product_attention: its CPU kernel is slow for
        # one or a few query positions, the decode case.)
        out = out.view(B, c.n_heads, T, c.head_dim).transpose(1, 2)  # (B, T, H, hd)
        return self.o_proj(out.reshape(B, T, c.n_heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEMLP(nn.Module):
    """Routed SwiGLU experts (Mixtral's layout): a linear router scores the experts for each token, the token goes to
    its ``top_k`` best, and their outputs are summed with the softmax of those scores as weights. ``routing``
    keeps the expert ids of the latest forward, (tokens, top_k) in the order of the flattened input, what notebook
    14 measures; ``balance`` the load-balancing loss of the latest forward (Switch Transformer's: experts times the
    sum over experts of the share of tokens routed there and the mean router probability there; 1 when even)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(config) for _ in range(config.n_experts))
        self.routing: torch.Tensor | None = None
        self.balance = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, d)
        scores = self.router(flat)  # (N, E)
        top, ids = scores.topk(self.top_k, dim=-1)  # (N, k)
        weights = torch.softmax(top, dim=-1)
        self.routing = ids.detach()
        if self.training:
            share = torch.zeros(scores.shape[1], device=scores.device).index_add_(
                0, ids.flatten(), torch.ones(ids.numel(), device=scores.device)) / ids.numel()
            self.balance = scores.shape[1] * (share * torch.softmax(scores, dim=-1).mean(0)).sum()
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (ids == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, weights[rows, slot, None] * expert(flat[rows]))
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MoEMLP(config) if config.n_experts else MLP(config)

    def forward(self, x, cos, sin, layer, cache, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """tokens (B, T) -> logits (B, T, V). With a cache, the tokens continue what it holds."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = TokenEmbedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None, position_ids: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, return_hidden: bool = False, taps: tuple[int, ...] = ()):
        """tokens (B, T), on the model's device or the host; position_ids (T,) default cache.length + arange(T);
        mask (T, L) bool, True where a new position may attend (L = cached + T), default causal. With ``return_hidden``:
        (logits, features), the features (B, T, d) being the LM head's input, after the final norm (what
        Medusa heads and the EAGLE drafter read, notebook 12). With ``taps`` (layer counts in 1..n_layers):
        (logits, features, tapped), tapped (B, T, len(taps) * d) the residual stream after each of those
        layers, concatenated in the order given (what an EAGLE-3-style drafter fuses, notebook 13)."""
        B, T = tokens.shape
        start = cache.length if cache is not None else 0
        last = start + T - 1 if position_ids is None else int(position_ids.max())
        if last >= self.config.max_seq_len:
            raise ValueError(f"position {last} is beyond max_seq_len {self.config.max_seq_len}")
        if position_ids is None:  # consecutive positions: a slice, no gather
            cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]  # (T, hd)
        else:
            cos, sin = self.rope_cos[position_ids], self.rope_sin[position_ids]
        if any(not 1 <= t <= self.config.n_layers for t in taps):
            raise ValueError(f"taps must be layer counts in 1..{self.config.n_layers}, got {taps}")
        x = self.embed_tokens(tokens)
        tapped = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, cache, mask)
            if i + 1 in taps:
                tapped[i + 1] = x
        if cache is not None:
            cache.advance(T)
        features = self.norm(x)
        logits = self.lm_head(features)
        if taps:
            return logits, features, torch.cat([tapped[t] for t in taps], dim=-1)
        return (logits, features) if return_hidden else logits

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
