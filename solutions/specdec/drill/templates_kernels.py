"""Drill templates of notebook 08: what the fused verifier reads, its bandwidth floor, the exponential race.

The byte counts follow the notebook's section 6 (and ``specdec.bench.kernels``): per row, float32 rows of the
vocabulary: a sampling row of the fused kernel reads p[k], q[k] and the noise (3 rows), a greedy row the argmax of
each of its gamma rows of p plus that final pass (gamma + 3 rows); the PyTorch version reads all of p (gamma + 1
rows) and q (gamma rows)."""

from __future__ import annotations

import random

from specdec.drill import draws
from specdec.drill.questions import Choice, Number, choice, number, plural, show

NB = "08_gpu_kernels"
BYTES = "6. What it buys on a GPU"
FLOAT32 = 4


def fused_bytes(sampling_rows: int, greedy_rows: int, gamma: int, vocab: int) -> int:
    """Bytes the fused chain verifier reads: 3 vocabulary rows per sampling row, gamma + 3 per greedy row."""
    return (3 * sampling_rows + (gamma + 3) * greedy_rows) * vocab * FLOAT32


def unfused_bytes(rows: int, gamma: int, vocab: int) -> int:
    """Bytes of p (gamma + 1 rows) and q (gamma rows) per row: what a PyTorch verifier reads at least once."""
    return (2 * gamma + 1) * rows * vocab * FLOAT32


def _vocab(rng: random.Random) -> int:
    return rng.choice([32_000, 50_304, 128_256, 152_064])


@number("kernels_fused_floor_us", topic="kernels", notebook=NB, section=BYTES)
def fused_floor(rng: random.Random) -> Number:
    gpu, batch, gamma, vocab = draws.gpu(rng), rng.choice([1, 8, 16, 32, 64, 128]), rng.randrange(2, 9), _vocab(rng)
    nbytes = fused_bytes(batch, 0, gamma, vocab)
    us = nbytes / gpu.bandwidth * 1e6
    return Number(
        f"The fused chain verifier on a {gpu.name} ({gpu.bandwidth / 1e12:g} TB/s): {batch} sampling rows, gamma = "
        f"{gamma}, vocabulary {vocab:,}, float32 probabilities. Its bandwidth floor, in microseconds?",
        us,
        f"A sampling row needs 2 gamma scalars for the accept tests and three vocabulary rows for the extra token: "
        f"p[k], q[k] and the noise e. 3 x {batch} x {vocab:,} x 4 B = {nbytes:,} B; / {gpu.bandwidth:.4g} B/s = "
        f"{show(us)} us (small batches sit below the few microseconds of a kernel launch).",
        unit="us")


@number("kernels_unfused_mb", topic="kernels", notebook=NB, section=BYTES)
def unfused_mb(rng: random.Random) -> Number:
    batch, gamma, vocab = rng.choice([1, 8, 16, 32, 64]), rng.randrange(2, 9), _vocab(rng)
    nbytes = unfused_bytes(batch, gamma, vocab)
    ratio = nbytes / fused_bytes(batch, 0, gamma, vocab)
    return Number(
        f"A PyTorch chain verifier reads all of p and q: {batch} rows, gamma = {gamma}, vocabulary {vocab:,}, float32. "
        "How many MB (1e6 bytes) of probabilities is that, read once?",
        nbytes / 1e6,
        f"p has gamma + 1 = {gamma + 1} rows and q gamma = {gamma}: {2 * gamma + 1} x {batch} x {vocab:,} x 4 B = "
        f"{show(nbytes / 1e6)} MB, {ratio:.3g}x what the fused kernel reads for sampling rows (3 per row), and PyTorch "
        "reads several of them more than once.",
        unit="MB")


@number("kernels_mixed_rows_mb", topic="kernels", notebook=NB, section=BYTES)
def mixed_rows(rng: random.Random) -> Number:
    sampling, greedy = rng.randrange(1, 64), rng.randrange(1, 64)
    gamma, vocab = rng.randrange(2, 9), _vocab(rng)
    nbytes = fused_bytes(sampling, greedy, gamma, vocab)
    return Number(
        f"The fused verifier of notebook 08 runs a batch of {plural(sampling, 'sampling row')} and "
        f"{plural(greedy, 'greedy row')}, gamma = "
        f"{gamma}, vocabulary {vocab:,}, float32. A greedy row takes the argmax of each of its gamma rows of p, then the "
        "same final pass as a sampling row. How many MB (1e6 bytes) does it read?",
        nbytes / 1e6,
        f"Sampling rows: 3 vocabulary rows each (p[k], q[k], noise); greedy rows: gamma argmaxes + 3 = {gamma + 3}. "
        f"({3 * sampling} + {(gamma + 3) * greedy}) x {vocab:,} x 4 B = {show(nbytes / 1e6)} MB.",
        unit="MB")


@choice("kernels_race_winner", topic="kernels", notebook=NB, section="2. Sampling with one pass: the exponential race")
def race_winner(rng: random.Random) -> Choice:
    while True:
        tokens = rng.sample(range(10, 99), 4)
        w = [round(rng.uniform(0.05, 0.6), 2) for _ in tokens]
        e = [round(rng.uniform(0.1, 2.5), 2) for _ in tokens]
        scores = [a / b for a, b in zip(w, e)]
        if sorted(scores)[-1] > sorted(scores)[-2] * 1.05 and max(range(4), key=lambda i: w[i]) != max(
                range(4), key=lambda i: scores[i]):
            break
    win = max(range(4), key=lambda i: scores[i])  # the race's argmax of w / e (no Triton needed: a Mac draws it too)
    others = [f"token {t}" for i, t in enumerate(tokens) if i != win]
    return Choice(
        f"The exponential race over four tokens {tokens}: weights w = {w} (an unnormalised residual), noise "
        f"e = {e} (Exponential(1) draws). Which token does the race pick?",
        f"token {tokens[win]}",
        tuple(others),
        f"The race takes argmax w / e: {', '.join(f'{t}: {s:.3f}' for t, s in zip(tokens, scores))}, so token "
        f"{tokens[win]}. Over random e it picks token x with probability w(x) / sum(w), with no normalisation pass.")
