"""Drill templates on the KV cache: bytes per token and per block (notebooks 01, 11), the caches after a round
(notebooks 02, 05)."""

from __future__ import annotations

import random

from specdec import ledger
from specdec.drill import draws
from specdec.drill.questions import Choice, Number, choice, number, plural, show
from specdec.greedy import round_shapes


def _kv_text(cfg) -> str:
    return f"{cfg.n_layers} layers, {cfg.n_kv_heads} KV heads of head_dim {cfg.head_dim}, {cfg.n_heads} query heads"


@number("kv_bytes_per_token", topic="kv", notebook="01_cost_ledger", section="3. The KV cache")
def bytes_per_token(rng: random.Random) -> Number:
    cfg, (prec, nbytes) = draws.model(rng), draws.precision(rng, ("FP16", "FP8"))
    kib = ledger.kv_bytes_per_token(cfg, nbytes) / 1024
    return Number(
        f"{cfg.name}: {_kv_text(cfg)}, KV cache in {prec} ({nbytes:g} B per value). How many KiB of KV cache does one "
        "token take?",
        kib,
        f"2 (K and V) x {cfg.n_layers} layers x {cfg.n_kv_heads} KV heads x {cfg.head_dim} x {nbytes:g} B = "
        f"{kib * 1024:,.0f} B = {show(kib)} KiB."
        + (f" Grouped-query attention divides it by n_heads / n_kv_heads = {cfg.n_heads // cfg.n_kv_heads}."
           if cfg.n_kv_heads < cfg.n_heads else " (No grouped-query attention: every query head has its own K and V.)"),
        unit="KiB")


@number("kv_batch_gib", topic="kv", notebook="01_cost_ledger", section="3. The KV cache")
def batch_gib(rng: random.Random) -> Number:
    cfg = draws.model(rng)
    batch, context = rng.choice([4, 8, 16, 32, 64, 128]), rng.choice([1024, 2048, 4096, 8192, 16384, 32768])
    per_token = ledger.kv_bytes_per_token(cfg, 2)
    gib = batch * context * per_token / 2**30
    return Number(
        f"{cfg.name} ({_kv_text(cfg)}), KV in BF16, serves {batch} requests of {context:,} tokens each. How many GiB "
        "of KV cache do they hold?",
        gib,
        f"Per token: 2 x {cfg.n_layers} x {cfg.n_kv_heads} x {cfg.head_dim} x 2 B = {per_token:,.0f} B. Times {batch} x "
        f"{context:,} = {batch * context:,} tokens: {batch * context * per_token:,.0f} B = {show(gib)} GiB.",
        unit="GiB")


@number("kv_tokens_matching_weights", topic="kv", notebook="01_cost_ledger", section="3. The KV cache")
def tokens_matching_weights(rng: random.Random) -> Number:
    cfg = draws.model(rng)
    n = ledger.count_params(cfg)
    per_token = ledger.kv_bytes_per_token(cfg, 2)
    tokens = n * 2 / per_token
    return Number(
        f"{cfg.name} ({n / 1e9:.2f}B parameters; {_kv_text(cfg)}), weights and KV in BF16. A decode step reads the "
        "weights once and every cached token's K and V. At how many cached tokens (summed over the batch) do the KV "
        "reads equal the weight reads?",
        tokens,
        f"Weights: {n:,} x 2 B = {n * 2:,} B. KV per token: 2 x {cfg.n_layers} x {cfg.n_kv_heads} x {cfg.head_dim} x 2 B "
        f"= {per_token:,.0f} B. {n * 2:,} / {per_token:,.0f} = {show(tokens)} tokens; beyond that the step is mostly KV "
        "reads, which the batch does not share.",
        unit="tokens")


@number("kv_block_kib", topic="kv", notebook="11_serving",
        section="2. The block manager: lookahead slots, and freeing after a round")
def block_kib(rng: random.Random) -> Number:
    cfg, block = draws.model(rng, gqa_only=True), rng.choice([8, 16, 32])
    prec, nbytes = draws.precision(rng, ("FP16", "FP8"))
    per_token = ledger.kv_bytes_per_token(cfg, nbytes)
    kib = per_token * block / 1024
    return Number(
        f"A paged KV cache for {cfg.name} (grouped-query attention: {_kv_text(cfg)}), KV in {prec} ({nbytes:g} B per "
        f"value), blocks of {block} slots. How many KiB does one block take, over all layers?",
        kib,
        f"Per token: 2 x {cfg.n_layers} x {cfg.n_kv_heads} x {cfg.head_dim} x {nbytes:g} B = {per_token:,.0f} B (only "
        f"the {cfg.n_kv_heads} KV heads are cached, not the {cfg.n_heads} query heads); x {block} slots = "
        f"{per_token * block:,.0f} B = {show(kib)} KiB.",
        unit="KiB")


@number("kv_target_cache_after_round", topic="kv", notebook="02_greedy_verify", section="1. Walk the shapes")
def target_cache_after_round(rng: random.Random) -> Number:
    P, gamma = rng.randrange(5, 400), rng.randrange(2, 9)
    k = rng.randrange(0, gamma + 1)
    shapes = round_shapes(P, gamma, k)
    return Number(
        f"{P} tokens are committed, the target's KV cache holds {P - 1} of them. A round drafts gamma = {gamma} tokens "
        f"and accepts k = {k}. After the rollback, how many entries does the target's KV cache hold?",
        shapes.target_cache_len,
        f"The verify forward wrote the last committed token and {gamma} drafts: {P - 1} + {gamma + 1} = {P + gamma}. Keep "
        f"P + k = {P} + {k} = {shapes.target_cache_len} (the prefix and the accepted drafts); the round's own new token "
        f"has no KV yet: it is the next input. {shapes.committed_len} tokens are committed.",
        unit="entries", rel=0)


@number("kv_discarded_entries", topic="kv", notebook="05_kv_cache_engine", section="4. The rollback")
def discarded_entries(rng: random.Random) -> Number:
    P, gamma = rng.randrange(10, 500), rng.randrange(3, 9)
    k = rng.randrange(0, gamma)
    shapes = round_shapes(P, gamma, k)
    return Number(
        f"A sequence of {P} committed tokens has {P - 1} in the target's KV cache. A round with gamma = {gamma} accepts "
        f"{plural(k, 'draft')} and adds the correction. How many of the cache entries the verify forward wrote must be "
        "discarded?",
        shapes.target_discarded,
        f"The forward wrote {gamma + 1} entries (positions {P - 1}..{P + gamma - 1}), the cache then held {P + gamma}. "
        f"The sequence grows to {shapes.committed_len} tokens, of which the cache keeps all but the last, "
        f"{shapes.target_cache_len}: {P + gamma} - {shapes.target_cache_len} = {shapes.target_discarded} rejected "
        "drafts' entries go.",
        unit="entries", rel=0)


@number("kv_draft_cache_after_round", topic="kv", notebook="05_kv_cache_engine", section="4. The rollback")
def draft_cache_after_round(rng: random.Random) -> Number:
    P, gamma = rng.randrange(5, 300), rng.randrange(2, 8)
    k = gamma if rng.random() < 0.4 else rng.randrange(0, gamma)
    shapes = round_shapes(P, gamma, k)
    if k == gamma:
        why = (f"After a full acceptance it keeps all {P - 1 + gamma} (one short of the target's {P + gamma}): it never "
               f"fed its last draft, so next round it feeds that draft and the bonus first.")
    else:
        why = f"It crops to P + k = {shapes.draft_cache_len}, like the target; its pending input is the correction."
    return Number(
        f"{P} tokens are committed, the draft's cache holds {P - 1}. It drafts gamma = {gamma} tokens and the target "
        f"accepts {k}{' (all of them)' if k == gamma else ''}. After the rollback, how many entries does the draft's "
        "cache hold?",
        shapes.draft_cache_len,
        f"Drafting fed the last committed token and drafts 1..{gamma - 1} (never its own last draft): {P - 1} + {gamma} "
        f"= {P - 1 + gamma} entries. {why} Answer: {show(shapes.draft_cache_len)}.",
        unit="entries", rel=0)


@choice("kv_cache_after_rejection", topic="kv", notebook="05_kv_cache_engine", section="4. The rollback")
def cache_after_rejection(rng: random.Random) -> Choice:
    P, gamma = rng.randrange(20, 200), rng.randrange(3, 8)
    k = rng.randrange(1, gamma - 1)  # k + 1 < gamma keeps the four lengths apart
    right = f"{P + k}: the prefix and the {k} accepted drafts; the correction has no KV yet"
    return Choice(
        f"{P} tokens committed, target cache at {P - 1}; gamma = {gamma}, the target accepts {k} drafts and samples a "
        "correction. What should the target's cache length be after the round?",
        right,
        (f"{P + k + 1}: every committed token, the correction included",
         f"{P + gamma}: keep what the verify forward wrote, the next round overwrites it",
         f"{P - 1 + k}: the accepted drafts on top of the cache as it was"),
        f"The cache holds every committed token but the last: {P + k + 1} committed, so {P + k}. Keeping {P + k + 1} "
        f"would store the KV of the rejected draft at the correction's position; the correction is the next input.")
