"""Drill templates of notebook 11: lookahead slots, blocks freed after a round, the slot mapping, gamma by batch."""

from __future__ import annotations

import random

from specdec.drill.questions import Choice, Number, choice, number, plural, show
from specdec.ledger import expected_tokens_per_round
from specdec.serving.adaptive import StepCosts, choose_gamma
from specdec.serving.blocks import blocks_for, release_slots, reserve_slots, slot_mapping

NB = "11_serving"
BLOCKS = "2. The block manager: lookahead slots, and freeing after a round"


@number("serving_lookahead_blocks", topic="serving", notebook=NB, section=BLOCKS)
def lookahead_blocks(rng: random.Random) -> Number:
    while True:  # only numbers where the lookahead slots need another block: the point of the question
        block, gamma = rng.choice([8, 16, 32]), rng.randrange(2, 9)
        cached = rng.randrange(block, 12 * block)
        if blocks_for(cached + 1 + gamma, block) > blocks_for(cached + 1, block):
            break
    table: list[int] = []
    reserve_slots(list(range(100)), table, cached + 1 + gamma, block)
    without = blocks_for(cached + 1, block)
    return Number(
        f"A decoding request verifies gamma = {gamma} drafts; block size {block}; its cache holds {cached} tokens. How "
        "many blocks must its table hold before the verify forward?",
        len(table),
        f"The forward writes its last token and {gamma} drafts at positions {cached}..{cached + gamma}: "
        f"{cached} + 1 + {gamma} = {cached + 1 + gamma} slots, ceil({cached + 1 + gamma} / {block}) = {show(len(table))} "
        f"blocks. Without the lookahead slots the table would have {without}, and the verify forward would write "
        "its last drafts into a block the request does not own.",
        unit="blocks", rel=0)


@number("serving_blocks_freed", topic="serving", notebook=NB, section=BLOCKS)
def blocks_freed(rng: random.Random) -> Number:
    while True:
        block, gamma = rng.choice([4, 8, 16]), rng.randrange(3, 9)
        P = rng.randrange(block, 10 * block)
        k = rng.randrange(0, gamma)
        free = list(range(100))
        table: list[int] = []
        reserve_slots(free, table, P + gamma, block)  # P - 1 cached + the last token + gamma drafts
        held = len(table)
        release_slots(free, table, P + k, block)
        if held - len(table) > 0:
            break
    return Number(
        f"Block size {block}. A row starts a round with {P} committed tokens ({P - 1} in the cache), reserves slots for "
        f"its last token and gamma = {gamma} drafts, and the target accepts {k}. How many blocks go back to the pool "
        "after the round?",
        held - len(table),
        f"Reserved: {P - 1} + 1 + {gamma} = {P + gamma} slots, {held} blocks. Kept: the cache's valid P + k = {P + k} "
        f"slots, ceil({P + k} / {block}) = {len(table)} blocks. Freed: {held} - {len(table)} = {show(held - len(table))}.",
        unit="blocks", rel=0)


@number("serving_slot_of_position", topic="serving", notebook=NB, section="3. The slot mapping of a ragged batch")
def slot_of_position(rng: random.Random) -> Number:
    block = rng.choice([4, 8, 16])
    table = rng.sample(range(1, 64), rng.randrange(3, 7))
    start = rng.randrange(0, (len(table) - 1) * block)
    count = rng.randrange(1, min(6, len(table) * block - start) + 1)
    slots = slot_mapping([table], [start], [count], block).tolist()
    i = rng.randrange(count)
    pos = start + i
    return Number(
        f"Block size {block}; a request's block table is {table}. Its cache holds {start} tokens and this step it feeds "
        f"{plural(count, 'new token')}. Into which pool slot does the token at position {pos} write its K and V?",
        slots[i],
        f"Position {pos} is in table entry {pos} // {block} = {pos // block} (block {table[pos // block]}) at offset "
        f"{pos} % {block} = {pos % block}: slot {table[pos // block]} x {block} + {pos % block} = {show(slots[i])}.",
        unit="", rel=0)


@number("serving_choose_gamma", topic="serving", notebook=NB, section="7. When speculation stops paying")
def gamma_for_batch(rng: random.Random) -> Number:
    while True:
        alpha, batch = round(rng.uniform(0.6, 0.92), 2), rng.choice([1, 2, 4, 8, 16, 32])
        base_ms, per_token_ms = round(rng.uniform(8, 30), 1), round(rng.uniform(0.02, 0.4), 2)
        draft_ms = round(rng.uniform(0.3, 3.0), 1)
        step = StepCosts([1, 2000], [(base_ms + per_token_ms) / 1e3, (base_ms + 2000 * per_token_ms) / 1e3])
        best = choose_gamma(alpha, batch, step, lambda n: draft_ms / 1e3, 8)
        rate = {g: batch * expected_tokens_per_round(alpha, g) / (g * draft_ms + base_ms + per_token_ms * batch * (g + 1))
                for g in range(9)}
        if best >= 1 and all(rate[best] > v * 1.01 for g, v in rate.items() if g != best):
            break
    around = ", ".join(f"{g}: {rate[g] * 1e3:,.0f}" for g in range(max(0, best - 1), min(8, best + 1) + 1))
    return Number(
        f"A target forward over n tokens costs {base_ms} + {per_token_ms} n ms; a draft forward over the batch "
        f"{draft_ms} ms; alpha = {alpha}; {batch} decoding rows. Which gamma (0 = off, up to 8) maximises tokens per "
        "second?",
        best,
        f"tokens/s(gamma) = B E(alpha, gamma) / (gamma x {draft_ms} + {base_ms} + {per_token_ms} x B (gamma + 1)) ms: "
        f"{around} tokens/s around the best, so gamma = {show(best)}. The bigger the batch, the more each extra "
        "position costs, and the shorter the best draft.",
        unit="drafts", rel=0)


@choice("serving_what_breaks_first", topic="serving", notebook=NB, section="7. When speculation stops paying")
def what_breaks_first(rng: random.Random) -> Choice:
    gamma = rng.randrange(3, 7)
    return Choice(
        f"A server runs a fixed gamma = {gamma} with short contexts. As the batch grows from 1 to a few hundred, which "
        "assumption of the batch-1 cost model breaks first?",
        f"that the verify forward is memory bound: it carries B x {gamma + 1} tokens, turns compute bound, and every "
        "draft position starts to cost like a real token",
        ("that acceptance is independent of the batch: alpha falls as more requests share a step",
         "that rollback is free: cropping B caches after each round copies their KV",
         "that the draft is cheap: its cost per token grows faster with the batch than the target's"),
        "Acceptance depends on the models and the text, not on the batch; rollback is bookkeeping (a length or a "
        "counter); the draft reads fewer weights than the target at any batch. The verify forward is what loses its "
        "free positions as the batch fills the GPU's compute (notebook 01's roofline), so servers shrink gamma or "
        "turn speculation off under load.")
