"""Drill templates of notebook 12: what a self-drafter costs in weights and KV next to the target."""

from __future__ import annotations

import random

from specdec import ledger
from specdec.drafters.memory import drafter_cost
from specdec.drill import draws
from specdec.drill.questions import Choice, Number, choice, number, show

NB = "12_self_drafting"
COST = "5. What each drafter costs"


@number("drafters_eagle_kv_gib", topic="drafters", notebook=NB, section=COST)
def eagle_kv(rng: random.Random) -> Number:
    cfg = draws.model(rng)
    batch, context = rng.choice([8, 16, 32, 64]), rng.choice([2048, 4096, 8192, 16384])
    cost = drafter_cost("eagle", draws.llama_config(cfg), None, batch, context, 4, 5)
    gib = cost.kv_bytes / 2**30
    target_gib = ledger.kv_bytes_per_token(cfg, 2) * batch * context / 2**30
    return Number(
        f"An EAGLE drafter (one decoder layer of the target's shape) on {cfg.name} ({cfg.n_kv_heads} KV heads of "
        f"head_dim {cfg.head_dim}), KV in BF16, {batch} requests of {context:,} tokens. How many GiB of KV does the "
        "drafter add?",
        gib,
        f"One layer caches 2 x {cfg.n_kv_heads} x {cfg.head_dim} values = {2 * cfg.n_kv_heads * cfg.head_dim * 2:,} "
        f"bytes per token; x {batch * context:,} tokens = {show(gib)} GiB, 1/{cfg.n_layers} of the target's own "
        f"{target_gib:.4g} GiB.",
        unit="GiB")


@number("drafters_medusa_weights_gib", topic="drafters", notebook=NB, section=COST)
def medusa_weights(rng: random.Random) -> Number:
    cfg, heads = draws.model(rng), rng.randrange(2, 6)
    cost = drafter_cost("medusa", draws.llama_config(cfg), None, 1, 1, 4, 5, num_heads=heads)
    gib = cost.weight_bytes / 2**30
    d, V = cfg.d_model, cfg.vocab_size
    return Number(
        f"{heads} Medusa heads on {cfg.name} (d_model {d:,}, vocabulary {V:,}); each head is a residual block (SiLU(W h) "
        "+ h, with a bias) and its own vocabulary projection, in BF16. How many GiB of weights do the heads add?",
        gib,
        f"Per head: d x d + d = {d * d + d:,} (the block) + V x d = {V * d:,} (the projection) = {d * d + d + V * d:,}; "
        f"x {heads} heads x 2 bytes = {cost.weight_bytes:,.0f} B = {show(gib)} GiB. The projections dominate.",
        unit="GiB")


@number("drafters_eagle_weights_gib", topic="drafters", notebook=NB, section=COST)
def eagle_weights(rng: random.Random) -> Number:
    cfg = draws.model(rng)
    cost = drafter_cost("eagle", draws.llama_config(cfg), None, 1, 1, 4, 5)
    gib = cost.weight_bytes / 2**30
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    layer = 2 * d * d + 2 * d * kv + 3 * d * cfg.d_ff + 2 * d
    return Number(
        f"An EAGLE drafter for {cfg.name} (d_model {d:,}, {cfg.n_kv_heads} KV heads of head_dim {cfg.head_dim}, FFN "
        f"{cfg.d_ff:,}): one decoder layer of the target's shape plus the fc that fuses feature and token embedding "
        "(2d x d + d); it shares the target's embedding and LM head. How many GiB of weights in BF16?",
        gib,
        f"Layer: q, o 2 x {d}^2 + k, v 2 x {d} x {kv} + MLP 3 x {d} x {cfg.d_ff} + norms 2 x {d} = {layer:,}; fc "
        f"2 x {d}^2 + {d} = {2 * d * d + d:,}; total {layer + 2 * d * d + d:,} x 2 B = {show(gib)} GiB.",
        unit="GiB")


@choice("drafters_exact_tree_rule", topic="drafters", notebook=NB, section="2. Medusa heads")
def exact_tree_rule(rng: random.Random) -> Choice:
    temperature = rng.choice([0.6, 0.7, 0.8, 1.0])
    return Choice(
        f"Medusa's heads propose a tree of deterministic candidates, and the request samples at temperature "
        f"{temperature}. Which verification keeps the output exactly the target's distribution?",
        "at each node try the children in order: accept child x with probability r(x) / sum(r), r starting as p; on a "
        "rejection set r(x) = 0 and try the next; if all are rejected, sample from what remains of r",
        ("Medusa's typical acceptance: accept a candidate when p(x) exceeds min(epsilon, delta exp(-H(p)))",
         "accept each child with probability p(x) independently, and after all are rejected sample from p itself",
         "accept the candidate with the highest draft probability when it is the target's argmax, else sample from p"),
        "Deterministic children are one-hot drafts tried one after another: each rejection removes that token from "
        "the residual (notebook 07's rule, exact). Typical acceptance trades fidelity for speed; sampling from p after "
        "rejections gives rejected tokens a second chance; the argmax rule is greedy, not sampling.")
