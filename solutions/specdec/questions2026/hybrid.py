"""Notebook 15, targets with state: a small hybrid decoder (recurrent layers beside attention) and its rollback.

A recurrent layer here is gated linear attention with one scalar decay per head, the family of Mamba-2 and gated
DeltaNet (Qwen3-Next) without their short convolution: per head a matrix state S (d_key x d_value),

    S_t = a_t S_{t-1} + k_t v_t^T,   o_t = (q_t S_t) * silu(g_t),   a_t = sigmoid(w_a . x_t + b_a) in (0, 1).

Attention layers keep a KV cache, which a rejection rolls back by truncation. The recurrent state has no history
to truncate: S after position t has forgotten which tokens made it. So a verify pass that feeds the last committed
token and gamma drafts returns the state after *every* position (``keep_states``), and the round keeps the one
after the last accepted draft (:func:`select_states`): the per-position strategy, (gamma + 1) states per row per
recurrent layer. The other strategy keeps only the state from before the round and re-feeds the accepted tokens.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.chain import verify_drafts
from specdec.engine import propose, rollback
from specdec.models.model import MLP, Attention, KVCache, Llama, LlamaConfig, RMSNorm, TokenEmbedding, rope_tables
from specdec.params import GREEDY, SamplingParams, check_request
from specdec.sampling import sample

#: Beyond this many new positions a recurrent layer uses its parallel (attention-like) form; at or below it the
#: step-by-step form, so that decoding and verification run the same operations on the same numbers.
STEPWISE_UP_TO = 16


@dataclass(frozen=True)
class HybridConfig:
    vocab_size: int = 256
    d_model: int = 256
    layout: str = "RARR"  # one letter per layer: A attention (with a KV cache), R recurrent (with a state)
    n_heads: int = 4  # attention heads
    n_kv_heads: int = 2
    d_ff: int = 512
    rec_heads: int = 4
    d_key: int = 32  # per recurrent head: the state is d_key x d_value
    d_value: int = 64
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if not self.layout or set(self.layout) - {"A", "R"}:
            raise ValueError(f"layout is a string of 'A' (attention) and 'R' (recurrent) layers, got {self.layout!r}")

    @property
    def attention(self) -> LlamaConfig:
        """The config of the attention layers alone: what their KV cache is shaped by."""
        return LlamaConfig(vocab_size=self.vocab_size, d_model=self.d_model, n_layers=max(1, self.layout.count("A")),
                           n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, d_ff=self.d_ff,
                           max_seq_len=self.max_seq_len, rope_theta=self.rope_theta, norm_eps=self.norm_eps)

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One recurrent layer's state for one row: (rec_heads, d_key, d_value)."""
        return self.rec_heads, self.d_key, self.d_value

    def to_dict(self) -> dict:
        return asdict(self)


class HybridCache:
    """What a hybrid model carries between forwards: a KV cache for its attention layers and the latest state of each
    recurrent layer, ``states[i]`` (B, rec_heads, d_key, d_value). ``length``: positions fed so far."""

    def __init__(self, config: HybridConfig, batch_size: int = 1) -> None:
        self.kv = KVCache(config.attention, batch_size)
        self.states = [torch.zeros(batch_size, *config.state_shape) for _ in range(config.layout.count("R"))]

    @property
    def length(self) -> int:
        return self.kv.length


class Recurrent(nn.Module):
    """Gated linear attention with a scalar decay per head (see the module docstring)."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.config = config
        h, dk, dv, d = config.rec_heads, config.d_key, config.d_value, config.d_model
        self.q_proj = nn.Linear(d, h * dk, bias=False)
        self.k_proj = nn.Linear(d, h * dk, bias=False)
        self.v_proj = nn.Linear(d, h * dv, bias=False)
        self.g_proj = nn.Linear(d, h * dv, bias=False)
        self.a_proj = nn.Linear(d, h)  # decay logits; the bias starts the decays near 0.95
        self.o_proj = nn.Linear(h * dv, d, bias=False)

    def forward(self, x: torch.Tensor, state: torch.Tensor, keep_states: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d), state (B, H, dk, dv) before the first position. Returns (out (B, T, d), states): states is
        (B, T, H, dk, dv), the state after each position, with ``keep_states``, else (B, H, dk, dv), the last."""
        B, T, _ = x.shape
        c = self.config
        q = self.q_proj(x).view(B, T, c.rec_heads, c.d_key).transpose(1, 2) / math.sqrt(c.d_key)  # (B, H, T, dk)
        k = F.normalize(self.k_proj(x).view(B, T, c.rec_heads, c.d_key), dim=-1).transpose(1, 2)  # (B, H, T, dk)
        v = self.v_proj(x).view(B, T, c.rec_heads, c.d_value).transpose(1, 2)  # (B, H, T, dv)
        log_a = F.logsigmoid(self.a_proj(x)).transpose(1, 2)  # (B, H, T)
        state = state.to(x.dtype)
        if T <= STEPWISE_UP_TO or keep_states:  # one position at a time: decode and verify
            outs, kept = [], []
            for t in range(T):
                state = log_a[:, :, t, None, None].exp() * state + k[:, :, t, :, None] * v[:, :, t, None, :]
                outs.append((q[:, :, t, None, :] @ state).squeeze(2))  # (B, H, dv)
                kept.append(state)
            o = torch.stack(outs, dim=2)  # (B, H, T, dv)
            last = torch.stack(kept, dim=1) if keep_states else state
        else:  # the parallel form: o_t = q_t (A_t S_0 + sum_{s<=t} (A_t / A_s) k_s v_s^T), A_t = prod a_1..a_t
            cum = log_a.cumsum(-1)  # (B, H, T)
            decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(
                ~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf")).exp()  # (B, H, T, T)
            o = ((q @ k.transpose(-1, -2)) * decay) @ v + cum.exp()[..., None] * (q @ state)
            tail = (cum[..., -1:] - cum).exp()  # (B, H, T): A_T / A_s
            last = cum[..., -1].exp()[..., None, None] * state + (k * tail[..., None]).transpose(-1, -2) @ v
        gate = F.silu(self.g_proj(x)).view(B, T, c.rec_heads, c.d_value)
        out = (o.transpose(1, 2) * gate).reshape(B, T, c.rec_heads * c.d_value)
        return self.o_proj(out), last


class HybridBlock(nn.Module):
    def __init__(self, config: HybridConfig, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mixer = Attention(config.attention) if kind == "A" else Recurrent(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config.attention)


class HybridLM(nn.Module):
    """tokens (B, T) -> logits (B, T, V), continuing what ``cache`` holds (a :class:`HybridCache`), or from scratch."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = TokenEmbedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(HybridBlock(config, kind) for kind in config.layout)
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.attention)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
        for layer in self.layers:
            if layer.kind == "R":
                nn.init.constant_(layer.mixer.a_proj.bias, 3.0)  # sigmoid(3) = 0.95: a memory of about 20 tokens

    def forward(self, tokens: torch.Tensor, cache: HybridCache | None = None, keep_states: bool = False):
        """With ``keep_states`` (needs a cache): (logits, per_position) where per_position[i] is (B, T, H, dk, dv),
        recurrent layer i's state after each new position; the cache's states become the last ones either way."""
        B, T = tokens.shape
        if keep_states and cache is None:
            raise ValueError("keep_states needs a cache: the states are those of the positions it continues")
        start = cache.length if cache is not None else 0
        if start + T > self.config.max_seq_len:
            raise ValueError(f"position {start + T - 1} is beyond max_seq_len {self.config.max_seq_len}")
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]
        x = self.embed_tokens(tokens)
        kept, attention_index, recurrent_index = [], 0, 0
        for layer in self.layers:
            h = layer.input_layernorm(x)
            if layer.kind == "A":
                h = layer.mixer(h, cos, sin, attention_index, cache.kv if cache is not None else None, None)
                attention_index += 1
            else:
                state = (cache.states[recurrent_index] if cache is not None
                         else torch.zeros(B, *self.config.state_shape, device=x.device))
                h, states = layer.mixer(h, state, keep_states)
                if cache is not None:
                    cache.states[recurrent_index] = states[:, -1] if keep_states else states
                kept.append(states)
                recurrent_index += 1
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if cache is not None:
            cache.kv.advance(T)
        logits = self.lm_head(self.norm(x))
        return (logits, kept) if keep_states else logits

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def select_states(per_position: list[torch.Tensor], accepted: torch.Tensor) -> list[torch.Tensor]:
    """The recurrent states to keep after a verify pass, one per recurrent layer.

    per_position[i]: (B, T, H, dk, dv), layer i's state after each position the verify pass fed: position 0 is the
    last committed token, position j the j-th draft (T = gamma + 1). accepted: (B,) integer, the drafts each row
    accepted (0..gamma; rows differ). Returns, per layer, (B, H, dk, dv): each row's state after its last accepted
    draft (after the last committed token when it accepted none), the state the next round continues from (it feeds
    the round's correction or bonus token). Inputs are left as they are.
    """
    ### BEGIN SOLUTION
    rows = torch.arange(accepted.shape[0], device=accepted.device)
    return [states[rows, accepted.long()] for states in per_position]
    ### END SOLUTION


def recurrent_state_bytes(config: HybridConfig, rows: int, gamma: int, bytes_per_value: float,
                          per_position: bool = True) -> float:
    """Bytes of recurrent state a verify step holds: per recurrent layer and row, gamma + 1 states (one per fed
    position) for the per-position strategy, else 2 (the checkpoint from before the round and the running one)."""
    kept = gamma + 1 if per_position else 2
    return rows * config.layout.count("R") * kept * math.prod(config.state_shape) * bytes_per_value


@torch.inference_mode()
def hybrid_target_only_generate(target: HybridLM, prompt: list[int], n_tokens: int, params: SamplingParams = GREEDY,
                                generator: torch.Generator | None = None) -> list[int]:
    """Plain decoding with the hybrid target, one forward per token: the reference output."""
    check_request(target, None, prompt, n_tokens, 0)
    cache, tokens = HybridCache(target.config), list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    for _ in range(n_tokens):
        logits = target(torch.tensor([tokens[-1:]]), cache)[0, -1]
        tokens.append(int(sample(params.probs(logits), generator)))
    return tokens[len(prompt):]


@torch.inference_mode()
def hybrid_speculative_generate(target: HybridLM, draft: Llama, prompt: list[int], n_tokens: int, gamma: int,
                                params: SamplingParams = GREEDY, generator: torch.Generator | None = None) -> list[int]:
    """n_tokens new tokens from the hybrid target with ``draft`` proposing gamma tokens a round: distributed exactly
    as :func:`hybrid_target_only_generate`'s (equal when greedy). Draw every random number from ``generator``."""
    check_request(target, draft, prompt, n_tokens, gamma)
    ### BEGIN SOLUTION
    cache, draft_cache = HybridCache(target.config), KVCache(draft.config)
    tokens = list(prompt)
    if len(prompt) > 1:  # everything but the last token, which is the first round's input
        target(torch.tensor([prompt[:-1]]), cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        logits, per_position = target(torch.tensor([tokens[-1:] + drafts]), cache, keep_states=True)
        committed = verify_drafts(drafts, q, logits[0], params, generator)
        cache.states = select_states(per_position, torch.tensor([len(committed) - 1]))
        tokens += committed
        pending = rollback(cache.kv, draft_cache, P, drafts, committed)  # the KV cache: truncation
    return tokens[len(prompt) : len(prompt) + n_tokens]
    ### END SOLUTION


@torch.inference_mode()
def hybrid_speculative_generate_recomputing(target: HybridLM, draft: Llama, prompt: list[int], n_tokens: int,
                                            gamma: int, params: SamplingParams = GREEDY,
                                            generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """The other strategy: keep only each layer's state from before the round (a checkpoint); after verification
    restore it and re-feed the last committed token and the k accepted drafts (one more target forward of k + 1
    positions). Less memory, more compute. Returns (tokens, positions re-fed)."""
    check_request(target, draft, prompt, n_tokens, gamma)
    cache, draft_cache = HybridCache(target.config), KVCache(draft.config)
    tokens, refed = list(prompt), 0
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        checkpoint = [s.clone() for s in cache.states]
        logits = target(torch.tensor([tokens[-1:] + drafts]), cache)
        committed = verify_drafts(drafts, q, logits[0], params, generator)
        k = len(committed) - 1
        cache.kv.crop(P - 1)
        cache.states = checkpoint
        target(torch.tensor([tokens[-1:] + committed[:k]]), cache)  # the last committed token and the accepted drafts
        refed += k + 1
        tokens += committed
        pending = rollback(cache.kv, draft_cache, P, drafts, committed)
    return tokens[len(prompt) : len(prompt) + n_tokens], refed


def save_hybrid(model: HybridLM, path, extra: dict | None = None) -> None:
    """bf16 weights with the config (JSON) in the safetensors metadata, like the course's other checkpoints."""
    import json

    from safetensors.torch import save_file

    weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(path), metadata={"config": json.dumps(model.config.to_dict()), **(extra or {})})


def load_hybrid(path=None) -> HybridLM:
    """The hybrid target (``data/models/hybrid_target.safetensors`` by default), in float32."""
    import json

    from safetensors.torch import load_file, safe_open

    from specdec.paths import DATA_DIR

    path = str(path or DATA_DIR / "models" / "hybrid_target.safetensors")
    with safe_open(path, framework="pt") as f:
        config = HybridConfig(**json.loads((f.metadata() or {})["config"]))
    model = HybridLM(config)
    model.load_state_dict({k: v.float() for k, v in load_file(path).items()})
    return model.eval()
