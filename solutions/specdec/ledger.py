"""Notebook 01, the cost ledger: why speculative decoding pays, in arithmetic.

Every function here is the reference solution of one exercise in
``grader/source/01_cost_ledger``; the notebook's solution cells hold the same code.
"""

from __future__ import annotations

from specdec.tables import ModelConfig
from specdec.validate import (
    check_nonnegative_real,
    check_positive_int,
    check_positive_real,
    check_probability,
)


def count_params(cfg: ModelConfig) -> int:
    """Number of parameters of a Llama-style decoder.

    Per layer: Q and O projections (d_model x n_heads*head_dim each), K and V
    projections (d_model x n_kv_heads*head_dim each), a SwiGLU MLP (gate, up and
    down: three d_model x d_ff matrices) and two RMSNorm weight vectors. Plus the
    token embedding, a final RMSNorm and the LM head (unless tied to the embedding).
    """
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"count_params expects a ModelConfig, got {type(cfg).__name__}")
    ### BEGIN SOLUTION
    d, hd = cfg.d_model, cfg.head_dim
    attention = 2 * d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd
    mlp = 3 * d * cfg.d_ff
    norms = 2 * d
    per_layer = attention + mlp + norms
    embedding = cfg.vocab_size * d
    lm_head = 0 if cfg.tied_embeddings else cfg.vocab_size * d
    return embedding + cfg.n_layers * per_layer + d + lm_head
    ### END SOLUTION


def decode_step_floor_s(n_params: int, bytes_per_param: float, bandwidth: float) -> float:
    """Lower bound on one batch-1 decode step (seconds): every weight is read once."""
    check_positive_int(n_params, "n_params")
    check_positive_real(bytes_per_param, "bytes_per_param")
    check_positive_real(bandwidth, "bandwidth")
    ### BEGIN SOLUTION
    return n_params * bytes_per_param / bandwidth
    ### END SOLUTION


def tokens_per_s_cap(n_params: int, bytes_per_param: float, bandwidth: float) -> float:
    """Upper bound on batch-1 decode speed (tokens/s): one token per weight read.
    Raises on what decode_step_floor_s refuses: ValueError for a non-positive input, TypeError for an
    n_params that is not an int (2.5 parameters is not a model)."""
    ### BEGIN SOLUTION
    return 1.0 / decode_step_floor_s(n_params, bytes_per_param, bandwidth)
    ### END SOLUTION


def kv_bytes_per_token(cfg: ModelConfig, bytes_per_elem: float = 2) -> float:
    """Bytes of KV cache one token occupies: K and V, in every layer, for every KV head."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"kv_bytes_per_token expects a ModelConfig, got {type(cfg).__name__}")
    check_positive_real(bytes_per_elem, "bytes_per_elem")
    ### BEGIN SOLUTION
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * bytes_per_elem
    ### END SOLUTION


def expected_tokens_per_round(a: float, gamma: int) -> float:
    """Expected tokens committed by one round of gamma drafts, each accepted with probability a.

    Draft i survives with probability a**i; the round always commits one token from
    the target (a correction or the bonus), so E = sum_{i=0..gamma} a**i.
    """
    check_probability(a, "a")
    check_positive_int(gamma, "gamma", minimum=0)
    ### BEGIN SOLUTION
    if a == 1.0:
        return float(gamma + 1)
    return (1.0 - a ** (gamma + 1)) / (1.0 - a)
    ### END SOLUTION


def speedup(a: float, gamma: int, c: float) -> float:
    """Speedup of speculative decoding over plain decoding.

    A round costs gamma draft steps (c target-steps each) plus one target step that
    verifies all gamma+1 positions, and commits E tokens on average. Raises ValueError
    unless 0 <= a <= 1 and gamma >= 0 (as expected_tokens_per_round does).
    """
    check_nonnegative_real(c, "c")
    ### BEGIN SOLUTION
    return expected_tokens_per_round(a, gamma) / (1.0 + gamma * c)
    ### END SOLUTION


def best_gamma(a: float, c: float, max_gamma: int = 32) -> int:
    """The draft length in 1..max_gamma with the highest speedup (the smallest, on ties)."""
    check_positive_int(max_gamma, "max_gamma")
    ### BEGIN SOLUTION
    return max(range(1, max_gamma + 1), key=lambda g: (speedup(a, g, c), -g))
    ### END SOLUTION


def roofline_step_time_s(
    n_params: int, bytes_per_param: float, n_tokens: int, bandwidth: float, flops: float
) -> float:
    """Time of one forward over n_tokens positions (all sequences, all positions).

    A forward reads every weight once (bytes / bandwidth) and does about 2 FLOPs per
    parameter per token (FLOPs / flops); it takes as long as the slower of the two.
    KV-cache reads and attention FLOPs are left out.
    """
    check_positive_int(n_params, "n_params")
    check_positive_real(bytes_per_param, "bytes_per_param")
    check_positive_int(n_tokens, "n_tokens")
    check_positive_real(bandwidth, "bandwidth")
    check_positive_real(flops, "flops")
    ### BEGIN SOLUTION
    memory_time = n_params * bytes_per_param / bandwidth
    compute_time = 2 * n_params * n_tokens / flops
    return max(memory_time, compute_time)
    ### END SOLUTION


# --- Course machinery built on the exercises (used by plots and the simulator) ---


def arithmetic_intensity(n_tokens: int, bytes_per_param: float) -> float:
    """FLOPs per byte of weights read when one forward scores n_tokens positions."""
    return 2 * n_tokens / bytes_per_param


def speedup_at_batch(
    a: float,
    gamma: int,
    c: float,
    batch: int,
    n_params: int,
    bytes_per_param: float,
    bandwidth: float,
    flops: float,
) -> float:
    """Speedup at a given batch size under the roofline model.

    The draft is modelled as a model c times the target's size, so at batch 1 a draft
    step costs c target steps. Plain decoding: one target step per token per sequence.
    A round: gamma draft steps at this batch plus one target step over batch*(gamma+1)
    positions, committing E tokens per sequence.
    """
    check_positive_int(batch, "batch")
    if gamma == 0:
        return 1.0
    target_step = roofline_step_time_s(n_params, bytes_per_param, batch, bandwidth, flops)
    verify = roofline_step_time_s(n_params, bytes_per_param, batch * (gamma + 1), bandwidth, flops)
    draft_params = max(1, round(c * n_params))
    draft_step = roofline_step_time_s(draft_params, bytes_per_param, batch, bandwidth, flops) if c > 0 else 0.0
    round_time = gamma * draft_step + verify
    return expected_tokens_per_round(a, gamma) * target_step / round_time


def acceptance_for_speedup(target: float, gamma: int, c: float) -> float:
    """The per-position acceptance a needed to reach a given speedup (bisection)."""
    if speedup(1.0, gamma, c) < target:
        raise ValueError(f"speedup {target} is out of reach at gamma={gamma}, c={c}")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid, gamma, c) < target else (lo, mid)
    return hi
