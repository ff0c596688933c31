"""Drill templates of notebook 01, the cost ledger: bytes, floors, E(alpha, gamma), speedup, gamma, batching."""

from __future__ import annotations

import random

from specdec import ledger
from specdec.drill import draws
from specdec.drill.questions import Number, number, show
from specdec.tables import ModelConfig

NB = "01_cost_ledger"
SIZE = "1. How big is the model?"
FLOOR = "2. Decode at batch 1 is memory bound"
ROUND = "4. How many tokens does a round commit?"
SPEEDUP = "5. The speedup"
GAMMA = "6. Choosing the draft length"
BATCH = "7. When it stops paying: batching"


def _alpha(rng: random.Random, lo: float = 0.5, hi: float = 0.95) -> float:
    return round(rng.uniform(lo, hi), 2)


def _config_text(cfg: ModelConfig) -> str:
    tied = "tied to the embedding" if cfg.tied_embeddings else "untied"
    return (f"vocab {cfg.vocab_size:,}, d_model {cfg.d_model:,}, {cfg.n_layers} layers, {cfg.n_heads} query heads, "
            f"{cfg.n_kv_heads} KV heads, FFN {cfg.d_ff:,} (SwiGLU), LM head {tied}")


@number("ledger_param_count", topic="ledger", notebook=NB, section=SIZE)
def param_count(rng: random.Random) -> Number:
    d_model = rng.choice([1536, 2048, 2560, 3072, 4096, 5120])
    n_heads = d_model // 128
    n_kv = rng.choice([h for h in (n_heads, 8, 4, 2) if n_heads % h == 0])
    cfg = ModelConfig("drawn", vocab_size=rng.choice([32_000, 50_304, 128_256]), d_model=d_model,
                      n_layers=rng.randrange(12, 49), n_heads=n_heads, n_kv_heads=n_kv,
                      d_ff=256 * round(d_model * rng.uniform(2.5, 3.5) / 256), tied_embeddings=rng.random() < 0.3)
    n = ledger.count_params(cfg)
    hd, d = cfg.head_dim, cfg.d_model
    attention = 2 * d * n_heads * hd + 2 * d * n_kv * hd
    mlp, norms = 3 * d * cfg.d_ff, 2 * d
    head = 0 if cfg.tied_embeddings else cfg.vocab_size * d
    return Number(
        f"A Llama-style decoder (RMSNorm, rotary positions, no biases): {_config_text(cfg)}. How many parameters "
        "does it have, in billions?",
        n / 1e9,
        f"head_dim = {d} / {n_heads} = {hd}. Per layer: attention 2 x {d} x {n_heads * hd} (q, o) + 2 x {d} x "
        f"{n_kv * hd} (k, v) = {attention:,}; MLP 3 x {d} x {cfg.d_ff} = {mlp:,}; two norms {norms:,}; that is "
        f"{attention + mlp + norms:,} x {cfg.n_layers} layers. Plus the embedding {cfg.vocab_size * d:,}, the final "
        f"norm {d:,} and the LM head {head:,}: {n:,} parameters = {show(n / 1e9)} B.",
        unit="billion parameters")


@number("ledger_weight_gb", topic="ledger", notebook=NB, section=SIZE)
def weight_gb(rng: random.Random) -> Number:
    cfg, (prec, nbytes) = draws.model(rng), draws.precision(rng)
    n = ledger.count_params(cfg)
    gb = n * nbytes / 1e9
    return Number(
        f"{cfg.name} ({_config_text(cfg)}) stored in {prec} ({nbytes:g} B per parameter): how many GB (1e9 bytes) "
        "of weights does one decode step read?",
        gb,
        f"count_params gives {n:,} parameters; x {nbytes:g} B = {show(gb)} GB, all of it read once per decode step "
        "(notebook 01's floor: the embedding table, only gathered a row at a time, is counted in full; it is a few "
        "percent).",
        unit="GB")


@number("ledger_step_floor_ms", topic="ledger", notebook=NB, section=FLOOR)
def step_floor_ms(rng: random.Random) -> Number:
    cfg, gpu, (prec, nbytes) = draws.model(rng), draws.gpu(rng), draws.precision(rng, ("FP16", "FP8"))
    n = ledger.count_params(cfg)
    ms = ledger.decode_step_floor_s(n, nbytes, gpu.bandwidth) * 1e3
    return Number(
        f"{cfg.name} ({n / 1e9:.2f}B parameters) in {prec} ({nbytes:g} B per parameter) on one {gpu.name} "
        f"({gpu.bandwidth / 1e12:g} TB/s): the lower bound on one batch-1 decode step, in milliseconds?",
        ms,
        f"Each step reads every weight once: {n:,} x {nbytes:g} B / {gpu.bandwidth:.4g} B/s = {show(ms)} ms "
        "(the compute, about 1 FLOP per byte, hides under the reads).",
        unit="ms")


@number("ledger_tokens_per_s_cap", topic="ledger", notebook=NB, section=FLOOR)
def tokens_cap(rng: random.Random) -> Number:
    cfg, gpu = draws.model(rng), draws.gpu(rng)
    n = ledger.count_params(cfg)
    cap = ledger.tokens_per_s_cap(n, 2, gpu.bandwidth)
    return Number(
        f"{cfg.name} ({n / 1e9:.2f}B parameters) in BF16 on one {gpu.name} ({gpu.bandwidth / 1e12:g} TB/s) at batch 1: "
        "the most tokens per second plain decoding can reach from weight reads alone?",
        cap,
        f"Floor per token = {n:,} x 2 B / {gpu.bandwidth:.4g} B/s = {n * 2 / gpu.bandwidth * 1e3:.4g} ms; the cap is its "
        f"inverse, {show(cap)} tokens/s.",
        unit="tokens/s")


@number("ledger_expected_tokens", topic="ledger", notebook=NB, section=ROUND)
def expected_tokens(rng: random.Random) -> Number:
    a, gamma = _alpha(rng), rng.randrange(2, 11)
    e = ledger.expected_tokens_per_round(a, gamma)
    return Number(
        f"Each draft is accepted with probability a = {a} given the earlier ones were; gamma = {gamma} drafts per round. "
        "Expected tokens committed per round (the target's own token included)?",
        e,
        f"E = (1 - a^(gamma+1)) / (1 - a) = (1 - {a}^{gamma + 1}) / {1 - a:.2f} = {show(e)}: draft i survives with "
        "a^i, and the correction or bonus token always comes.",
        unit="tokens")


@number("ledger_speedup", topic="ledger", notebook=NB, section=SPEEDUP)
def speedup(rng: random.Random) -> Number:
    a, gamma, c = _alpha(rng, 0.6, 0.95), rng.randrange(2, 9), round(rng.uniform(0.01, 0.25), 2)
    e, s = ledger.expected_tokens_per_round(a, gamma), ledger.speedup(a, gamma, c)
    return Number(
        f"a = {a}, gamma = {gamma}, draft cost ratio c = {c} (a draft step over a target step), verification costing "
        "one target step. The ideal speedup over plain decoding?",
        s,
        f"E = (1 - {a}^{gamma + 1}) / (1 - {a}) = {e:.4g} tokens per round; a round costs 1 + gamma c = 1 + {gamma} x {c} = "
        f"{1 + gamma * c:.4g} target steps; S = {e:.4g} / {1 + gamma * c:.4g} = {show(s)}x.",
        unit="x")


@number("ledger_best_gamma", topic="ledger", notebook=NB, section=GAMMA)
def best_gamma(rng: random.Random) -> Number:
    while True:
        a, c = _alpha(rng, 0.6, 0.95), round(rng.uniform(0.02, 0.25), 2)
        g = ledger.best_gamma(a, c)
        s = {k: ledger.speedup(a, k, c) for k in (g - 1, g, g + 1) if k >= 1}
        if g < 20 and all(s[g] > v * 1.002 for k, v in s.items() if k != g):
            break
    around = ", ".join(f"S({k}) = {v:.4f}" for k, v in s.items())
    return Number(
        f"a = {a}, c = {c}. Which draft length gamma (1 to 32) gives the highest ideal speedup E(a, gamma) / "
        "(1 + gamma c)?",
        g,
        f"S rises while one more draft adds a^(gamma+1) tokens worth more than its cost c, then falls: {around}, so "
        f"gamma = {g}.",
        unit="drafts", rel=0)


@number("ledger_acceptance_for_speedup", topic="ledger", notebook=NB, section=SPEEDUP)
def acceptance_for_speedup(rng: random.Random) -> Number:
    while True:
        gamma, c, target = rng.randrange(3, 9), round(rng.uniform(0.02, 0.15), 2), round(rng.uniform(1.5, 3.0), 1)
        if ledger.speedup(0.99, gamma, c) > target:
            break
    a = ledger.acceptance_for_speedup(target, gamma, c)
    return Number(
        f"gamma = {gamma}, c = {c}. What per-position acceptance a does an ideal speedup of {target}x need?",
        a,
        f"Solve E(a, {gamma}) / (1 + {gamma} x {c}) = {target}, i.e. E(a, {gamma}) = {target * (1 + gamma * c):.4g}; E "
        f"grows with a, so bisect: a = {show(a)} (check: S = {ledger.speedup(a, gamma, c):.4g}).",
        unit="")


@number("ledger_ridge_batch", topic="ledger", notebook=NB, section=BATCH)
def ridge_batch(rng: random.Random) -> Number:
    gpu, gamma = draws.gpu(rng), rng.randrange(2, 9)
    n_star = gpu.ridge_point * 2 / 2  # tokens per forward at which BF16 weights' FLOPs / byte reach the ridge
    batch = n_star / (gamma + 1)
    return Number(
        f"A BF16 target on a {gpu.name} ({gpu.bf16_flops / 1e12:g} TFLOP/s dense BF16, {gpu.bandwidth / 1e12:g} TB/s), "
        f"gamma = {gamma}. Under the roofline model (weights only), at what batch size does the verify forward stop "
        "being memory bound?",
        batch,
        f"Ridge point = {gpu.bf16_flops:.4g} / {gpu.bandwidth:.4g} = {gpu.ridge_point:.4g} FLOP/byte. A forward over n "
        f"tokens does 2 FLOPs per parameter per token over 2 bytes per parameter: n FLOP/byte, so it turns compute "
        f"bound at n = {n_star:.4g} tokens. The verify forward carries B (gamma + 1) = {gamma + 1} B tokens: B = "
        f"{n_star:.4g} / {gamma + 1} = {show(batch)}.",
        unit="sequences")


def _last_paying_batch(a: float, gamma: int, c: float, n_params: int, gpu) -> int:
    """The largest batch at which ledger.speedup_at_batch is still >= 1 (it falls with the batch)."""
    def pays(b: int) -> bool:
        return ledger.speedup_at_batch(a, gamma, c, b, n_params, 2, gpu.bandwidth, gpu.bf16_flops) >= 1

    lo, hi = 1, 1
    while pays(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return lo


@number("ledger_crossover_batch", topic="ledger", notebook=NB, section=BATCH)
def crossover_batch(rng: random.Random) -> Number:
    while True:
        cfg, gpu = draws.model(rng), draws.gpu(rng)
        a, gamma, c = _alpha(rng, 0.7, 0.95), rng.randrange(2, 7), round(rng.uniform(0.02, 0.12), 2)
        n = ledger.count_params(cfg)
        if ledger.speedup(a, gamma, c) < 1.2:
            continue
        batch = _last_paying_batch(a, gamma, c, n, gpu)
        if batch >= 60:
            break
    e = ledger.expected_tokens_per_round(a, gamma)
    n_star = gpu.ridge_point
    return Number(
        f"{cfg.name} in BF16 on a {gpu.name} ({gpu.bf16_flops / 1e12:g} TFLOP/s, {gpu.bandwidth / 1e12:g} TB/s); a draft "
        f"c = {c} times its size, a = {a}, gamma = {gamma}. Under notebook 01's roofline model (weights only, peak "
        "FLOP/s), what is the largest batch at which speculation is still at least as fast as plain decoding?",
        batch,
        f"A forward turns compute bound at n* = ridge point x 2 bytes / 2 = {n_star:.4g} tokens. While B < n*, plain "
        f"decoding costs one weight read T per step, the draft c T per step, and the verify forward max(T, B (gamma + 1) "
        f"/ n* x T). E = {e:.4g}, so S = E / (gamma c + B (gamma + 1) / n*) = 1 at B = n* (E - gamma c) / (gamma + 1) = "
        f"{n_star:.4g} x ({e:.4g} - {gamma * c:.4g}) / {gamma + 1} = {n_star * (e - gamma * c) / (gamma + 1):.4g}: the "
        f"last batch that pays is {show(batch)} (an upper bound: attention and KV reads make real reversals come "
        "earlier).",
        unit="sequences", rel=0.02)
