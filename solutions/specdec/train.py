"""Train the course's target and draft models on a 2-core CPU, deterministically.

``python -m specdec.train`` (``make models``) trains the target on half code, half math
windows, then distils the draft from it: the draft learns the target's next-token
distribution (soft labels), which is what speculative acceptance rewards. It writes
``data/models/{target,draft}.safetensors`` (bf16 weights, config in the metadata),
``train_log.json`` (losses, held-out losses, timings) and ``loss.png``. The same seed,
machine and thread count give the same weights.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, safe_open, save_file
from tqdm.auto import tqdm

from specdec import corpus, tokenizer
from specdec.model import Llama, LlamaConfig
from specdec.paths import DATA_DIR

TARGET = LlamaConfig(d_model=512, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=1024, max_seq_len=512)
DRAFT = LlamaConfig(d_model=192, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512, max_seq_len=512)
# name -> (config, distilled from the target?). draft_undistilled is the draft's architecture trained
# on next-byte cross-entropy alone: the control that shows what distillation buys in acceptance.
MODELS = {"target": (TARGET, False), "draft": (DRAFT, True), "draft_undistilled": (DRAFT, False)}


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
          lr: float = 3e-3, seed: int = 0, progress: bool = True, teacher: Llama | None = None) -> tuple[Llama, list[float]]:
    """AdamW with warm-up and cosine decay; returns the model and the loss per step.

    Without a teacher the loss is cross-entropy with the next byte. With one it is
    cross-entropy with the teacher's next-token distribution (forward KL plus the
    teacher's entropy), i.e. distillation.
    """
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
        logits = model(inputs).flatten(0, 1)  # (B*T, V)
        if teacher is None:
            loss = F.cross_entropy(logits, targets.flatten())
        else:
            with torch.no_grad():
                soft = torch.softmax(teacher(inputs).flatten(0, 1), dim=-1)
            loss = F.cross_entropy(logits, soft)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return model.eval(), losses


@torch.no_grad()
def held_out_loss(model: Llama, seq_len: int = 256, windows: int = 8) -> dict[str, float]:
    """Next-byte cross-entropy (nats/byte) on held-out code files and unseen math problems."""
    texts = {"code": corpus.code_text(windows * seq_len + 1, held_out=True),
             "math": corpus.math_text(4 * windows, seed=999_983)}
    losses = {}
    for task, text in texts.items():
        ids = torch.tensor(tokenizer.encode(text)[: windows * seq_len + 1])
        n = (len(ids) - 1) // seq_len
        inputs = ids[: n * seq_len].view(n, seq_len)
        targets = ids[1 : n * seq_len + 1].view(n, seq_len)
        losses[task] = round(F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).item(), 4)
    return losses


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


def load_pair(models: Path | str = DATA_DIR / "models") -> tuple[Llama, Llama]:
    """The course's (target, draft), from a folder holding target.safetensors and draft.safetensors."""
    models = Path(models)
    target, draft = load(models / "target.safetensors"), load(models / "draft.safetensors")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"{models}: the target's vocabulary ({target.config.vocab_size}) and the draft's "
                         f"({draft.config.vocab_size}) differ")
    return target, draft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200, help="optimizer steps for each model")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--out", type=Path, default=DATA_DIR / "models")
    parser.add_argument("--heads", action="store_true",
                        help="instead: train notebook 12's Medusa heads and EAGLE drafter on the target in --out")
    parser.add_argument("--only", choices=list(MODELS),
                        help="train just one (the draft is distilled from the target already in --out; "
                             "draft_undistilled is the same draft trained on the bytes alone, for comparison)")
    args = parser.parse_args(argv)
    if args.heads:
        from specdec.drafters.train import main as train_heads

        return train_heads(args.out)
    data = training_data()
    print({task: len(ids) for task, ids in data.items()}, "training tokens", f"{torch.get_num_threads()} threads")
    log_path = args.out / "train_log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    for name, (config, distilled) in MODELS.items():
        if args.only and args.only != name:
            continue
        teacher = load(args.out / "target.safetensors") if distilled else None
        start = time.perf_counter()
        model, losses = train(config, data, args.steps, args.batch_size, args.seq_len, teacher=teacher)
        seconds = time.perf_counter() - start
        held_out = held_out_loss(model)
        save(model, args.out / f"{name}.safetensors", {"steps": str(args.steps), "train_seconds": f"{seconds:.0f}"})
        log[name] = {"params": model.num_params(), "config": config.to_dict(), "steps": args.steps,
                     "batch_size": args.batch_size, "seq_len": args.seq_len, "distilled": teacher is not None,
                     "train_seconds": round(seconds), "threads": torch.get_num_threads(),
                     "final_train_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
                     "held_out_loss": held_out, "losses": [round(x, 4) for x in losses]}
        log_path.write_text(json.dumps(log, indent=1))
        print(f"{name}: {model.num_params():,} parameters, held-out loss {held_out}, {seconds / 60:.1f} min")
    plot_losses(log, args.out / "loss.png")
    write_model_card(log, args.out)
    return 0


def write_model_card(log: dict, folder: Path) -> None:
    """data/models/README.md from the training log, so the card always matches the weights."""
    rows = []
    for name, e in log.items():
        c = e["config"]
        size = (folder / f"{name}.safetensors").stat().st_size / 1e6
        rows.append(f"| {name} | {e['params'] / 1e6:.2f}M | {c['d_model']} | {c['n_layers']} | {c['n_heads']} / "
                    f"{c['n_kv_heads']} | {c['d_ff']} | {c['max_seq_len']} | {size:.1f} MB |")
    runs = []
    for name, e in log.items():
        objective = "soft cross-entropy with the target's distribution (distilled)" if e["distilled"] else \
            "next-byte cross-entropy"
        runs.append(f"| {name} | {objective} | {e['steps']} x {e['batch_size']} x {e['seq_len']} = "
                    f"{e['steps'] * e['batch_size'] * e['seq_len'] / 1e6:.1f}M | {e['train_seconds'] / 60:.1f} min on "
                    f"{e['threads']} threads | {e['final_train_loss']:.3f} | {e['held_out_loss']['code']:.3f} | "
                    f"{e['held_out_loss']['math']:.3f} |")
    card = f"""# The course's models

Byte-level Llama-style decoders (`specdec/model.py`) trained by this project's own script on a
2-core CPU; nothing was downloaded. They exist to make speculative decoding real in the
notebooks: real KV caches, real acceptance rates, real speedups. They are not useful models.
`draft_undistilled` has the draft's architecture, data and steps but learns the next byte alone
instead of the target's distribution: the control that shows what distillation buys.

| model | parameters | d_model | layers | query / KV heads | d_ff | context | file (bf16) |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Vocabulary: the 256 byte values (`specdec/tokenizer.py`), shared by both, so every draft token
is a valid target token. Weights are stored in bfloat16 with the config in the safetensors
metadata; `specdec.train.load` returns float32 models. `specdec.hf.to_transformers` turns either
into a Hugging Face `LlamaForCausalLM` with the same logits (`tests/test_hf.py`).

## Data

Half of every batch is code, half math (`specdec/corpus.py`):

- **code**: this interpreter's standard library source (ASCII `.py` files, test and demo
  packages skipped), read at training time and never committed. One file in ten, chosen by a
  hash of its name, is held out: the code prompts and the held-out loss come from those.
- **math**: step-by-step arithmetic word problems from the course's generator (seed 0 for
  training; the prompts use another seed, `data/prompts/math.jsonl`).

## Training

AdamW (lr 3e-3, betas 0.9/0.95, weight decay 0.1), warm-up then cosine decay, gradient
clipping at 1. The target learns the next byte; the draft is then distilled from the target,
learning its whole next-byte distribution, which is what speculative acceptance rewards.

| model | objective | steps x batch x length = bytes | time | final train loss | held-out code | held-out math |
|---|---|---|---|---|---|---|
{chr(10).join(runs)}

Losses are in nats per byte; the draft's train loss is the soft cross-entropy (it includes the
target's own entropy), its held-out losses are ordinary next-byte cross-entropy.

![training loss](loss.png)

## Retrain

`make models` (or `python -m specdec.train`) rewrites `target.safetensors`, `draft.safetensors`,
`draft_undistilled.safetensors`,
`train_log.json`, `loss.png` and this card. `--only draft` re-distils the draft from the target in
this folder; `--only draft_undistilled` trains the control. With the same seed, Python version (the standard library is the code data), torch
version and thread count, the weights come out the same.
"""
    from specdec.drafters.train import heads_card

    (folder / "README.md").write_text(card + heads_card(folder))


def plot_losses(log: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, entry in log.items():
        what = "soft cross-entropy with the target" if entry["distilled"] else "cross-entropy"
        ax.plot(entry["losses"], label=f"{name} ({entry['params'] / 1e6:.2f}M, {what})")
    ax.set_xlabel("step")
    ax.set_ylabel("nats / byte")
    ax.set_title("Training loss (half code, half math)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    raise SystemExit(main())
