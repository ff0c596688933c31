"""Notebook 12, Medusa heads (Cai et al. 2024): K extra heads read the target's last hidden state.

Head k (0-based) at position t predicts the token at t + k + 2: the target's own LM head predicts
t + 1, so head 0 guesses the token after that one. Each head is a residual SiLU block on the
(normalised) hidden state, then its own vocabulary projection. The candidates of a round form a
Cartesian tree: at depth d, the top-k tokens of head d - 1, whatever their parent.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdec.tree import check_choices
from specdec.validate import check_tensor


class MedusaHeads(nn.Module):
    """K heads: logits_k = W_out[k] (h + SiLU(W_res[k] h + b_res[k])), h the LM head's input (after the final norm)."""

    def __init__(self, d_model: int, vocab_size: int, num_heads: int = 4) -> None:
        super().__init__()
        self.res_weight = nn.Parameter(torch.zeros(num_heads, d_model, d_model))  # zero: each head starts as the LM head
        self.res_bias = nn.Parameter(torch.zeros(num_heads, d_model))
        self.out_weight = nn.Parameter(torch.zeros(num_heads, vocab_size, d_model))

    @property
    def num_heads(self) -> int:
        return self.res_weight.shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., d) -> logits (K, ..., V)."""
        return medusa_head_logits(hidden, self.res_weight, self.res_bias, self.out_weight)


def check_head_args(hidden: torch.Tensor, res_weight: torch.Tensor, res_bias: torch.Tensor, out_weight: torch.Tensor) -> None:
    check_tensor(res_weight, "res_weight", 3, floating=True)
    check_tensor(res_bias, "res_bias", 2, floating=True)
    check_tensor(out_weight, "out_weight", 3, floating=True)
    K, d, _ = res_weight.shape
    if not isinstance(hidden, torch.Tensor) or hidden.shape[-1] != d:
        raise ValueError(f"hidden must end in the model width {d}, got {getattr(hidden, 'shape', hidden)}")
    if res_weight.shape != (K, d, d) or res_bias.shape != (K, d) or out_weight.shape[::2] != (K, d):
        raise ValueError(f"for K={K} heads of width {d}: res_weight (K, d, d), res_bias (K, d), out_weight (K, V, d); "
                         f"got {tuple(res_weight.shape)}, {tuple(res_bias.shape)}, {tuple(out_weight.shape)}")


def medusa_head_logits(hidden: torch.Tensor, res_weight: torch.Tensor, res_bias: torch.Tensor,
                       out_weight: torch.Tensor) -> torch.Tensor:
    """Every head's logits: hidden (..., d) -> (K, ..., V).

    Head k: ``h_k = hidden + SiLU(hidden @ res_weight[k].T + res_bias[k])`` (a residual block, like
    nn.Linear's weight layout), then ``logits_k = h_k @ out_weight[k].T``.
    """
    check_head_args(hidden, res_weight, res_bias, out_weight)
    ### BEGIN SOLUTION
    heads = []
    for k in range(res_weight.shape[0]):
        h = hidden + F.silu(hidden @ res_weight[k].T + res_bias[k])
        heads.append(h @ out_weight[k].T)
    return torch.stack(heads)
    ### END SOLUTION


def medusa_candidates(root: int, head_logits: torch.Tensor, choices: Sequence[Sequence[int]]) -> list[int]:
    """The tokens of a Medusa tree, in notebook 07's flattened order (``flatten_tree(choices)``: the root
    first, then the paths sorted by depth, then by ranks).

    ``head_logits`` (K, V): the heads' logits at the position before the root. The node of path
    (r_1, ..., r_d) is the r_d-th most likely token of head d - 1 (0 is the best), whatever its parent:
    the tree is the Cartesian product of per-head top-k lists. Ties in the logits go to the lower token id.
    """
    paths = check_choices(choices)
    check_tensor(head_logits, "head_logits", 2, floating=True)
    if max(len(p) for p in paths) > head_logits.shape[0]:
        raise ValueError(f"a path of depth {max(len(p) for p in paths)} needs that many heads; there are {head_logits.shape[0]}")
    ### BEGIN SOLUTION
    ranked = [ranked_tokens(row) for row in head_logits]
    return [root] + [ranked[len(path) - 1][path[-1]] for path in paths]
    ### END SOLUTION


def ranked_tokens(logits: torch.Tensor) -> list[int]:
    """Token ids from the most to the least likely; equal logits in increasing token id (a stable order)."""
    return torch.sort(logits, descending=True, stable=True).indices.tolist()


def typical_acceptance(p: torch.Tensor, token: int, epsilon: float = 0.09, delta: float = 0.3) -> bool:
    """Medusa's "typical acceptance": accept a candidate whose target probability exceeds
    min(epsilon, delta * exp(-H(p))). Fast, and NOT exact: the output no longer follows p."""
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum()
    return bool(p[token] > min(epsilon, delta * float(torch.exp(-entropy))))
