"""Drill templates of notebook 13: prefix caching, grammars, suffix decoding, K per batch size, CUDA-graph padding."""

from __future__ import annotations

import random

from specdec.drill.questions import Choice, Number, choice, number, show
from specdec.production.grammar import Grammar, Matcher, speculative_masks
from specdec.production.knobs import k_schedule
from specdec.production.suffix import SuffixTree, propose_from_tree
from specdec.serving.prefix_cache import PrefixCache, match_prefix, publish_blocks

NB = "13_production"
PREFIX = "1. Prefix caching with speculation"
#: CUDA-graph capture sizes (tokens per forward), as in notebook 13's drill.
CAPTURE_SIZES = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@number("production_published_blocks", topic="production", notebook=NB, section=PREFIX)
def published_blocks(rng: random.Random) -> Number:
    block, gamma = rng.choice([4, 8, 16]), rng.randrange(3, 9)
    P = rng.randrange(2 * block, 12 * block)
    k = rng.randrange(0, gamma + 1)
    tokens = [rng.randrange(1, 200) for _ in range(P + k + 1)]  # committed after the round
    cache = PrefixCache()
    publish_blocks(cache, tokens, list(range(100, 130)), P + k, block)
    published = len(cache.key_of)
    return Number(
        f"Block size {block}. Before a round a row holds {P} committed tokens, the K and V of the first {P - 1} in the "
        f"cache. The round drafts K = {gamma}, the verify forward writes positions {P - 1}..{P - 1 + gamma}, and "
        f"verification accepts {k} drafts and adds {'a bonus' if k == gamma else 'a correction'}. After the round, how "
        "many of the row's blocks may the prefix cache hold?",
        published,
        f"After the round {P + k + 1} tokens are committed and the cache holds verified K and V for {P + k} of them "
        f"(positions 0..{P + k - 1}); only full blocks of verified tokens are published: {P + k} // {block} = "
        f"{show(published)}. The rest of the last block, and any block of rejected drafts' lookahead slots, stays out.",
        unit="blocks", rel=0)


@number("production_prefill_tokens", topic="production", notebook=NB, section=PREFIX)
def prefill_tokens(rng: random.Random) -> Number:
    block = rng.choice([8, 16, 32])
    prompt, generated, new = rng.randrange(60, 400), rng.randrange(10, 120), rng.randrange(5, 80)
    turn1 = [rng.randrange(1, 200) for _ in range(prompt + generated)]
    turn2 = turn1 + [rng.randrange(1, 200) for _ in range(new)]
    cache = PrefixCache()
    publish_blocks(cache, turn1, list(range(1000)), len(turn1) - 1, block)
    hit = match_prefix(cache, turn2, block)
    computed = len(turn2) - len(hit) * block
    return Number(
        f"Block size {block}, prefix caching on. An agent's turn 1 ({prompt}-token prompt, {generated} tokens generated) "
        f"has finished: {len(turn1)} tokens, the K and V of the first {len(turn1) - 1} in the cache, every full block of "
        f"them published. Turn 2 resends all {len(turn1)} tokens and appends {new}. How many prompt tokens does turn 2's "
        "prefill compute?",
        computed,
        f"Turn 1 published {len(turn1) - 1} // {block} = {(len(turn1) - 1) // block} blocks ({len(hit) * block} tokens); "
        f"turn 2's {len(turn2)} tokens hit all of them (at least the last token is always computed), so the prefill "
        f"computes {len(turn2)} - {len(hit) * block} = {show(computed)} tokens.",
        unit="tokens", rel=0)


@number("production_k_at_batch", topic="production", notebook=NB, section="4. The knobs: a draft length per batch size")
def k_at_batch(rng: random.Random) -> Number:
    while True:
        batch = rng.choice([8, 16, 32, 64])
        base = rng.randrange(15, 40)
        itl = {0: base}
        for k in range(1, 5):
            itl[k] = itl[k - 1] + rng.randrange(2, 8)
        rates = sorted((round(rng.uniform(0.25, 0.9), 2) for _ in range(4)), reverse=True)
        best = k_schedule({batch: {k: v / 1e3 for k, v in itl.items()}}, rates)[batch]
        goodput = {k: (1 + sum(rates[:k])) / itl[k] for k in itl}
        if best >= 1 and all(goodput[best] > v * 1.01 for k, v in goodput.items() if k != best):
            break
    table = ", ".join(f"K = {k}: {1 + sum(rates[:k]):.2f} / {itl[k]} = {goodput[k]:.4f}" for k in itl)
    return Number(
        f"A profile at batch {batch}: step time by K = 0..4 is {list(itl.values())} ms, and the per-position acceptance "
        f"rates (vLLM's acceptance_rates: accepted at position i over rounds) are {rates}. Which K does the schedule "
        "hold for this batch size?",
        best,
        f"tau(K) = 1 + rates[0] + ... + rates[K-1] (unconditional rates add), goodput = tau / step time: {table} tokens "
        f"per ms, so K = {show(best)}.",
        unit="drafts", rel=0)


@number("production_padded_tokens", topic="production", notebook=NB,
        section="4. The knobs: a draft length per batch size")
def padded_tokens(rng: random.Random) -> Number:
    while True:
        requests, k = rng.randrange(3, 60), rng.randrange(1, 6)
        tokens = requests * (1 + k)
        if tokens <= CAPTURE_SIZES[-1] and tokens not in CAPTURE_SIZES:
            break
    size = min(s for s in CAPTURE_SIZES if s >= tokens)
    return Number(
        f"An engine captured CUDA graphs for forwards of {', '.join(map(str, CAPTURE_SIZES))} tokens and pads a uniform "
        f"decode batch up to the next captured size. A decode step serves {requests} requests with K = {k}. How many "
        "of the forward's tokens are padding (not the padded size: the padding alone)?",
        size - tokens,
        f"Each request carries 1 + K = {1 + k} tokens: {requests} x {1 + k} = {tokens}; the next captured size is {size}, "
        f"so {size} - {tokens} = {show(size - tokens)} padded tokens run through the graph for nothing.",
        unit="tokens", rel=0)


def _suffix_tree(rng: random.Random, match: int, counts: list[int]) -> tuple[SuffixTree, list[int]]:
    """A tree in which the context (``match`` distinct tokens) was followed ``counts[0]`` times, and the path below it
    ``counts[j]`` times at depth j: document i runs along the path as far as ``counts`` allows, then ends."""
    context = list(range(1, match + 1))
    path = list(range(100, 100 + len(counts)))
    tree = SuffixTree(depth=match + len(counts) + 2)
    for i in range(counts[0]):
        reach = sum(c > i for c in counts[1:])
        tree.extend(("doc", i), context + path[:reach])
    return tree, context


@number("production_suffix_drafts", topic="production", notebook=NB, section="3. Suffix decoding")
def suffix_drafts(rng: random.Random) -> Number:
    while True:
        match, factor = rng.randrange(2, 9), rng.choice([1.0, 1.5, 2.0])
        max_drafts, min_prob = rng.choice([8, 16]), rng.choice([0.1, 0.2, 0.3])
        counts = [rng.randrange(20, 60)]
        for _ in range(rng.randrange(4, 12)):
            counts.append(max(1, counts[-1] - rng.choice([0, 0, 1, 2, 3, 5, 8])))
        tree, context = _suffix_tree(rng, match, counts)
        drafts, prob = propose_from_tree(tree, context, max_drafts, factor, min_prob)
        if drafts:
            break
    cap = min(max_drafts, int(factor * match))
    walk = ", ".join(f"{b}/{a}" for a, b in zip(counts, counts[1:]))
    return Number(
        f"Suffix decoding: the longest match is {match} tokens; factor {factor}, max_drafts {max_drafts}, min_prob "
        f"{min_prob}. The matched node was seen {counts[0]} times, and down the most frequent path the counts are "
        f"{counts[1:]} (then a leaf). How many drafts does it propose?",
        len(drafts),
        f"The cap is min(max_drafts, int(factor x match)) = min({max_drafts}, int({factor} x {match})) = {cap}. Each step "
        f"multiplies the estimate by child / parent ({walk}) and stops before it would fall below {min_prob}, at a "
        f"leaf, or at the cap: {show(len(drafts))} drafts, estimate {prob:.3f}.",
        unit="drafts", rel=0)


#: Grammars for the mask question: (pattern, a text it accepts, bytes it never allows).
GRAMMARS = ((r"\d+(,\d+)*", "12,345,6789,10", "x;. "),
            (r"[a-z_]+\(\d*\)", "load_file(42)", "+-? "),
            (r"(yes|no)(, (yes|no))*", "yes, no, no, yes", "YQ1."))


@number("production_grammar_mask_rows", topic="production", notebook=NB, section="2. Grammar-constrained speculation")
def grammar_mask_rows(rng: random.Random) -> Number:
    pattern, valid, bad = rng.choice(GRAMMARS)
    gamma = rng.randrange(3, 8)
    committed = rng.randrange(0, 4)
    drafts = list(valid[committed:committed + gamma])
    if rng.random() < 0.75:
        drafts[rng.randrange(len(drafts))] = rng.choice(bad)
    matcher = Matcher(Grammar(pattern))
    matcher.accept(list(valid[:committed].encode()))
    n, masks = speculative_masks(matcher, list("".join(drafts).encode()))
    if n < len(drafts):
        why = (f"the first {n} drafts are allowed, draft {n + 1} ({drafts[n]!r}) is forbidden. Drafts after it are cut; "
               "the forbidden one stays as a certain rejection (its masked p is 0), so the correction comes from the "
               f"masked residual: one row per allowed draft and one for that position, {show(masks.shape[0])}")
    else:
        why = (f"all {n} drafts are allowed, so the verifier needs a row per draft and one for the bonus position: "
               f"{show(masks.shape[0])}")
    return Number(
        f"A request decodes under the grammar /{pattern}/ (a regular expression over bytes) and has committed "
        f"{valid[:committed]!r} so far. The drafter proposes the {len(drafts)} bytes {''.join(drafts)!r}. How many "
        "rows of masks does the verifier need (each verified position is scored under its own mask)?",
        masks.shape[0],
        f"The matcher walks the drafts from the committed state: {why}. Then it rolls back to the last committed "
        "token: nothing is committed until the target has verified.",
        unit="rows", rel=0)


@choice("production_lookahead_block", topic="production", notebook=NB, section=PREFIX)
def lookahead_block(rng: random.Random) -> Choice:
    block = rng.choice([8, 16, 32])
    verified = rng.randrange(1, block)
    return Choice(
        f"Block size {block}. After a round, one of a row's blocks has every slot written: {verified} hold verified "
        f"tokens' K and V, {block - verified} hold rejected drafts'. May the prefix cache publish it?",
        "no: only blocks full of verified tokens' K and V are published",
        ("yes: the target computed every slot, so the block is valid",
         "yes, keyed by the drafted tokens, since a later request may produce exactly those",
         "only at temperature 0, where the drafts are deterministic"),
        "A block's key names its tokens; the rejected drafts are not the row's tokens, and the next round overwrites "
        "those slots. vLLM caches only verified tokens; a row publishes num_computed // block_size blocks.")


@choice("production_temperature0_differs", topic="production", notebook=NB,
        section="5. Determinism: the batch changes the bits")
def temperature0_differs(rng: random.Random) -> Choice:
    n = rng.randrange(2, 12)
    return Choice(
        f"Greedy decoding in bf16 on a GPU: with speculation on, {n} of 1,000 requests produce a different token than "
        "with it off. The most likely cause?",
        "the verify forward has other shapes (1 + K rows per request, another batch), so the kernels reduce in another "
        "order and a near-tie flips the argmax",
        ("the rejection sampler is biased at temperature 0",
         "the prefix cache published a rejected lookahead block",
         "the draft's temperature differs from the target's"),
        "Speculation is exact in distribution; bitwise identity needs batch-invariant kernels (vLLM's "
        "VLLM_BATCH_INVARIANT=1). Greedy verification has no sampler to bias, a rejected block is never published, and "
        "the draft's temperature changes only acceptance.")
