"""Self-distillation of the self-drafters on the frozen, shipped target (notebook 12).

Data: the target's own text. Windows of the training corpus (code and math) are continued by the
target, sampling at temperature 1, so the heads learn what *this* target says (Medusa's recipe when
the training data does not match the model). The target's logits and features on that text are the
labels:

- **Medusa-1**: head k at position t learns the target's distribution of the token at t + k + 2
  (soft cross-entropy with softmax(logits at t + k + 1)), weighted 0.8^k; the target stays frozen.
- **EAGLE**: at position t the drafter reads (f_t, embedding of x_{t+1}) and predicts f_{t+1}; loss =
  smooth L1 to the true feature + 0.1 x soft cross-entropy of the target's LM head on the prediction
  against the target's distribution at t + 1 (the EAGLE paper's two terms and weights). Features are the
  LM head's input (after the target's final norm), as in EAGLE's released code.

- **MTP-style and EAGLE-3-style** (notebook 13, :mod:`specdec.drafters.eagle3`): small feature drafters trained
  with the token loss only; the MTP-style one reads the top layer and learns one step ahead, the EAGLE-3-style
  one fuses a low, a middle and the top layer and learns with training-time test. Only the EAGLE-3-style
  drafter ships (``eagle3.safetensors``); the MTP-style one and the ablation (fused, no training-time test)
  go to ``artifacts/drafters/`` for ``python -m specdec.bench.eagle3``.

    python -m specdec.drafters.train                 # or: make heads
    python -m specdec.drafters.train --only eagle3   # the notebook-13 drafters alone
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.eagle3 import FeatureDrafterConfig, frequent_tokens, save_feature_drafter, train_feature_drafter
from specdec.drafters.medusa import MedusaHeads
from specdec.models import corpus, tokenizer
from specdec.models.cards import write_model_card
from specdec.models.checkpoints import load
from specdec.models.model import KVCache, Llama, LlamaConfig
from specdec.paths import DATA_DIR, REPO_ROOT

MEDUSA_DECAY = 0.8  # weight of head k: 0.8^k (Medusa-1)
EAGLE_CLS_WEIGHT = 0.1  # EAGLE: L = L_reg + 0.1 L_cls


@torch.inference_mode()
def self_distillation_text(target: Llama, n_sequences: int, prompt_len: int, new_tokens: int, seed: int = 0,
                           batch_size: int = 64) -> torch.Tensor:
    """(n_sequences, prompt_len + new_tokens) token ids: corpus windows continued by the target (temperature 1)."""
    rng = random.Random(seed)
    texts = {"code": tokenizer.encode(corpus.code_text(400_000)), "math": tokenizer.encode(corpus.math_text(4_000, seed=0))}
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for first in range(0, n_sequences, batch_size):
        B = min(batch_size, n_sequences - first)
        windows = []
        for i in range(B):
            text = texts["code" if (first + i) % 2 == 0 else "math"]
            start = rng.randrange(len(text) - prompt_len)
            windows.append(text[start : start + prompt_len])
        tokens = torch.tensor(windows)
        cache = KVCache(target.config, batch_size=B)
        logits = target(tokens[:, :-1], cache)
        last = tokens[:, -1:]
        out = [tokens]
        for _ in range(new_tokens):
            logits = target(last, cache)[:, -1]
            last = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator)
            out.append(last)
        rows.append(torch.cat(out, dim=1))
    return torch.cat(rows)


@torch.inference_mode()
def target_labels(target: Llama, text: torch.Tensor, batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits (N, T, V) and features (N, T, d) on the text."""
    logits, features = [], []
    for first in range(0, len(text), batch_size):
        out, feats = target(text[first : first + batch_size], return_hidden=True)
        logits.append(out)
        features.append(feats)
    return torch.cat(logits), torch.cat(features)


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    return -(torch.softmax(target_logits, -1) * torch.log_softmax(logits, -1)).sum(-1).mean()


def train_medusa(target: Llama, text: torch.Tensor, logits: torch.Tensor, features: torch.Tensor, steps: int,
                 batch_size: int = 16, num_heads: int = 4, lr: float = 1e-3, seed: int = 0) -> tuple[MedusaHeads, list[float]]:
    torch.manual_seed(seed)
    c = target.config
    heads = MedusaHeads(c.d_model, c.vocab_size, num_heads)
    with torch.no_grad():
        heads.out_weight.copy_(target.lm_head.weight.expand(num_heads, -1, -1))  # each head starts as the LM head
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    g, losses = torch.Generator().manual_seed(seed), []
    for step in range(steps):
        rows = torch.randint(0, len(text), (batch_size,), generator=g)
        out = heads(features[rows])  # (K, B, T, V)
        T = out.shape[2]
        loss = sum(MEDUSA_DECAY ** k * soft_cross_entropy(out[k, :, : T - k - 1], logits[rows, k + 1 :])
                   for k in range(num_heads)) / sum(MEDUSA_DECAY ** k for k in range(num_heads))
        optimizer.zero_grad()
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, 0.5 * (1 + torch.cos(torch.tensor(step / steps * torch.pi)).item()) + 0.05)
        optimizer.step()
        losses.append(round(loss.item(), 4))
    return heads.eval(), losses


def train_eagle(target: Llama, text: torch.Tensor, logits: torch.Tensor, features: torch.Tensor, steps: int,
                batch_size: int = 16, lr: float = 1e-3, seed: int = 0) -> tuple[EagleDrafter, list[float]]:
    torch.manual_seed(seed)
    drafter = EagleDrafter(target.config)
    drafter.layer.load_state_dict(target.layers[-1].state_dict())  # start from the target's last layer
    for p in target.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=0.0)
    g, losses = torch.Generator().manual_seed(seed), []
    for step in range(steps):
        rows = torch.randint(0, len(text), (batch_size,), generator=g)
        feats, tokens = features[rows], text[rows]  # (B, T, d), (B, T)
        predicted = drafter(feats[:, :-1], target.embed_tokens(tokens[:, 1:]), target)  # f_t with x_{t+1} -> f_{t+1}
        regression = F.smooth_l1_loss(predicted, feats[:, 1:])
        classification = soft_cross_entropy(target.lm_head(predicted), logits[rows, 1:])
        loss = regression + EAGLE_CLS_WEIGHT * classification
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, 0.5 * (1 + torch.cos(torch.tensor(step / steps * torch.pi)).item()) + 0.05)
        optimizer.step()
        losses.append(round(loss.item(), 4))
    return drafter.eval(), losses


def save_heads(module: torch.nn.Module, path: Path, meta: dict) -> None:
    weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in module.state_dict().items()}
    save_file(weights, str(path), metadata={k: json.dumps(v) for k, v in meta.items()})


def load_medusa(path: Path | str = DATA_DIR / "models" / "medusa.safetensors") -> MedusaHeads:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no Medusa heads at {path} (train them with `make heads`)")
    weights = {k: v.float() for k, v in load_file(str(path)).items()}
    K, V, d = weights["out_weight"].shape
    heads = MedusaHeads(d, V, K)
    heads.load_state_dict(weights)
    return heads.eval()


def load_eagle(path: Path | str = DATA_DIR / "models" / "eagle.safetensors") -> EagleDrafter:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no EAGLE drafter at {path} (train it with `make heads`)")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    drafter = EagleDrafter(LlamaConfig(**json.loads(meta["config"])))
    drafter.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return drafter.eval()


#: Notebook 13's feature drafters: name -> (taps, training-time-test steps). Only "eagle3" ships.
FEATURE_DRAFTERS = {"mtp": ((4,), 1), "fused": ((1, 2, 4), 1), "eagle3": ((1, 2, 4), 4)}
DRAFT_VOCAB = 64  # EAGLE-3's reduced draft vocabulary, scaled: a quarter of the 256 byte ids (the most frequent ones)


def train_feature_drafters(target: Llama, text: torch.Tensor, logits: torch.Tensor, steps: int, folder: Path,
                           log: dict, common: dict, artifacts: Path = REPO_ROOT / "artifacts" / "drafters") -> None:
    """Notebook 13's drafters (FEATURE_DRAFTERS) on the same text; eagle3 into ``folder``, the others into ``artifacts``."""
    draft_vocab = frequent_tokens(text, DRAFT_VOCAB)
    coverage = float(torch.isin(text, torch.tensor(draft_vocab)).float().mean())
    every_tap = sorted({t for taps, _ in FEATURE_DRAFTERS.values() for t in taps})
    with torch.inference_mode():  # the target's residual stream at every tap, once for all drafters
        streams = torch.cat([target(text[i : i + 32], taps=tuple(every_tap))[2] for i in range(0, len(text), 32)])
    d = target.config.d_model
    for name, (taps, ttt_steps) in FEATURE_DRAFTERS.items():
        tapped = torch.cat([streams[..., every_tap.index(t) * d : (every_tap.index(t) + 1) * d] for t in taps], -1)
        config = FeatureDrafterConfig(target.config.d_model, target.config.vocab_size, taps, draft_vocab,
                                      max_seq_len=target.config.max_seq_len)
        start = time.perf_counter()
        drafter, losses = train_feature_drafter(target, text, logits, tapped, config, steps, ttt_steps, batch_size=32)
        seconds = time.perf_counter() - start
        path = folder / "eagle3.safetensors" if name == "eagle3" else artifacts / f"{name}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_feature_drafter(drafter, path, {"ttt_steps": ttt_steps})
        log[name] = {**common, "params": sum(p.numel() for p in drafter.parameters()), "steps": steps, "batch_size": 32,
                     "taps": list(taps), "ttt_steps": ttt_steps, "draft_vocab": len(draft_vocab),
                     "draft_vocab_coverage": round(coverage, 4), "train_seconds": round(seconds), "losses": losses}
        print(f"{name}: {log[name]['params']:,} parameters, taps {taps}, {ttt_steps} TTT step(s), "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {seconds / 60:.1f} min -> {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the self-drafters on the frozen, shipped target.")
    parser.add_argument("--only", choices=("medusa", "eagle", "eagle3"), help="train one of them (eagle3: notebook 13's)")
    parser.add_argument("--sequences", type=int, default=384)
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args(argv)
    folder = DATA_DIR / "models"
    target = load(folder / "target.safetensors")
    log_path = folder / "heads_log.json"
    log: dict = json.loads(log_path.read_text()) if args.only and log_path.exists() else {}
    start = time.perf_counter()
    text = self_distillation_text(target, args.sequences, prompt_len=64, new_tokens=128)
    logits, features = target_labels(target, text)
    data_s = time.perf_counter() - start
    print(f"self-distillation text: {tuple(text.shape)} tokens from the target in {data_s:.0f} s")
    common = {"sequences": args.sequences, "tokens": text.numel(), "data_seconds": round(data_s),
              "threads": torch.get_num_threads()}
    steps = args.steps
    if args.only in (None, "medusa"):
        start = time.perf_counter()
        heads, losses = train_medusa(target, text, logits, features, steps)
        seconds = time.perf_counter() - start
        save_heads(heads, folder / "medusa.safetensors", {"num_heads": heads.num_heads})
        log["medusa"] = {**common, "params": sum(p.numel() for p in heads.parameters()), "steps": steps, "batch_size": 16,
                         "train_seconds": round(seconds), "losses": losses}
        print(f"medusa: {log['medusa']['params']:,} parameters, loss {losses[0]:.3f} -> {losses[-1]:.3f}, {seconds / 60:.1f} min")
    if args.only in (None, "eagle"):
        start = time.perf_counter()
        drafter, losses = train_eagle(target, text, logits, features, steps)
        seconds = time.perf_counter() - start
        save_heads(drafter, folder / "eagle.safetensors", {"config": target.config.to_dict()})
        log["eagle"] = {**common, "params": sum(p.numel() for p in drafter.parameters()), "steps": steps, "batch_size": 16,
                        "train_seconds": round(seconds), "losses": losses}
        print(f"eagle: {log['eagle']['params']:,} parameters, loss {losses[0]:.3f} -> {losses[-1]:.3f}, {seconds / 60:.1f} min")
    if args.only in (None, "eagle3"):
        train_feature_drafters(target, text, logits, steps, folder, log, common)
    log_path.write_text(json.dumps(log, indent=1) + "\n")
    plot_head_losses(log, folder / "heads_loss.png")
    write_model_card(json.loads((folder / "train_log.json").read_text()), folder)
    return 0


def plot_head_losses(log: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels = {"medusa": "Medusa heads (weighted soft CE over 4 heads)", "eagle": "EAGLE (smooth L1 + 0.1 soft CE)",
              "mtp": "MTP-style (top layer, soft CE, 1 step)", "fused": "fused layers, soft CE, 1 step",
              "eagle3": "EAGLE-3-style (fused layers, soft CE, 4 TTT steps)"}
    for name, entry in log.items():
        ax.plot(entry["losses"], label=f"{labels[name]}, {entry['params'] / 1e6:.2f}M")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Self-drafters trained on the frozen target's own text")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    raise SystemExit(main())
