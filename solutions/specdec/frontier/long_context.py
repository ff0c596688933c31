"""Notebook 14, the cost ledger with its KV term: at long context speculation pays again at large batch.

A decode step reads the weights once for the whole batch and each row's KV cache for that row alone. Notebook 11's
crossover (the batch beyond which speculation stops paying) assumed the weights dominate: B rows of gamma + 1
tokens then turn the step compute bound at a modest batch. At long context the KV read, B * context * kv_bytes,
dominates instead; it does not grow with the gamma + 1 query tokens of a row (they read the same cache), so a verify
step stays memory bound and nearly as cheap as a decode step at a batch where short contexts had long turned it
compute bound (MagicDec, Sadhukhan, Chen et al., arXiv 2408.11049). A draft whose own KV is bounded (a sliding window or
a sparse cache of ``window`` positions) stays cheap while the target's grows.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.frontier.moe import speculative_speedup
from specdec.validate import check_positive_int, check_positive_real, check_probability


@dataclass(frozen=True)
class Decoder:
    """What a decode step of one model reads and computes. params: weights; kv_bytes: KV cache bytes per cached
    position (all layers, K and V); attention_flops: FLOPs per query token per cached position (about
    4 * layers * n_heads * head_dim: scores and the weighted sum); window: the positions its cache keeps at most
    (None: all of them)."""

    name: str
    params: float
    kv_bytes: float
    attention_flops: float
    window: int | None = None


def step_seconds(model: Decoder, rows: int, tokens_per_row: int, context: int, bytes_per_param: float,
                 bandwidth: float, flops: float) -> float:
    """One forward of ``rows`` rows of ``tokens_per_row`` new tokens each over ``context`` cached positions, roofline:
    the slower of reading the weights once plus every row's cache (its last ``window`` positions if the cache is
    bounded) and the FLOPs (2 * params per token, plus attention over the cache)."""
    check_positive_int(rows, "rows")
    check_positive_int(tokens_per_row, "tokens_per_row")
    check_positive_int(context, "context", minimum=0)
    check_positive_real(bytes_per_param, "bytes_per_param")
    check_positive_real(bandwidth, "bandwidth")
    check_positive_real(flops, "flops")
    ### BEGIN SOLUTION
    cached = context if model.window is None else min(context, model.window)
    read = model.params * bytes_per_param + rows * cached * model.kv_bytes
    compute = rows * tokens_per_row * (2 * model.params + model.attention_flops * cached)
    return max(read / bandwidth, compute / flops)
    ### END SOLUTION


def speedup_at(alpha: float, gamma: int, rows: int, context: int, target: Decoder, draft: Decoder,
               bytes_per_param: float, bandwidth: float, flops: float) -> float:
    """Speculation's tokens/s over plain decoding for ``rows`` rows at ``context`` cached positions."""
    def step(tokens: int) -> float:  # tokens: rows * tokens per row, as speculative_speedup passes them
        return step_seconds(target, rows, tokens // rows, context, bytes_per_param, bandwidth, flops)

    def draft_step(tokens: int) -> float:
        return step_seconds(draft, rows, tokens // rows, context, bytes_per_param, bandwidth, flops)

    return speculative_speedup(alpha, gamma, rows, step, draft_step)


def crossover_batch(alpha: float, gamma: int, context: int, target: Decoder, draft: Decoder, bytes_per_param: float,
                    bandwidth: float, flops: float, max_rows: int = 4096) -> int | None:
    """The smallest batch (a power of two up to ``max_rows``) at which speculation no longer pays (speedup <= 1),
    or None if it still pays at ``max_rows``."""
    check_probability(alpha, "alpha")
    check_positive_int(gamma, "gamma")
    ### BEGIN SOLUTION
    rows = 1
    while rows <= max_rows:
        if speedup_at(alpha, gamma, rows, context, target, draft, bytes_per_param, bandwidth, flops) <= 1:
            return rows
        rows *= 2
    return None
    ### END SOLUTION
