"""data/models/README.md, the model card, written from the training logs so it always matches the weights."""

from __future__ import annotations

import json
from pathlib import Path


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

Byte-level Llama-style decoders (`specdec/models/model.py`) trained by this project's own script on a
2-core CPU; nothing was downloaded. They exist to make speculative decoding real in the
notebooks: real KV caches, real acceptance rates, real speedups. They are not useful models.
`draft_undistilled` has the draft's architecture, data and steps but learns the next byte alone
instead of the target's distribution: the control that shows what distillation buys.
`moe_target` (notebook 14) is a mixture of experts: every layer's MLP is 8 experts of d_ff 128 (the table's
d_ff), 2 per token, chosen by a linear router, trained with Switch Transformer's load-balancing loss (weight 0.01);
1.58M of its 3.94M parameters act on each token. It is no draft's target: notebook 14 measures its routing.

| model | parameters | d_model | layers | query / KV heads | d_ff | context | file (bf16) |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Vocabulary: the 256 byte values (`specdec/models/tokenizer.py`), shared by both, so every draft token
is a valid target token. Weights are stored in bfloat16 with the config in the safetensors
metadata; `specdec.models.checkpoints.load` returns float32 models. `specdec.models.hf.to_transformers` turns either
into a Hugging Face `LlamaForCausalLM` with the same logits (`tests/test_hf.py`).

## Data

Half of every batch is code, half math (`specdec/models/corpus.py`):

- **code**: CPython 3.11.7's standard library source (ASCII `.py` files, test and demo
  packages skipped), pinned in `data/corpus/` (0.8 MB, xz) so every Python reads the same text.
  One file in ten, chosen by a hash of its name, is held out: the code prompts and the held-out
  loss come from those.
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

`make models` (or `python -m specdec.models.train`) rewrites `target.safetensors`, `draft.safetensors`,
`draft_undistilled.safetensors`,
`train_log.json`, `loss.png` and this card. `--only draft` re-distils the draft from the target in
this folder; `--only draft_undistilled` trains the control. With the same seed, torch
version and thread count, the weights come out the same.
"""
    (folder / "README.md").write_text(card + heads_card(folder) + questions2026_card(folder))


def heads_card(folder: Path) -> str:
    """The model card's section on the self-drafters, from heads_log.json (empty if they were never trained)."""
    path = folder / "heads_log.json"
    if not path.exists():
        return ""
    log = json.loads(path.read_text())
    rows = []
    for name, e in log.items():
        file = folder / f"{name}.safetensors"
        size = f"{file.stat().st_size / 1e6:.1f} MB" if file.exists() else "not shipped"
        unit = "windows" if "ttt_steps" in e else "sequences"
        rows.append(f"| {name} | {e['params'] / 1e6:.2f}M | {e['steps']} x {e['batch_size']} {unit} | "
                    f"{e['train_seconds'] / 60:.1f} min on {e['threads']} threads | {e['losses'][0]:.3f} -> "
                    f"{sum(e['losses'][-20:]) / len(e['losses'][-20:]):.3f} | {size} |")
    feature = log.get("eagle3")
    notebook13 = "" if feature is None else f"""
Notebook 13's feature drafters (`specdec/drafters/eagle3.py`, `python -m specdec.drafters.train --only eagle3`) are
small (width 96, one layer of 2 query and 1 KV heads, d_ff 192) and trained with the token loss alone (soft
cross-entropy against the target's distribution restricted to a draft vocabulary of the {feature['draft_vocab']} most
frequent bytes, which cover {feature['draft_vocab_coverage']:.1%} of the text), on windows of 64 + 1 tokens, AdamW, lr 3e-3
with warm-up and cosine decay. `mtp`: the top layer's residual stream, one step ahead (DeepSeek-V3's MTP
objective); `fused`: the residual stream after layers 1, 2 and 4 fused by one projection, one step ahead;
`eagle3`: fused the same way and trained with {feature['ttt_steps']} steps of training-time test. Only `eagle3` ships;
the other two are written to `artifacts/drafters/` for `python -m specdec.bench.eagle3`.
"""
    e = next(iter(log.values()))
    return f"""
## Self-drafters (notebook 12)

Trained by `make heads` (`python -m specdec.drafters.train`) with the target frozen, on the target's own text:
{e['sequences']} corpus windows of 64 bytes (half code, half math, training files only) continued by the
target for 128 bytes at temperature 1 ({e['tokens']:,} tokens, made in {e['data_seconds']} s). Medusa-1: 4 heads,
each a residual SiLU block on the target's normalised last hidden state (the LM head's input) and its own projection (initialised
from the LM head), head k learning the target's distribution k + 2 positions ahead, weighted 0.8^k. EAGLE: one
decoder layer of the target's shape (initialised from the target's last layer) after an fc over [feature;
next-token embedding], trained with smooth L1 to the target's next feature + 0.1 x soft cross-entropy through
the target's frozen LM head (features: the LM head's input, after the final norm). AdamW, lr 1e-3 with cosine
decay.
{notebook13}
| drafter | parameters | steps | time | loss (first -> last 20) | file (bf16) |
|---|---|---|---|---|---|
{chr(10).join(rows)}

![self-drafter training loss](heads_loss.png)
"""


def questions2026_card(folder: Path) -> str:
    """The model card's section on notebook 15's models, from questions2026_log.json (empty if never trained)."""
    path = folder / "questions2026_log.json"
    if not path.exists():
        return ""
    log = json.loads(path.read_text())

    def size(name: str) -> str:
        file = folder / f"{name}.safetensors"
        return f"{file.stat().st_size / 1e6:.2f} MB" if file.exists() else "not shipped"

    what = {
        "parallel_drafter": "the draft with a mask token (id 256), trained on COD layouts of 128-byte windows, chains "
                            "to gamma 8, next-byte labels (target-independent, as PARD)",
        "hybrid_target": "3 recurrent layers (gated linear attention, 4 heads of 32 x 64 state) then 1 attention layer, "
                         "d_model 256, next-byte cross-entropy on 256-byte windows",
        "target_update": "a rank-8 LoRA update of every projection of the target (scale 2), trained on shifted text "
                         "(2-space code, reworded arithmetic answers) with the target frozen",
        "draft_redistilled": "the draft trained again on the moved target's distributions over its own continuations "
                             "of 384 shifted windows (64 bytes, continued for 128 at temperature 1)",
    }
    rows = [f"| {name} | {what.get(name, '')} | {e['steps']} | {e['train_seconds'] / 60:.1f} min on {e['threads']} "
            f"threads | {e['final_train_loss']:.3f} | {size(name)} |" for name, e in log.items()]
    return f"""
## Notebook 15's models

Trained by `make models-15` (`python -m specdec.questions2026.train`, about 15 minutes on 2 cores). AdamW with warm-up
and cosine decay. The moved target is `target.safetensors` with `target_update.safetensors` merged
(`specdec.questions2026.drift.moved_target`); only the update ships.

| model | what | steps | time | final train loss (nats/byte) | file (bf16) |
|---|---|---|---|---|---|
{chr(10).join(rows)}
"""
