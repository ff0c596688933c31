"""Train the course's target and draft models on a 2-core CPU, deterministically.

``python -m specdec.train --steps 600`` trains both on half code, half math windows and
writes ``data/models/{target,draft}.safetensors`` (bf16 weights, config in the metadata)
and a loss plot. The draft is a much smaller model of the same family and tokenizer.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file
from tqdm.auto import tqdm

from specdec import corpus, tokenizer
from specdec.model import Llama, LlamaConfig
from specdec.paths import DATA_DIR

TARGET = LlamaConfig(d_model=512, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=1024, max_seq_len=512)
DRAFT = LlamaConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=352, max_seq_len=512)


def training_data(code_bytes: int = 4_000_000, math_problems: int = 40_000) -> dict[str, torch.Tensor]:
    """Token ids of each task's training text (held-out files and seeds excluded)."""
    return {
        "code": torch.tensor(tokenizer.encode(corpus.code_text(code_bytes)), dtype=torch.long),
        "math": torch.tensor(tokenizer.encode(corpus.math_text(math_problems, seed=0)), dtype=torch.long),
    }


def batches(data: dict[str, torch.Tensor], batch_size: int, seq_len: int, generator: torch.Generator):
    """Endless (inputs, targets) of shape (B, T): random windows, half from each task."""
    tasks = list(data.values())
    while True:
        rows = []
        for i in range(batch_size):
            ids = tasks[i % len(tasks)]
            start = int(torch.randint(0, len(ids) - seq_len - 1, (1,), generator=generator))
            rows.append(ids[start : start + seq_len + 1])
        block = torch.stack(rows)
        yield block[:, :-1], block[:, 1:]


def train(config: LlamaConfig, data: dict[str, torch.Tensor], steps: int, batch_size: int = 16, seq_len: int = 256,
          lr: float = 3e-3, seed: int = 0, progress: bool = True) -> tuple[Llama, list[float]]:
    """AdamW with warm-up and cosine decay; returns the model and the loss per step."""
    torch.manual_seed(seed)
    model = Llama(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    stream = batches(data, batch_size, seq_len, torch.Generator().manual_seed(seed))
    losses = []
    bar = tqdm(range(steps), desc=f"d_model={config.d_model} x{config.n_layers}", disable=not progress)
    for _ in bar:
        inputs, targets = next(stream)
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return model.eval(), losses


def save(model: Llama, path: Path, extra: dict | None = None) -> None:
    """bf16 weights and the config (JSON) in one safetensors file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(path), metadata={"config": json.dumps(model.config.to_dict()), **(extra or {})})


def load(path: Path | str) -> Llama:
    """A model saved by :func:`save`, in float32."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path} (train one with `python -m specdec.train`)")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "config" not in meta:
        raise ValueError(f"{path} has no model config in its metadata: not a checkpoint of this course")
    model = Llama(LlamaConfig(**json.loads(meta["config"])))
    model.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="target steps (the draft gets the same)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--out", type=Path, default=DATA_DIR / "models")
    parser.add_argument("--only", choices=["target", "draft"], help="train just one of the two")
    args = parser.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    data = training_data()
    print({task: len(ids) for task, ids in data.items()}, "training tokens")
    curves = {}
    for name, config in (("target", TARGET), ("draft", DRAFT)):
        if args.only and args.only != name:
            continue
        start = time.perf_counter()
        model, losses = train(config, data, args.steps, args.batch_size, args.seq_len)
        seconds = time.perf_counter() - start
        save(model, args.out / f"{name}.safetensors", {"steps": str(args.steps), "final_loss": f"{losses[-1]:.4f}",
                                                      "train_seconds": f"{seconds:.0f}"})
        curves[name] = losses
        print(f"{name}: {model.num_params():,} parameters, final loss {losses[-1]:.3f}, {seconds / 60:.1f} min")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, losses in curves.items():
        plt.plot(losses, label=name)
    plt.xlabel("step"); plt.ylabel("cross-entropy (nats/byte)"); plt.legend()
    plt.savefig(args.out / "loss.png", dpi=80)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
