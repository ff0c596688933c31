"""The course's checkpoints: bf16 weights with the config in the safetensors metadata, loaded as float32."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file

from specdec.models.model import Llama, LlamaConfig
from specdec.paths import DATA_DIR


def save(model: Llama, path: Path, extra: dict | None = None) -> None:
    """bf16 weights and the config (JSON) in one safetensors file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(path), metadata={"config": json.dumps(model.config.to_dict()), **(extra or {})})


def load(path: Path | str) -> Llama:
    """A model saved by :func:`save`, in float32."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path} (train one with `python -m specdec.models.train`)")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "config" not in meta:
        raise ValueError(f"{path} has no model config in its metadata: not a checkpoint of this course")
    model = Llama(LlamaConfig(**json.loads(meta["config"])))
    model.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return model.eval()


def load_pair(models: Path | str = DATA_DIR / "models") -> tuple[Llama, Llama]:
    """The course's (target, draft), from a folder holding target.safetensors and draft.safetensors."""
    models = Path(models)
    target, draft = load(models / "target.safetensors"), load(models / "draft.safetensors")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"{models}: the target's vocabulary ({target.config.vocab_size}) and the draft's "
                         f"({draft.config.vocab_size}) differ")
    return target, draft
