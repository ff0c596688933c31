"""Train the course's target and draft models on a 2-core CPU, deterministically.

``python -m specdec.models.train`` (``make models``) trains the target on half code, half math
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
from tqdm.auto import tqdm

from specdec.models import corpus, tokenizer
from specdec.models.cards import write_model_card
from specdec.models.checkpoints import load, save
from specdec.models.model import Llama, LlamaConfig
from specdec.paths import DATA_DIR

TARGET = LlamaConfig(d_model=512, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=1024, max_seq_len=512)
DRAFT = LlamaConfig(d_model=192, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512, max_seq_len=512)
# notebook 14's mixture-of-experts target: 8 experts of d_ff 128 per layer, 2 per token
MOE_TARGET = LlamaConfig(d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=128, max_seq_len=512, n_experts=8, top_k=2)
# name -> (config, distilled from the target?). draft_undistilled is the draft's architecture trained
# on next-byte cross-entropy alone: the control that shows what distillation buys in acceptance.
MODELS = {"target": (TARGET, False), "draft": (DRAFT, True), "draft_undistilled": (DRAFT, False),
          "moe_target": (MOE_TARGET, False)}
BALANCE_WEIGHT = 0.01  # the load-balancing loss's weight for a mixture of experts (Switch Transformer's value)


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
        objective = loss
        if config.n_experts:  # keep the experts in use: without it the router collapses onto a few
            objective = loss + BALANCE_WEIGHT * sum(layer.mlp.balance for layer in model.layers)
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200, help="optimizer steps for each model")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--out", type=Path, default=DATA_DIR / "models")
    parser.add_argument("--only", choices=list(MODELS),
                        help="train just one (the draft is distilled from the target already in --out; "
                             "draft_undistilled is the same draft trained on the bytes alone, for comparison)")
    args = parser.parse_args(argv)
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
