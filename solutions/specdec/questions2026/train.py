"""Train notebook 15's models on a 2-core CPU: ``python -m specdec.questions2026.train [--only NAME]``.

- ``parallel_drafter``: the course draft given a mask token and trained to draft up to 8 tokens in one forward on
  chains laid out by conditional drop-token (:mod:`.parallel`), next-byte labels (target-independent, as PARD).
- ``hybrid_target``: a 4-layer hybrid, three recurrent layers then one attention layer (:mod:`.hybrid`), next byte.
- ``target_update``: a rank-8 LoRA update of the course target on shifted text (:mod:`.drift`), the "policy update".
- ``draft_redistilled``: the course draft distilled again, on the moved target's own continuations.
Writes ``data/models/<name>.safetensors`` and ``data/models/questions2026_log.json`` (losses, times, settings).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from specdec.models import tokenizer
from specdec.models.cards import write_model_card
from specdec.models.checkpoints import load, save
from specdec.models.model import KVCache, Llama
from specdec.models.train import batches, training_data
from specdec.paths import DATA_DIR
from specdec.questions2026 import drift, hybrid, parallel

GAMMA_MAX = 8
# share of anchors whose chain reaches depth k: 0.7^k, at least 0.2 (PARD's repository defaults, see notebook 15)
RETAIN = tuple(max(0.7 ** k, 0.2) for k in range(1, GAMMA_MAX))
HYBRID = hybrid.HybridConfig(d_model=256, layout="RRRA", n_heads=4, n_kv_heads=2, d_ff=512, rec_heads=4, d_key=32,
                             d_value=64)


def _optimizer(params, lr: float, steps: int):
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    return optimizer, schedule


def _step(loss, params, optimizer, schedule) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    schedule.step()


def train_parallel(draft: Llama, data, steps: int, batch_size: int = 8, seq_len: int = 128, lr: float = 1e-3,
                   seed: int = 0) -> tuple[Llama, list[float]]:
    """The draft with a mask token, trained on COD layouts: every token (real or mask) at position p learns x_{p+1}."""
    torch.manual_seed(seed)
    model = parallel.with_mask_token(draft).train()
    params = list(model.parameters())
    optimizer, schedule = _optimizer(params, lr, steps)
    stream, g = batches(data, batch_size, seq_len, torch.Generator().manual_seed(seed)), torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        inputs, targets = next(stream)  # (B, L): x_0..x_{L-1} and x_1..x_L
        positions, depths = parallel.cod_layout(seq_len, GAMMA_MAX, RETAIN, g)  # one layout for the batch
        tokens = torch.cat([inputs, torch.full((batch_size, len(positions) - seq_len), parallel.mask_id(model))], 1)
        logits = model(tokens, position_ids=positions, mask=parallel.parallel_training_mask(positions, depths))
        loss = F.cross_entropy(logits.flatten(0, 1), targets[:, positions].flatten())
        _step(loss, params, optimizer, schedule)
        losses.append(loss.item())
    return model.eval(), losses


def train_hybrid(config: hybrid.HybridConfig, data, steps: int, batch_size: int = 16, seq_len: int = 256,
                 lr: float = 3e-3, seed: int = 0) -> tuple[hybrid.HybridLM, list[float]]:
    torch.manual_seed(seed)
    model = hybrid.HybridLM(config).train()
    params = list(model.parameters())
    optimizer, schedule = _optimizer(params, lr, steps)
    stream, losses = batches(data, batch_size, seq_len, torch.Generator().manual_seed(seed)), []
    for _ in range(steps):
        inputs, targets = next(stream)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        _step(loss, params, optimizer, schedule)
        losses.append(loss.item())
    return model.eval(), losses


def train_update(target: Llama, steps: int, batch_size: int = 16, seq_len: int = 128, lr: float = 2e-3,
                 seed: int = 0) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Rank-8 factors for every projection of ``target`` (frozen), trained on shifted text."""
    torch.manual_seed(seed)
    text = drift.shifted_text(2_000_000, 20_000, seed=0)
    data = {task: torch.tensor(tokenizer.encode(t), dtype=torch.long) for task, t in text.items()}
    layers = drift.lora_layers(target)
    factors = {}
    for name, linear in layers.items():
        a = torch.randn(drift.LORA_RANK, linear.in_features) / math.sqrt(linear.in_features)
        factors[f"{name}.lora_A"] = torch.nn.Parameter(a)
        factors[f"{name}.lora_B"] = torch.nn.Parameter(torch.zeros(linear.out_features, drift.LORA_RANK))
    for p in target.parameters():
        p.requires_grad_(False)

    def low_rank(module, args, out, name):  # W x + scale B A x
        return out + drift.LORA_SCALE * (args[0] @ factors[f"{name}.lora_A"].T) @ factors[f"{name}.lora_B"].T

    hooks = [linear.register_forward_hook(lambda module, args, out, name=name: low_rank(module, args, out, name))
             for name, linear in layers.items()]
    params = list(factors.values())
    optimizer, schedule = _optimizer(params, lr, steps)
    optimizer.param_groups[0]["weight_decay"] = 0.0
    stream, losses = batches(data, batch_size, seq_len, torch.Generator().manual_seed(seed)), []
    for _ in range(steps):
        inputs, targets = next(stream)
        loss = F.cross_entropy(target(inputs).flatten(0, 1), targets.flatten())
        _step(loss, params, optimizer, schedule)
        losses.append(loss.item())
    for h in hooks:
        h.remove()
    return {k: v.detach() for k, v in factors.items()}, losses


@torch.no_grad()
def own_continuations(target: Llama, windows: int = 384, prompt_len: int = 64, new_tokens: int = 128,
                      seed: int = 0) -> torch.Tensor:
    """(windows, prompt_len + new_tokens): training windows (half code, half math, shifted text) continued by
    ``target`` itself at temperature 1: the re-distillation data."""
    g = torch.Generator().manual_seed(seed)
    text = drift.shifted_text(400_000, 4_000, seed=1)
    data = [torch.tensor(tokenizer.encode(t), dtype=torch.long) for t in text.values()]
    rows = []
    for i in range(windows):
        ids = data[i % 2]
        start = int(torch.randint(0, len(ids) - prompt_len, (1,), generator=g))
        rows.append(ids[start : start + prompt_len])
    seqs = torch.stack(rows)
    cache = KVCache(target.config, batch_size=windows)
    logits = target(seqs, cache)[:, -1]
    out = [seqs]
    for _ in range(new_tokens):
        token = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)  # (B, 1)
        out.append(token)
        logits = target(token, cache)[:, -1]
    return torch.cat(out, dim=1)


def redistill(draft: Llama, teacher: Llama, sequences: torch.Tensor, steps: int, batch_size: int = 16,
              lr: float = 1e-3, seed: int = 0) -> tuple[Llama, list[float]]:
    """Continue training ``draft`` on soft labels from ``teacher`` over the teacher's own sequences."""
    torch.manual_seed(seed)
    model = Llama(draft.config)
    model.load_state_dict(draft.state_dict())
    model.train()
    params = list(model.parameters())
    optimizer, schedule = _optimizer(params, lr, steps)
    g, losses = torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        batch = sequences[torch.randint(0, len(sequences), (batch_size,), generator=g)]
        inputs = batch[:, :-1]
        with torch.no_grad():
            soft = torch.softmax(teacher(inputs), -1)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), soft.flatten(0, 1))
        _step(loss, params, optimizer, schedule)
        losses.append(loss.item())
    return model.eval(), losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["parallel_drafter", "hybrid_target", "target_update", "draft_redistilled"])
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps (0: each model's default)")
    args = parser.parse_args(argv)
    out = DATA_DIR / "models"
    log_path = out / "questions2026_log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    data = None
    for name in ("parallel_drafter", "hybrid_target", "target_update", "draft_redistilled"):
        if args.only and args.only != name:
            continue
        start = time.perf_counter()
        if name in ("parallel_drafter", "hybrid_target"):
            data = data or training_data(2_000_000, 20_000)
        if name == "parallel_drafter":
            steps = args.steps or 400
            model, losses = train_parallel(load(out / "draft.safetensors"), data, steps)
            save(model, out / f"{name}.safetensors")
            extra = {"gamma_max": GAMMA_MAX, "retain": [round(r, 4) for r in RETAIN], "seq_len": 128}
        elif name == "hybrid_target":
            steps = args.steps or 500
            model, losses = train_hybrid(HYBRID, data, steps)
            hybrid.save_hybrid(model, out / f"{name}.safetensors")
            extra = {"config": HYBRID.to_dict(), "params": model.num_params(), "seq_len": 256}
        elif name == "target_update":
            steps = args.steps or 150
            factors, losses = train_update(load(out / "target.safetensors"), steps)
            drift.save_update(factors, out / f"{name}.safetensors", {"rank": drift.LORA_RANK, "scale": drift.LORA_SCALE})
            extra = {"rank": drift.LORA_RANK, "params": sum(v.numel() for v in factors.values()), "seq_len": 128}
        else:
            steps = args.steps or 300
            moved = drift.moved_target(out)
            t0 = time.perf_counter()
            sequences = own_continuations(moved)
            extra = {"generation_seconds": round(time.perf_counter() - t0, 1), "sequences": list(sequences.shape)}
            model, losses = redistill(load(out / "draft.safetensors"), moved, sequences, steps)
            save(model, out / f"{name}.safetensors")
        seconds = time.perf_counter() - start
        log[name] = {"steps": steps, "train_seconds": round(seconds), "threads": torch.get_num_threads(),
                     "final_train_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
                     "losses": [round(x, 4) for x in losses], **extra}
        log_path.write_text(json.dumps(log, indent=1))
        print(f"{name}: {seconds / 60:.1f} min, final loss {log[name]['final_train_loss']}", flush=True)
    if (out / "train_log.json").exists():
        write_model_card(json.loads((out / "train_log.json").read_text()), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
