"""Notebook 14, speculation on a mixture-of-experts target: verification reads the union of the experts it routes to.

A decode step of one token reads the dense weights (attention, router, LM head, shared experts; the input embedding
gives one row per token) and the top_k
experts its token routes to, in every layer. A verify step of n tokens reads the experts any of them routes to:
with ``experts`` experts, ``top_k`` per token and independent uniform routing, an expert is missed by one token with
probability 1 - top_k / experts, so n tokens touch experts * (1 - (1 - top_k / experts) ** n) per layer in
expectation. At batch 1 that makes a verify step of gamma + 1 tokens read several times the bytes of a decode step
(speculation pays less than on a dense model of the same active size); at a medium batch every expert is read
anyway, and the step stays memory bound to a far larger batch than the dense model's (the same FLOPs per token over
many more bytes), so speculation can pay more there (MoESD, Huang et al. 2025, arXiv 2505.19645).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.ledger import expected_tokens_per_round
from specdec.validate import check_positive_int, check_positive_real, check_probability


def expected_experts_touched(tokens: int, top_k: int, experts: int) -> float:
    """Expected distinct experts per layer that ``tokens`` tokens route to, each to ``top_k`` of ``experts`` experts
    chosen uniformly and independently of the other tokens."""
    check_positive_int(tokens, "tokens", minimum=0)
    check_positive_int(experts, "experts")
    check_positive_int(top_k, "top_k")
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) cannot exceed the number of experts ({experts})")
    ### BEGIN SOLUTION
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)
    ### END SOLUTION


def experts_touched(routing: torch.Tensor) -> torch.Tensor:
    """Distinct experts each layer's tokens route to, from measured routing.

    routing: (layers, tokens, top_k) expert ids (int), the experts each token of one forward went to in each
    layer. Returns (layers,) int64: the number of distinct ids in each layer (an expert two tokens share is read
    once); 0 for a layer with no tokens, and an empty int64 tensor for no layers. ``routing`` is left as it is.
    """
    if not isinstance(routing, torch.Tensor) or routing.ndim != 3 or routing.is_floating_point():
        raise ValueError("routing must be an integer tensor (layers, tokens, top_k)")
    ### BEGIN SOLUTION
    return torch.tensor([len(torch.unique(layer)) for layer in routing], dtype=torch.int64)
    ### END SOLUTION


@dataclass(frozen=True)
class MoEModel:
    """What one forward of a mixture-of-experts decoder reads and computes.

    dense_params: weights every token uses (attention, router, norms, LM head, shared experts; the input embedding
    table only gives one row per token, so a step reads little of it);
    expert_params: one routed expert of one layer; layers: the layers with routed experts; active_params: the
    parameters one token uses (dense + top_k experts per layer), hence 2 * active_params FLOPs per token.
    """

    name: str
    dense_params: float
    expert_params: float
    experts: int
    top_k: int
    layers: int

    @property
    def total_params(self) -> float:
        return self.dense_params + self.layers * self.experts * self.expert_params

    @property
    def active_params(self) -> float:
        return self.dense_params + self.layers * self.top_k * self.expert_params


def moe_step_seconds(model: MoEModel, tokens: int, bytes_per_param: float, bandwidth: float, flops: float,
                     touched: Callable[[int], float] | None = None) -> float:
    """One forward over ``tokens`` tokens (all rows together), roofline: the slower of reading the dense weights
    plus the experts touched in every layer, and 2 * active_params FLOPs per token. ``touched(n)``: experts per
    layer n tokens touch (default: independent routing, :func:`expected_experts_touched`)."""
    check_positive_int(tokens, "tokens")
    check_positive_real(bytes_per_param, "bytes_per_param")
    check_positive_real(bandwidth, "bandwidth")
    check_positive_real(flops, "flops")
    ### BEGIN SOLUTION
    union = touched(tokens) if touched else expected_experts_touched(tokens, model.top_k, model.experts)
    read = (model.dense_params + model.layers * union * model.expert_params) * bytes_per_param / bandwidth
    compute = 2 * model.active_params * tokens / flops
    return max(read, compute)
    ### END SOLUTION


def speculative_speedup(alpha: float, gamma: int, batch: int, step: Callable[[int], float],
                        draft_step: Callable[[int], float]) -> float:
    """Tokens/s of speculation over plain decoding for ``batch`` rows: a round is gamma draft steps over ``batch``
    tokens and one target step over batch * (gamma + 1), and commits E(alpha, gamma) tokens per row; plain decoding
    commits one per row per target step over ``batch`` tokens."""
    check_probability(alpha, "alpha")
    check_positive_int(gamma, "gamma", minimum=0)
    check_positive_int(batch, "batch")
    if gamma == 0:
        return 1.0
    round_s = gamma * draft_step(batch) + step(batch * (gamma + 1))
    return expected_tokens_per_round(alpha, gamma) * step(batch) / round_s


@torch.no_grad()
def routing_of(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """The experts ``model`` (a mixture-of-experts Llama) routes each of ``tokens`` to, in one forward:
    (layers, len(tokens), top_k) expert ids."""
    if not getattr(model.config, "n_experts", 0):
        raise ValueError("routing_of needs a mixture-of-experts model (config.n_experts > 0)")
    model(torch.tensor([tokens]))
    return torch.stack([layer.mlp.routing for layer in model.layers])


def mean_union(routing: torch.Tensor, window: int) -> float:
    """Mean distinct experts per layer over consecutive, non-overlapping windows of ``window`` tokens: what verify
    steps of ``window`` tokens of one sequence read (routing: (layers, tokens, top_k))."""
    check_positive_int(window, "window")
    layers, tokens, top_k = routing.shape
    windows = tokens // window
    if windows == 0:
        raise ValueError(f"the routing covers {tokens} tokens, fewer than one window of {window}")
    chunks = routing[:, : windows * window].reshape(layers, windows, window * top_k)
    return sum(len(torch.unique(chunk)) for layer in chunks for chunk in layer) / (layers * windows)
