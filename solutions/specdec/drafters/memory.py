"""Notebook 12, what a drafter costs: weights and KV next to the target's, and work per round."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.models.model import LlamaConfig
from specdec.validate import check_positive_int, check_positive_real

KINDS = ("draft", "draft_tree", "medusa", "eagle", "eagle2", "lookup")


@dataclass(frozen=True)
class DrafterCost:
    weight_bytes: float  # the drafter's own weights (the target's embedding and LM head are shared, not counted)
    kv_bytes: float  # the drafter's KV cache for the whole batch
    draft_forwards: int  # sequential drafter forwards per round (0: the drafts ride on the verify pass)
    verify_tokens: int  # positions the target's verify forward scores per request


def drafter_cost(kind: str, target: LlamaConfig, draft: LlamaConfig | None, batch_size: int, context: int,
                 gamma: int, tree_nodes: int, bytes_per_value: float = 2, num_heads: int = 4) -> DrafterCost:
    """What each kind of drafter adds, for ``batch_size`` requests of ``context`` tokens.

    - "draft" / "draft_tree": a separate model with config ``draft``: all its parameters (embedding and LM
      head included); its own KV, 2 * n_layers * n_kv_heads * head_dim values per token; gamma forwards per
      round (a tree: gamma = its depth); the target scores gamma + 1 positions (a tree: ``tree_nodes``).
    - "medusa": ``num_heads`` heads of d * d + d (residual block) + V * d (projection) parameters; no KV; no
      drafter forward (the heads read the verify pass's hidden state); the target scores ``tree_nodes``.
    - "eagle" / "eagle2": one decoder layer of the target's shape (attention: d * d for q and o,
      d * n_kv_heads * head_dim for k and v; MLP: 3 * d * d_ff; two norms of d) plus the fc, 2d * d + d;
      the KV of that one layer; gamma forwards (eagle2: gamma = the tree's depth); gamma + 1 positions
      (eagle2: ``tree_nodes``).
    - "lookup": nothing but gamma + 1 positions to score.

    Bytes are values times ``bytes_per_value``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind.startswith("draft") and draft is None:
        raise ValueError(f"kind {kind!r} needs the draft model's config")
    for name, value in (("batch_size", batch_size), ("context", context), ("gamma", gamma), ("tree_nodes", tree_nodes)):
        check_positive_int(value, name)
    check_positive_real(bytes_per_value, "bytes_per_value")
    ### BEGIN SOLUTION
    d, V, tokens = target.d_model, target.vocab_size, batch_size * context
    tree = kind in ("draft_tree", "medusa", "eagle2")
    verify = tree_nodes if tree else gamma + 1
    if kind in ("draft", "draft_tree"):
        c = draft
        layer = 2 * c.d_model * c.d_model + 2 * c.d_model * c.n_kv_heads * c.head_dim + 3 * c.d_model * c.d_ff + 2 * c.d_model
        weights = c.n_layers * layer + 2 * c.vocab_size * c.d_model + c.d_model  # embedding, LM head, final norm
        kv = 2 * c.n_layers * c.n_kv_heads * c.head_dim * tokens
        return DrafterCost(weights * bytes_per_value, kv * bytes_per_value, gamma, verify)
    if kind == "medusa":
        return DrafterCost(num_heads * (d * d + d + V * d) * bytes_per_value, 0.0, 0, verify)
    if kind in ("eagle", "eagle2"):
        kv_width = target.n_kv_heads * target.head_dim
        layer = 2 * d * d + 2 * d * kv_width + 3 * d * target.d_ff + 2 * d
        weights = layer + 2 * d * d + d
        return DrafterCost(weights * bytes_per_value, 2 * kv_width * tokens * bytes_per_value, gamma, verify)
    return DrafterCost(0.0, 0.0, 0, verify)
    ### END SOLUTION
