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

import itertools
import math
from dataclasses import dataclass

from specdec.frontier.moe import speculative_speedup
from specdec.models.model import LlamaConfig
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

    def __post_init__(self) -> None:
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 1):
            raise ValueError(f"{self.name}: window is the number of cached positions the model keeps, a positive int, "
                             f"or None for a cache that keeps them all; got {self.window!r}")


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
    """The smallest batch among 1, 2, 4, ... (powers of two up to ``max_rows``, so the largest one tried is the largest
    power of two <= max_rows) at which speculation no longer pays: speedup_at(...) <= 1, a speedup of exactly 1
    included. None if it still pays at every batch tried."""
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


def rows_that_fit(target: Decoder, draft: Decoder, context: int, bytes_per_param: float, hbm_bytes: float) -> int:
    """The most rows of ``context`` cached positions one GPU of ``hbm_bytes`` holds beside both models' weights: each
    row keeps the target's cache and the draft's (its last ``window`` positions if bounded). 0 when not even one row
    fits. The ledger's speedup at a larger batch describes a batch that cannot exist on that GPU.

    Llama-3-8B in bf16 keeps 2 * 32 * 8 * 128 * 2 = 131,072 bytes per position: one 128k row is 16 GiB, batch 64 at
    128k is 1 TiB, and an 80 GB H100 holds 3 such rows beside the 16 GB of weights."""
    check_positive_int(context, "context")
    check_positive_real(bytes_per_param, "bytes_per_param")
    check_positive_real(hbm_bytes, "hbm_bytes")
    free = hbm_bytes - (target.params + draft.params) * bytes_per_param
    drafted = context if draft.window is None else min(context, draft.window)
    per_row = context * target.kv_bytes + drafted * draft.kv_bytes
    return max(0, int(free // per_row))


def decoder_of(config: LlamaConfig, name: str, bytes_per_value: float = 4.0) -> Decoder:
    """The :class:`Decoder` of one of the course's Llamas (``LlamaConfig``): its parameter count, K and V bytes per
    cached position over all layers, and attention FLOPs per query token per cached position."""
    head_dim = config.d_model // config.n_heads
    d, f, v, n = config.d_model, config.d_ff, config.vocab_size, config.n_layers
    attention = d * head_dim * (2 * config.n_heads + 2 * config.n_kv_heads)
    params = 2 * v * d + n * (attention + 3 * d * f + 2 * d) + d
    return Decoder(name, params, 2 * n * config.n_kv_heads * head_dim * bytes_per_value,
                   4 * n * config.n_heads * head_dim)


@dataclass(frozen=True)
class CpuRates:
    """A CPU described by four rates (seconds, bytes/s, FLOP/s): a fixed cost per forward, the rate its weights
    stream at, the rate its attention reads a row's cache at, and its matmul rate. A CPU overlaps reading and
    computing poorly, so the terms add up (a GPU's roofline takes their maximum)."""

    overhead: float
    weight_bandwidth: float
    kv_bandwidth: float
    flops: float


def cpu_step_seconds(rates: CpuRates, model: Decoder, rows: int, tokens_per_row: int, context: int,
                     bytes_per_param: float = 4.0) -> float:
    """The ledger's step time on a CPU: overhead + weights / weight_bandwidth + rows' caches / kv_bandwidth +
    FLOPs / flops (the same terms as :func:`step_seconds`, added)."""
    read_weights = model.params * bytes_per_param / rates.weight_bandwidth
    read_kv = rows * context * model.kv_bytes / rates.kv_bandwidth
    compute = rows * tokens_per_row * (2 * model.params + model.attention_flops * context) / rates.flops
    return rates.overhead + read_weights + read_kv + compute


def fit_cpu_rates(measured: list[tuple[int, int, int, float]], model: Decoder) -> tuple[CpuRates, float]:
    """The :class:`CpuRates` that best explain ``measured`` step times (rows, tokens per row, context, seconds),
    by least squares on log times over a grid of rates; returns them and the root-mean-square relative error."""
    def grid(low: float, high: float, n: int) -> list[float]:
        return [low * (high / low) ** (i / (n - 1)) for i in range(n)]

    best = (math.inf, None)
    for rates in itertools.starmap(CpuRates, itertools.product(grid(2e-4, 2e-2, 9), grid(1e9, 3e11, 9),
                                                                 grid(1e8, 1e11, 13), grid(1e9, 1e12, 11))):
        error = sum(math.log(cpu_step_seconds(rates, model, *point[:3]) / point[3]) ** 2 for point in measured)
        best = min(best, (error, rates), key=lambda pair: pair[0])
    error, rates = best
    return rates, math.exp(math.sqrt(error / len(measured))) - 1
