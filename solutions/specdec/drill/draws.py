"""Drawing a question's parameters: the course's model and GPU tables, precisions, small distributions."""

from __future__ import annotations

import functools
import random

from specdec.models.model import LlamaConfig
from specdec.tables import GPU, ModelConfig, load_gpus, load_models

#: Weight or KV precisions a question may name, with their bytes per value.
PRECISIONS = {"FP16": 2, "BF16": 2, "FP8": 1, "INT4": 0.5}


@functools.cache
def models() -> dict[str, ModelConfig]:
    return load_models()


@functools.cache
def gpus() -> dict[str, GPU]:
    return load_gpus()


def model(rng: random.Random, gqa_only: bool = False) -> ModelConfig:
    """A model of the course's table (data/models.json); ``gqa_only``: one with fewer KV heads than query heads."""
    table = [m for m in models().values() if not gqa_only or m.n_kv_heads < m.n_heads]
    return rng.choice(table)


def gpu(rng: random.Random) -> GPU:
    """A GPU of the course's table (data/gpus.json)."""
    return rng.choice(list(gpus().values()))


def precision(rng: random.Random, names: tuple[str, ...] = ("FP16", "FP8", "INT4")) -> tuple[str, float]:
    name = rng.choice(names)
    return name, PRECISIONS[name]


def llama_config(cfg: ModelConfig) -> LlamaConfig:
    """The same architecture as the model code's config (what ``drafters.memory.drafter_cost`` takes)."""
    return LlamaConfig(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                       n_kv_heads=cfg.n_kv_heads, d_ff=cfg.d_ff, max_seq_len=8192)


def distribution(rng: random.Random, size: int, step: float = 0.05, floor: int = 1) -> list[float]:
    """A probability vector of ``size`` entries, each a multiple of ``step`` and at least ``floor`` steps."""
    units = round(1 / step)
    cuts = sorted(rng.sample(range(1, units - floor * size + size), size - 1))
    parts = [b - a for a, b in zip([0, *cuts], [*cuts, units - floor * size + size])]
    return [round((p - 1 + floor) * step, 10) for p in parts]


def two_distributions(rng: random.Random, size: int = 4) -> tuple[list[float], list[float]]:
    """A target p and a draft q over ``size`` tokens that differ (so some draft gets rejected)."""
    while True:
        p, q = distribution(rng, size), distribution(rng, size)
        if sum(abs(a - b) for a, b in zip(p, q)) >= 0.3:
            return p, q


def fmt_list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"
