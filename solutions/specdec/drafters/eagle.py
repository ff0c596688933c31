"""Notebook 12, EAGLE (Li et al., ICML 2024): drafting at the feature level, one decoder layer.

The target's feature f_t (the LM head's input at position t: its last layer's output after the final
norm) decides the distribution of token t + 1, but not which token was sampled. EAGLE's drafter
therefore reads, at position t, the feature f_t **and the embedding of token t + 1** (the sequence
advanced by one), and predicts f_{t+1}; the target's frozen LM head turns a predicted feature into
the next token's logits. It drafts gamma tokens by feeding its own predicted features
back, with its own one-layer KV cache.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from specdec.models.model import Block, KVCache, Llama, LlamaConfig
from specdec.validate import check_tensor


class EagleDrafter(nn.Module):
    """fc([feature ; embedding]) -> one decoder layer (the target's width) -> the predicted next feature."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = dataclasses.replace(config, n_layers=1)
        self.fc = nn.Linear(2 * config.d_model, config.d_model)
        self.layer = Block(self.config)

    def forward(self, features: torch.Tensor, next_embeddings: torch.Tensor, target: Llama, cache: KVCache | None = None,
                position_ids: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """features (B, T, d) at positions p..p+T-1 and the embeddings (B, T, d) of the tokens one position
        later -> predicted features (B, T, d) for positions p+1..p+T. ``target`` lends its RoPE tables."""
        B, T, _ = features.shape
        start = cache.length if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(start, start + T, device=features.device)
        cos, sin = target.rope_cos[position_ids], target.rope_sin[position_ids]
        x = self.fc(torch.cat([features, next_embeddings], dim=-1))
        x = self.layer(x, cos, sin, 0, cache, mask)
        if cache is not None:
            cache.advance(T)
        return x

    def new_cache(self, batch_size: int = 1) -> KVCache:
        return KVCache(self.config, batch_size)


def eagle_inputs(features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's training and prefill inputs from one sequence.

    ``features`` (T, d): the target's feature at positions 0..T-1 (position t has read tokens 0..t);
    ``tokens`` (N,): the sequence's tokens. Returns (inputs_features, next_tokens), the pairs the
    drafter reads at positions t = 0, 1, ...: the feature at t with the token at t + 1, for every t
    that has both (n = min(T, N - 1) pairs, none when N <= 1).
    """
    check_tensor(features, "features", 2, floating=True)
    check_tensor(tokens, "tokens", 1, floating=False)
    ### BEGIN SOLUTION
    n = max(min(features.shape[0], tokens.shape[0] - 1), 0)
    return features[:n], tokens[1 : n + 1]
    ### END SOLUTION


@torch.inference_mode()
def eagle_draft_step(drafter: EagleDrafter, target: Llama, feature: torch.Tensor, token: int,
                     cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """One drafting step: the drafter reads (feature, token) at the next position of its cache.

    ``feature`` (d,): the feature at the position before ``token`` (the target's, or the drafter's own
    prediction); ``token``: the token that follows it. Feed them as one position with the cache, so the
    cache grows by exactly one entry, and return (predicted feature (d,), logits (V,)), the logits being
    the target's LM head on the predicted feature: the draft distribution of the token after ``token``.
    """
    ### BEGIN SOLUTION
    embedding = target.embed_tokens(torch.tensor([[token]]))  # (1, 1, d)
    predicted = drafter(feature.view(1, 1, -1), embedding, target, cache)[0, -1]  # (d,)
    return predicted, target.lm_head(predicted)
    ### END SOLUTION
