"""The course's data tables: model architectures and GPUs, read from ``data/``."""

from __future__ import annotations

import json
import re
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
    """Peak memory bandwidth (bytes/s) and dense BF16 tensor throughput (FLOP/s). ``device_names``: what
    ``torch.cuda.get_device_name()`` says on this exact model (an H100 PCIe is not an H100 SXM)."""

    name: str
    bandwidth: float
    bf16_flops: float
    memory_gb: float
    source: str = ""
    device_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.device_names, str) or not all(isinstance(n, str) for n in self.device_names):
            raise ValueError(f"GPU {self.name!r}: device_names must be a list of names, got {self.device_names!r}")
        object.__setattr__(self, "device_names", tuple(self.device_names))

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


def _device_tokens(name: str) -> tuple[str, ...]:
    """A device name's words, lower case, without "NVIDIA": "NVIDIA A100-SXM4-80GB" is ("a100", "sxm4", "80gb")."""
    return tuple(word for word in re.split(r"[^a-z0-9.]+", name.lower()) if word and word != "nvidia")


def gpu_for_device(device_name: str, gpus: dict[str, GPU] | None = None) -> GPU | None:
    """The entry whose ``device_names`` include ``device_name`` word for word (case, punctuation and "NVIDIA"
    aside); None when none does: a near miss (H100 PCIe, L40S, a MIG slice) is another device."""
    words = _device_tokens(device_name)
    for gpu in (gpus or load_gpus()).values():
        if any(_device_tokens(name) == words for name in gpu.device_names):
            return gpu
    return None
