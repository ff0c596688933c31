"""Notebook 13, MTP-style and EAGLE-3-style drafters on the course's frozen target.

Both are one small decoder layer that drafts feature by feature, as EAGLE does (notebook 12): at position t
the drafter reads a feature g_t and the embedding of token t + 1, and its output stands in for the next
position's feature. What changes is what g_t is and how the drafter is trained:

- **MTP-style** (DeepSeek-V3's multi-token prediction module, reused as a drafter): g_t is the target's top
  hidden state; trained for one step ahead only (predict token t + 2 from h_t and token t + 1). At inference
  the one module is run again on its own outputs for drafts 2, 3, ...: inputs it never saw in training, so
  acceptance falls with depth.
- **EAGLE-3-style** (Li et al. 2025, arXiv 2503.01840): g_t fuses the residual stream after a low, a middle and
  the top layer (``taps``); no feature regression, only the token loss; **training-time test**: training runs
  the drafter on its own outputs for several steps, with the attention pattern it will see while drafting
  (true-feature entries up to the chain's root, then the chain's own entries), and sums the token losses of
  every step. The drafter proposes from a reduced vocabulary (``draft_vocab``, EAGLE-3's d2t map): the
  most frequent tokens only.

Terms: a drafter's *step k* (1-based) is its k-th draft of a round; at step 1 it reads a true fused feature,
at step k > 1 its own step k - 1 output. One deviation, to stay small: the layer reads [feature ; embedding]
through one projection (EAGLE-1's fc) rather than widening its attention's input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from specdec.metrics import acceptance_metrics
from specdec.models.model import Block, KVCache, Llama, LlamaConfig, RMSNorm, rope_tables


@dataclass(frozen=True)
class FeatureDrafterConfig:
    d_target: int  # the target's width
    vocab_size: int  # the target's vocabulary (draft tokens are target token ids)
    taps: tuple[int, ...]  # the target's residual stream after these many layers, fused (MTP: the top one only)
    draft_vocab: tuple[int, ...]  # the token ids the drafter can propose (EAGLE-3's d2t), in increasing order
    width: int = 96
    n_heads: int = 2
    n_kv_heads: int = 1
    d_ff: int = 192
    max_seq_len: int = 512

    def __post_init__(self) -> None:
        if not self.taps or not self.draft_vocab:
            raise ValueError("a feature drafter needs at least one tap and one draft token")
        if list(self.draft_vocab) != sorted(set(self.draft_vocab)) or not 0 <= self.draft_vocab[0] <= \
                self.draft_vocab[-1] < self.vocab_size:
            raise ValueError(f"draft_vocab must be distinct token ids in increasing order, within 0..{self.vocab_size - 1}")

    def layer_config(self) -> LlamaConfig:
        return LlamaConfig(vocab_size=self.vocab_size, d_model=self.width, n_layers=1, n_heads=self.n_heads,
                           n_kv_heads=self.n_kv_heads, d_ff=self.d_ff, max_seq_len=self.max_seq_len)


class FeatureDrafter(nn.Module):
    """fuse(taps) = g;  out = Block(fc([g ; embed_proj(target embedding of the next token)]));  logits = head(norm(out))."""

    def __init__(self, config: FeatureDrafterConfig) -> None:
        super().__init__()
        self.config = config
        w = config.width
        self.fuse = nn.Linear(len(config.taps) * config.d_target, w, bias=False)
        self.embed_proj = nn.Linear(config.d_target, w, bias=False)  # reads the target's frozen embedding
        self.fc = nn.Linear(2 * w, w, bias=False)
        self.layer = Block(config.layer_config())
        self.norm = RMSNorm(w, 1e-5)
        self.head = nn.Linear(w, len(config.draft_vocab), bias=False)
        self.register_buffer("d2t", torch.tensor(config.draft_vocab), persistent=False)  # draft index -> token id
        cos, sin = rope_tables(config.layer_config())
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, features: torch.Tensor, next_tokens: torch.Tensor, target: Llama, cache: KVCache | None = None,
                position_ids: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """features (B, T, width) (fused, or the drafter's own outputs) at positions p..p+T-1 and the token ids
        (B, T) one position later -> outputs (B, T, width), standing in for the features at p+1..p+T."""
        B, T, _ = features.shape
        start = cache.length if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(start, start + T, device=features.device)
        embedding = self.embed_proj(target.embed_tokens(next_tokens))  # (B, T, width)
        x = self.fc(torch.cat([features, embedding], dim=-1))
        x = self.layer(x, self.rope_cos[position_ids], self.rope_sin[position_ids], 0, cache, mask)
        if cache is not None:
            cache.advance(T)
        return x

    def draft_logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """outputs (..., width) -> (..., draft vocabulary) logits."""
        return self.head(self.norm(outputs))

    def logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """outputs (..., width) -> (..., V) logits over the target's vocabulary, -inf off the draft vocabulary."""
        draft = self.draft_logits(outputs)
        full = draft.new_full((*draft.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy(-1, self.d2t, draft)

    def new_cache(self, batch_size: int = 1) -> KVCache:
        return KVCache(self.config.layer_config(), batch_size)


def ttt_mask(steps: int, length: int) -> torch.Tensor:
    """Training-time test's attention pattern over ``steps`` copies of ``length`` positions, step-major:
    (steps * length, steps * length) bool, True where the query may attend.

    The entry of step k at position t belongs to the chain whose root (its last true feature) is at
    r = t - k + 1; while drafting that chain, the drafter's cache holds step-1 entries at positions 0..r and
    the chain's step-j entry at r + j - 1 for j = 2..k. The query sees exactly those.
    """
    q_step = torch.arange(steps).repeat_interleave(length)[:, None] + 1  # (S*L, 1), 1-based
    q_pos = torch.arange(length).repeat(steps)[:, None]
    k_step, k_pos = q_step.T, q_pos.T
    root = q_pos - q_step + 1
    return ((k_step == 1) & (k_pos <= root)) | ((k_step >= 2) & (k_step <= q_step) & (k_pos == root + k_step - 1))


def train_feature_drafter(target: Llama, text: torch.Tensor, target_logits: torch.Tensor, tapped: torch.Tensor,
                          config: FeatureDrafterConfig, steps: int, ttt_steps: int, batch_size: int = 32,
                          window: int = 64, lr: float = 3e-3, seed: int = 0) -> tuple[FeatureDrafter, list[float]]:
    """Token loss only, averaged over ``ttt_steps`` training-time-test steps (1: the MTP objective, one step ahead).

    text (N, T) token ids; target_logits (N, T, V) the frozen target's logits on it; tapped (N, T, n_taps * d)
    its residual stream at ``config.taps``. Every step's output at position t predicts token t + 2 (it reads
    token t + 1); its label is the target's distribution at t + 1, restricted to the draft vocabulary and
    renormalised. Step k at t belongs to the chain rooted at t - k + 1, so only t >= k - 1 is scored. Each batch
    row is a random window of ``window`` + 1 tokens of a random sequence (training-time test's attention grows
    with the square of ttt_steps x window)."""
    torch.manual_seed(seed)
    drafter = FeatureDrafter(config)
    for p in target.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=0.0)
    L = min(window, text.shape[1] - 1)  # positions t = 0..L-1 of a window have a next token
    mask = ttt_mask(ttt_steps, L)
    positions = torch.arange(L).repeat(ttt_steps)  # each entry at its position in the window (RoPE is relative)
    g, losses = torch.Generator().manual_seed(seed), []
    for step in range(steps):
        rows = torch.randint(0, len(text), (batch_size, 1), generator=g)
        first = torch.randint(0, text.shape[1] - L, (batch_size, 1), generator=g)
        cols = first + torch.arange(L + 1)  # (B, L + 1)
        tokens, labels = text[rows, cols], torch.softmax(target_logits[rows, cols][..., drafter.d2t], -1)
        features = [drafter.fuse(tapped[rows, cols[:, :L]])]  # step 1 reads the true fused features, (B, L, w)
        loss = 0.0
        for k in range(1, ttt_steps + 1):
            out = drafter(torch.cat(features, dim=1), tokens[:, 1:].repeat(1, k), target,
                          position_ids=positions[: k * L], mask=mask[: k * L, : k * L])[:, -L:]  # step k, (B, L, w)
            loss = loss + _soft_ce(drafter.draft_logits(out[:, k - 1 :]), labels[:, k:])
            features.append(F.pad(out[:, :-1], (0, 0, 1, 0)))  # step k + 1 at t reads step k's output at t - 1
        loss = loss / ttt_steps
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        for group in optimizer.param_groups:
            warm = min(1.0, (step + 1) / 20)
            group["lr"] = lr * warm * min(1.0, 0.5 * (1 + torch.cos(torch.tensor(step / steps * torch.pi)).item()) + 0.05)
        optimizer.step()
        losses.append(round(loss.item(), 4))
    return drafter.eval(), losses


def _soft_ce(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    return -(probs * torch.log_softmax(logits, -1)).sum(-1).mean()


def frequent_tokens(text: torch.Tensor, size: int) -> tuple[int, ...]:
    """The ``size`` most frequent token ids of ``text`` (ties to the lower id), in increasing order."""
    counts = torch.bincount(text.flatten(), minlength=size)
    order = torch.sort(-counts, stable=True).indices[:size]
    return tuple(sorted(order.tolist()))


def save_feature_drafter(drafter: FeatureDrafter, path: Path, meta: dict) -> None:
    weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in drafter.state_dict().items()}
    save_file(weights, str(path), metadata={"config": json.dumps(asdict(drafter.config)),
                                            **{k: json.dumps(v) for k, v in meta.items()}})


def load_feature_drafter(path: Path | str) -> FeatureDrafter:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no feature drafter at {path} (train it with `python -m specdec.drafters.train --only eagle3`)")
    with safe_open(str(path), framework="pt") as f:
        raw = json.loads((f.metadata() or {})["config"])
    config = FeatureDrafterConfig(**{**raw, "taps": tuple(raw["taps"]), "draft_vocab": tuple(raw["draft_vocab"])})
    drafter = FeatureDrafter(config)
    drafter.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return drafter.eval()


def per_position_rates(committed: Sequence[int], gamma: int) -> list[float | None]:
    """Conditional acceptance at draft positions 1..gamma from a chain's committed counts per round (accepted
    drafts + 1): :func:`specdec.metrics.acceptance_metrics`' per-position rates."""
    return acceptance_metrics([c - 1 for c in committed], [gamma] * len(committed))["per_position"]
