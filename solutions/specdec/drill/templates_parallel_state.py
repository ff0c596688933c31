"""Drill templates of notebook 15: parallel drafting's best gamma and its training tokens, a hybrid target's
recurrent-state memory and rollback, and acceptance after the target moves."""

from __future__ import annotations

import random

from specdec.chain import expected_committed_length
from specdec.drill.questions import Choice, Number, choice, number, show
from specdec.ledger import expected_tokens_per_round
from specdec.questions2026.ledger import best_gamma_by_position

NB = "15_parallel_state_drift"
PARALLEL = "1. Parallel drafting: gamma drafts in one forward"
STATE = "2. Targets with state: rolling back a recurrent layer"
LIFE = "3. A drafter across its target's life"


@number("parallel_best_gamma", topic="parallel", notebook=NB, section=PARALLEL)
def parallel_best_gamma(rng: random.Random) -> Number:
    while True:
        first, drop = rng.choice([0.85, 0.9, 0.95]), rng.choice([0.1, 0.12, 0.15])
        alphas = tuple(round(max(first - drop * k, 0.05), 2) for k in range(6))
        one_pass, per_position = rng.choice([0.05, 0.1, 0.15]), rng.choice([0.02, 0.05, 0.08])
        speedups = [expected_committed_length(alphas[:g]) / (one_pass + 1 + per_position * g) for g in range(1, 7)]
        ranked = sorted(speedups, reverse=True)
        if ranked[0] - ranked[1] > 0.01:  # a clear best: no question decided by rounding
            break
    gamma, _ = best_gamma_by_position(alphas, lambda g: one_pass, lambda g: 1 + per_position * g)
    return Number(
        f"A parallel drafter's alphas by position (alpha_k = P(draft k accepted | drafts 1..k-1 accepted)) are "
        f"{', '.join(map(str, alphas))}. Its one pass costs {one_pass} "
        f"of a target step whatever gamma; verifying gamma + 1 positions costs 1 + {per_position} gamma steps. Which "
        "gamma (1 to 6) gives the highest speedup?",
        gamma,
        "Speedup(g) = E_g / (pass + verify(g)), E_g = 1 + alpha_1 + alpha_1 alpha_2 + ...: "
        + ", ".join(f"{s:.3f}" for s in speedups) + f" for gamma 1..6, so gamma {gamma}.",
        unit="", rel=0.0)


@number("parallel_cod_tokens", topic="parallel", notebook=NB, section=PARALLEL)
def cod_tokens(rng: random.Random) -> Number:
    length, k = rng.choice([256, 512, 1024, 2048]), rng.choice([4, 6, 8, 12])
    ratio, floor = rng.choice([0.6, 0.7, 0.8]), rng.choice([0.1, 0.2])
    blocks = [int(length * max(ratio ** i, floor)) for i in range(1, k)]
    total = length + sum(blocks)
    return Number(
        f"A PARD training sample of {length:,} real tokens trains chains for K = {k} ({k - 1} mask blocks). Block i "
        f"keeps int({length} x max({ratio}^i, {floor})) masks. How many tokens does the training sequence hold, real "
        "tokens included?",
        total,
        f"{length:,} real + " + " + ".join(map(str, blocks)) + f" masks = {show(total)}, against {length * k:,} with "
        "every chain kept.",
        unit="tokens", rel=0.005)


@number("hybrid_state_gb", topic="parallel", notebook=NB, section=STATE)
def state_gb(rng: random.Random) -> Number:
    layers, heads, dk = rng.choice([(36, 32, 128), (24, 16, 128), (48, 32, 64), (54, 64, 64)])
    rows, gamma = rng.choice([8, 16, 32, 64, 128]), rng.randrange(2, 8)
    gb = rows * layers * (gamma + 1) * heads * dk * dk * 2 / 1e9
    return Number(
        f"A hybrid target has {layers} recurrent layers, each with {heads} heads of {dk} x {dk} state in bf16. It "
        f"serves {rows} rows with gamma = {gamma}, keeping one state per fed position. How many GB (10^9 bytes) do those "
        "per-position states take (count only them)?",
        gb,
        f"gamma + 1 = {gamma + 1} states per row and layer, each {heads} x {dk} x {dk} x 2 bytes = "
        f"{heads * dk * dk * 2 / 1e6:.3g} MB: {rows} x {layers} x {gamma + 1} x that = {show(gb)} GB (a checkpoint "
        f"and recomputation keep 2 per row and layer instead).",
        unit="GB", rel=0.005)


@number("drift_tau_after", topic="parallel", notebook=NB, section=LIFE)
def tau_after(rng: random.Random) -> Number:
    before, after = rng.choice([(0.8, 0.6), (0.85, 0.55), (0.75, 0.5), (0.9, 0.7)])
    gamma = rng.randrange(3, 8)
    tau = expected_tokens_per_round(after, gamma)
    return Number(
        f"A draft accepted at alpha = {before} (i.i.d.) with gamma = {gamma}. After the target's update alpha falls to "
        f"{after}. How many tokens per round does it commit now, in expectation?",
        tau,
        f"(1 - alpha^(gamma + 1)) / (1 - alpha) = (1 - {after}^{gamma + 1}) / {1 - after:.2g} = {show(tau)}, down from "
        f"{expected_tokens_per_round(before, gamma):.4g}.",
        unit="tokens", rel=0.005)


@choice("hybrid_which_state", topic="parallel", notebook=NB, section=STATE)
def which_state(rng: random.Random) -> Choice:
    gamma = rng.randrange(3, 8)
    k = rng.randrange(1, gamma)
    return Choice(
        f"A hybrid target verifies the last committed token and {gamma} drafts; the round accepts {k}. Which "
        "recurrent state must the next round start from?",
        f"the state after draft {k}",
        (f"the state after draft {gamma}", "the state after the correction token",
         "the state from before the round, with nothing re-fed"),
        f"The next round feeds the correction token, so it continues from the state after the last committed token "
        f"and the {k} accepted drafts: fed position {k}. Later states have read rejected drafts; the one from before "
        "the round needs the accepted tokens re-fed.")


@choice("parallel_mask_sees", topic="parallel", notebook=NB, section=PARALLEL)
def mask_sees(rng: random.Random) -> Choice:
    depth, position = rng.randrange(2, 5), rng.randrange(8, 30)
    anchor = position - depth
    return Choice(
        f"In a parallel drafter's training sequence, what may the depth-{depth} mask at position {position} attend to?",
        f"the real tokens at positions 0..{anchor}, its chain's masks at positions {anchor + 1}..{position - 1}, and "
        "itself",
        ("every real token and every mask before it in the sequence", f"the real tokens at positions 0..{position}",
         "only itself, so that it learns without context"),
        f"Its anchor is position - depth = {anchor}: at inference it sees the prefix up to there, then its chain's "
        "masks under a causal mask. Later real tokens are the answers its chain predicts.")
