"""The course's data tables: model architectures and GPUs, read from ``data/``."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from specdec.paths import DATA_DIR


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, rotary positions, SwiGLU MLP, no biases."""

    name: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig {self.name!r}: {field} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig {self.name!r}: d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig {self.name!r}: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class GPU:
    """Peak memory bandwidth (bytes/s) and dense BF16 tensor throughput (FLOP/s)."""

    name: str
    bandwidth: float
    bf16_flops: float
    memory_gb: float
    source: str = ""

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte at which a kernel stops being memory bound."""
        return self.bf16_flops / self.bandwidth


def _read_table(path: Path, key: str) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"course data file missing: {path} (set SPECDEC_DATA to the data/ folder)") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if key not in data or not isinstance(data[key], list):
        raise ValueError(f"{path} must hold a list under {key!r}")
    return data[key]


def _build(cls: type, row: dict, path: Path):
    known = {f.name for f in fields(cls)}
    unknown = set(row) - known
    if unknown:
        raise ValueError(f"{path}: entry {row.get('name')!r} has unknown keys {sorted(unknown)}")
    try:
        return cls(**row)
    except TypeError as err:
        raise ValueError(f"{path}: entry {row.get('name')!r}: {err}") from None


def load_models(path: Path | None = None) -> dict[str, ModelConfig]:
    """Model configs from ``data/models.json``, by name."""
    path = path or DATA_DIR / "models.json"
    return {row["name"]: _build(ModelConfig, row, path) for row in _read_table(path, "models")}


def load_gpus(path: Path | None = None) -> dict[str, GPU]:
    """GPU specs from ``data/gpus.json``, by name."""
    path = path or DATA_DIR / "gpus.json"
    return {row["name"]: _build(GPU, row, path) for row in _read_table(path, "gpus")}
