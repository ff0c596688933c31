"""Drill templates of notebook 14: expert unions, the KV term, a draft's tensor parallelism, self-speculation,
block verification, and what changes across ranks, rollouts and disaggregation."""

from __future__ import annotations

import random

from specdec.drill.questions import Choice, Number, choice, number, show
from specdec.frontier.block import constant_model, expected_accepted, round_outcomes
from specdec.frontier.moe import expected_experts_touched
from specdec.ledger import expected_tokens_per_round

NB = "14_frontier"
MOE = "1. MoE targets: verification reads the union of experts"
LONG = "2. Long context: the KV term moves the crossover"
SELF = "3. Self-speculation: the target's first layers as the draft"
BLOCK = "4. Block verification: deciding the block jointly"
RANKS = "5. Ranks, rollouts and disaggregation"


@number("frontier_experts_union", topic="frontier", notebook=NB, section=MOE)
def experts_union(rng: random.Random) -> Number:
    experts, top_k = rng.choice([(8, 2), (16, 2), (64, 6), (64, 8), (128, 8), (256, 8)])
    gamma = rng.randrange(2, 8)
    union = expected_experts_touched(gamma + 1, top_k, experts)
    return Number(
        f"An MoE layer of {experts} experts, top {top_k}, independent uniform routing. How many distinct experts does "
        f"one row's verify step with gamma = {gamma} touch per layer, in expectation?",
        union,
        f"The step feeds gamma + 1 = {gamma + 1} tokens. One misses a given expert with probability 1 - {top_k}/{experts}, "
        f"all of them with ({1 - top_k / experts:.4g})^{gamma + 1} = {(1 - top_k / experts) ** (gamma + 1):.4f}, so the "
        f"union is {experts} x (1 - that) = {show(union)} experts per layer, against {top_k} for a decode step.",
        unit="experts", rel=0.005)


@number("frontier_verify_bytes", topic="frontier", notebook=NB, section=MOE)
def verify_bytes(rng: random.Random) -> Number:
    dense, layers = rng.choice([1.5, 2.5, 4.0, 6.0]), rng.choice([24, 32, 48, 60])
    experts, top_k, expert_m = rng.choice([(64, 8, 20), (128, 8, 10), (8, 2, 170), (64, 6, 25)])
    gamma = rng.randrange(2, 7)
    union = expected_experts_touched(gamma + 1, top_k, experts)
    gb = (dense * 1e9 + layers * union * expert_m * 1e6) * 2 / 1e9
    decode = (dense * 1e9 + layers * top_k * expert_m * 1e6) * 2 / 1e9
    return Number(
        f"An MoE target: {dense}B dense parameters, {layers} layers of {experts} experts of {expert_m}M parameters "
        f"each, top {top_k}, bf16. How many GB (10^9 bytes) does a verify step of one row with gamma = {gamma} read, "
        "under independent routing?",
        gb,
        f"{gamma + 1} tokens touch {experts} x (1 - (1 - {top_k}/{experts})^{gamma + 1}) = {union:.2f} experts per layer; "
        f"({dense}B + {layers} x {union:.2f} x {expert_m}M) x 2 bytes = {show(gb)} GB, against {decode:.4g} GB for a "
        "decode step (top_k experts per layer).",
        unit="GB", rel=0.005)


@number("frontier_kv_share", topic="frontier", notebook=NB, section=LONG)
def kv_share(rng: random.Random) -> Number:
    name, params, kv = rng.choice([("Llama-3-8B-like", 8.03, 131_072), ("Llama-3-70B-like", 70.6, 327_680),
                                   ("Llama-3.2-1B-like", 1.24, 32_768)])
    rows, context = rng.choice([1, 4, 8, 16, 32, 64]), rng.choice([4096, 8192, 32768, 131072])
    cache, weights = rows * context * kv, params * 1e9 * 2
    share = cache / (cache + weights)
    return Number(
        f"A {name} target ({params}B parameters, {kv:,} bytes of K and V per cached position, bf16) decodes {rows} "
        f"rows at {context:,} cached positions each. What fraction of the step's bytes is the KV cache?",
        share,
        f"Each row reads its own cache: {rows} x {context:,} x {kv:,} = {cache / 1e9:.4g} GB; the weights are read once "
        f"for the batch: {weights / 1e9:.4g} GB. Share: {cache / 1e9:.4g} / {(cache + weights) / 1e9:.4g} = {show(share)}.",
        rel=0.005)


@number("frontier_rows_that_fit", topic="frontier", notebook=NB, section=LONG)
def rows_that_fit(rng: random.Random) -> Number:
    name, params, kv = rng.choice([("Llama-3-8B-like", 8.03, 131_072), ("Llama-3-70B-like (one GPU's share at TP 8)",
                                    70.6 / 8, 327_680 / 8), ("Llama-3.2-3B-like", 3.21, 114_688)])
    context, hbm = rng.choice([8192, 32768, 65536, 131072]), rng.choice([80, 141])
    free = hbm * 1e9 - params * 1e9 * 2
    rows = int(free // (context * kv))
    return Number(
        f"A {name} target in bf16 ({params:.4g}B parameters on the GPU, {kv:,.0f} bytes of KV per cached position on "
        f"the GPU) on {'an' if hbm == 80 else 'a'} {hbm} GB GPU. How many rows of {context:,} cached positions fit "
        "beside the weights (no draft)?",
        rows,
        f"The weights take {params:.4g}e9 x 2 = {params * 2:.3g} GB, leaving {free / 1e9:.4g} GB; one row's cache is "
        f"{context:,} x {kv:,.0f} = {context * kv / 1e9:.4g} GB, so {free / 1e9:.4g} / {context * kv / 1e9:.4g} = "
        f"{free / (context * kv):.3g}: {rows} whole rows. A ledger cell at a larger batch describes a batch that "
        "cannot exist on this GPU.",
        unit="rows", rel=0.0)


@number("frontier_mla_queries", topic="frontier", notebook=NB, section=LONG)
def mla_queries(rng: random.Random) -> Number:
    heads = rng.choice([16, 32, 64, 128])
    latent, rope = rng.choice([(512, 64), (256, 64), (512, 32)])
    ridge = rng.choice([(295, "an H100 (989 TFLOP/s, 3.35 TB/s)")] + ([(206, "an H200 (989 TFLOP/s, 4.8 TB/s)")]
                                                                     if heads < 128 else []))
    per_query = 2 * heads * (latent + rope + latent) / ((latent + rope) * 2)
    queries = -(-ridge[0] // per_query)  # the fewest whole queries at or above the ridge
    return Number(
        f"Multi-head latent attention with the projections absorbed: {heads} heads on one GPU attend over a cached "
        f"latent of {latent} values plus {rope} RoPE values per position, in bf16. On {ridge[1]}, whose ridge is "
        f"{ridge[0]} FLOPs per byte, how many query tokens per row make a verify step's attention compute bound?",
        queries,
        f"Per query and cached position: scores over {latent + rope} dimensions and a weighted sum over {latent}, "
        f"2 x {heads} x ({latent + rope} + {latent}) = {2 * heads * (2 * latent + rope):,} FLOPs, against "
        f"{latent + rope} x 2 = {(latent + rope) * 2:,} bytes read once for the whole row: {per_query:.4g} FLOPs per "
        f"byte per query. {ridge[0]} / {per_query:.4g} = {ridge[0] / per_query:.3g}, so {queries:.0f} "
        f"quer{'y' if queries == 1 else 'ies'}. "
        "With grouped-query attention it takes dozens; with MLA, verification's attention stops being free.",
        unit="queries", rel=0.0)


@number("frontier_tp_draft_ms", topic="frontier", notebook=NB, section=RANKS)
def tp_draft_ms(rng: random.Random) -> Number:
    layers, compute = rng.choice([12, 16, 24, 32]), rng.choice([0.2, 0.3, 0.5, 0.8])
    tp, reduce_us = rng.choice([2, 4, 8]), rng.choice([10, 15, 20, 30])
    ms = compute / tp + layers * 2 * reduce_us / 1e3
    return Number(
        f"A {layers}-layer draft takes {compute} ms of compute per token on one GPU, split evenly by tensor parallelism. "
        f"At TP {tp} every layer adds two all-reduces of {reduce_us} us each. How many ms per draft token at TP {tp}?",
        ms,
        f"Compute splits {tp} ways: {compute} / {tp} = {compute / tp:.4g} ms; the all-reduces do not: {layers} x 2 x "
        f"{reduce_us} us = {layers * 2 * reduce_us / 1e3:.4g} ms. In all {show(ms)} ms "
        f"({'slower' if ms > compute else 'faster'} than {compute} ms at TP 1): a small draft at high TP is "
        "all-reduce bound.",
        unit="ms", rel=0.005)


@number("frontier_layerskip_speedup", topic="frontier", notebook=NB, section=SELF)
def layerskip_speedup(rng: random.Random) -> Number:
    layers = rng.choice([24, 32, 40])
    exit_layer = rng.choice([layers // 8, layers // 4, layers // 2])
    gamma, alpha = rng.randrange(2, 7), rng.choice([0.5, 0.6, 0.7, 0.8])
    tau = expected_tokens_per_round(alpha, gamma)
    cost = gamma * exit_layer / layers + 1
    return Number(
        f"Self-speculation drafts with the first {exit_layer} of a target's {layers} layers (and its LM head). "
        "Decoding is memory bound, so a forward costs in proportion to the layers it runs, whatever its tokens. "
        f"Drafting runs the first {exit_layer} layers once per draft (gamma forwards); verification runs the first "
        f"{exit_layer} layers on one position and the other {layers - exit_layer} on gamma + 1. With gamma = {gamma} "
        f"and alpha = {alpha} (i.i.d.), what is the speedup over target-only decoding "
        "(ignore the LM head)?",
        tau / cost,
        f"A round: {gamma} drafts at {exit_layer}/{layers} of a step each = {gamma * exit_layer / layers:.4g} steps, then "
        f"verification reads all {layers} layers once = 1 step. E({alpha}, {gamma}) = {tau:.4f} tokens per "
        f"{cost:.4g} steps: {show(tau / cost)}x.",
        unit="x", rel=0.005)


@number("frontier_block_accepted", topic="frontier", notebook=NB, section=BLOCK)
def block_accepted(rng: random.Random) -> Number:
    a, b = rng.choice([(1, 4), (1, 3), (1, 5), (2, 5)]), rng.choice([(3, 4), (2, 3), (3, 5), (4, 5)])
    p, q = (a[0] / a[1], 1 - a[0] / a[1]), (b[0] / b[1], 1 - b[0] / b[1])
    gamma = rng.choice([2, 3])
    block = expected_accepted(round_outcomes(constant_model(p), constant_model(q), (), gamma, "block"))
    token = expected_accepted(round_outcomes(constant_model(p), constant_model(q), (), gamma, "token"))
    return Number(
        f"p = ({a[0]}/{a[1]}, {a[1] - a[0]}/{a[1]}) and q = ({b[0]}/{b[1]}, {b[1] - b[0]}/{b[1]}) at every position, "
        f"gamma = {gamma}. How many drafts does block verification accept per round, in expectation?",
        block,
        f"For each drafted block (drawn from q) compute w_i = min(w_(i-1) p(x_i) / q(x_i), 1) and h_i, and average the "
        f"expected largest i with u_i < h_i: {show(block)} by enumeration (specdec.frontier.block.round_outcomes), "
        f"against {token:.4g} token-wise.",
        unit="drafts", rel=0.005)


@choice("frontier_rollout_tail", topic="frontier", notebook=NB, section=RANKS)
def rollout_tail(rng: random.Random) -> Choice:
    total, left = rng.choice([512, 1024, 2048]), rng.randrange(8, 40)
    return Choice(
        f"An RL step generates {total:,} rollouts with speculation. After a few minutes {left} long rollouts remain, and "
        "the rest of the cluster waits for them. What should happen to K?",
        f"raise it: at {left} rows the step is memory bound, drafts are nearly free, and the tail is the critical path",
        ("keep it fixed: changing K mid-batch changes the sampled tokens",
         "turn speculation off: too few rows to amortise the draft",
         "lower it to 1 to keep the verifier's output deterministic"),
        "Exact verification keeps the samples' law at any K, so K is a speed knob; a small batch is where drafting is "
        "cheapest, and the tail decides when the RL step ends.")


@choice("frontier_disagg_state", topic="frontier", notebook=NB, section=RANKS)
def disagg_state(rng: random.Random) -> Choice:
    drafter = rng.choice(["an EAGLE drafter", "an MTP module"])
    return Choice(
        f"Prefill and decode run on different instances, with {drafter}. What must reach the decode instance besides "
        "the target's KV cache?",
        "the drafter's state for the prompt (the target's hidden states it reads and its own KV), transferred or "
        "recomputed by one drafter prefill",
        ("nothing: the drafter starts from the prompt's last token",
         "the first round's drafts",
         "the target's logits for every prompt position"),
        "Feature drafters read the target's hidden states and keep their own KV; without them the first drafts are "
        "computed from nothing. Drafts are made each round on the decode side.")


@choice("frontier_relaxed_quality", topic="frontier", notebook=NB, section=RANKS)
def relaxed_quality(rng: random.Random) -> Choice:
    k = rng.choice([3, 5, 10])
    before = rng.choice([0.55, 0.62, 0.7])
    return Choice(
        f"A team switches from exact rejection sampling to \"accept if the draft is among the target's top {k}\" and "
        f"reports acceptance up from {before} to {before + 0.19:.2f}. How do you judge its quality loss?",
        "on the outputs: task accuracy, or a divergence between its samples and target-only samples on held-out prompts",
        ("by the acceptance rate: higher acceptance means the drafts agree with the target",
         "there is none: the target verifies every token",
         "by the speedup"),
        "A relaxed rule is no longer exact in distribution: it accepts what exact verification would reject, so "
        "acceptance rises by construction and cannot measure what was lost.")
