"""Notebook 13, determinism: why a temperature-0 request can get another token when the batch around it
changes, and what a batch-invariant path fixes.

A GPU GEMM library picks its kernel by the matrix shapes: for a (M, K) x (K, N) product it may split the
K reduction into several chunks (split-K) when M is small and too few tiles would keep the chip busy, and
add the chunks' partial sums afterwards. The sum of the same numbers in another grouping differs in its
last bits, so a row's logits depend on how many other rows (M) share the forward: batch composition, or
speculation (a verify forward carries 1 + gamma rows per request), changes a request's numbers. In
bfloat16 near-ties are common and the argmax can flip (notebook 11, section 8).

:func:`split_k` makes this happen on the CPU, deterministically: every linear layer of a model is
replaced by one that computes in bfloat16, splits the K reduction into ``splits(M)`` chunks and rounds
each partial sum to bfloat16 before adding it (as a split-K kernel that reduces in the output's type).
With a shape-dependent rule, a request's tokens change with the batch it is served in; with a fixed
rule (``batch_invariant=True``) every row is computed the same way whatever M is, and they do not. That
is what batch-invariant kernels do for matmul, attention and normalisation (Thinking Machines, "Defeating
Nondeterminism in LLM Inference", 2025), and what vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``)
switches on, at some cost in speed: the same prompt gives the same tokens whatever else is served.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn


def library_splits(rows: int) -> int:
    """A GEMM heuristic's choice: split the reduction in 4 when few rows would leave the chip idle."""
    return 4 if rows <= 8 else 1


class SplitKLinear(nn.Module):
    """A bias-free bfloat16 linear layer whose K reduction is split into ``splits(M)`` chunks, each partial
    product rounded to bfloat16 and the partials added in order, in bfloat16."""

    def __init__(self, linear: nn.Linear, splits: Callable[[int], int]) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("SplitKLinear takes bias-free layers (the course's models have none)")
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.splits = splits

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        rows = x.numel() // x.shape[-1]
        k = x.shape[-1]
        chunk = -(-k // max(1, self.splits(rows)))
        x = x.to(torch.bfloat16)
        out = None
        for start in range(0, k, chunk):
            part = x[..., start:start + chunk] @ self.weight[:, start:start + chunk].T  # (..., N) bf16
            out = part if out is None else out + part
        return out


def split_k(model: nn.Module, batch_invariant: bool = False, splits: Callable[[int], int] = library_splits,
            fixed: int = 4) -> nn.Module:
    """A bfloat16 copy of ``model`` whose linear layers use :class:`SplitKLinear`: with ``splits(M)`` chunks
    (shape-dependent, like a GEMM library), or ``fixed`` chunks whatever M is (batch-invariant)."""
    rule = (lambda rows: fixed) if batch_invariant else splits
    copied = copy.deepcopy(model).to(torch.bfloat16)
    for name, module in list(copied.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, SplitKLinear(child, rule))
    return copied.eval()
