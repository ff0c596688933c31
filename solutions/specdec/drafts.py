"""Choosing a draft (notebook 05, section 8): how well a draft is aligned with the target, and a
quantised copy of the target as a draft."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from specdec.models.model import Llama
from specdec.params import SamplingParams


@torch.inference_mode()
def expected_acceptance(target: Llama, draft: Llama, ids: Sequence[int], params: SamplingParams) -> torch.Tensor:
    """(len(ids) - 1,) float64: at each position of ``ids``, the probability that one draft token
    drawn from the draft's distribution q is accepted by the target's p, sum_x min(p(x), q(x))
    (notebook 03), with both distributions under ``params``. At temperature 0 both are one-hot,
    so it is 1 where the two argmaxes agree and 0 elsewhere. Exact: no sampling, one forward each."""
    if len(ids) < 2:
        raise ValueError(f"need at least 2 tokens to score a position, got {len(ids)}")
    tokens = torch.tensor([list(ids)])
    p = params.probs(target(tokens)[0, :-1])  # (T - 1, V): the token after each prefix
    q = params.probs(draft(tokens)[0, :-1])
    return torch.minimum(p, q).sum(-1)


@torch.no_grad()
def quantised_copy(model: Llama, bits: int) -> Llama:
    """A copy of ``model`` whose matrices are rounded to ``bits``-bit integers, symmetric, one scale
    per output row (round to nearest), and stored back in float32: the numerics of a weight-only
    quantised model, without its speed. Norm weights (vectors) stay as they are."""
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be between 2 and 8, got {bits}")
    quantised = copy.deepcopy(model)
    levels = 2 ** (bits - 1) - 1
    for weight in quantised.parameters():
        if weight.dim() == 2:  # (out, in): linear layers and the embedding
            scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / levels
            weight.copy_((weight / scale).round().clamp(-levels, levels) * scale)
    return quantised.eval()
