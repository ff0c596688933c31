"""Known-wrong answers to the exercises of notebook 13 (speculation in production)."""

from __future__ import annotations

import bisect

import torch

from specdec.chain import verify_drafts
from specdec.mistakes import Mistake
from specdec.params import GREEDY
from specdec.production.grammar import masked_logits
from specdec.serving.prefix_cache import prefix_key


# ---- match_prefix -------------------------------------------------------------------------
def _match(cache, tokens, block_size, *, leave=1, own_tokens=False, skip_misses=False):
    blocks, i = [], 0
    while (i + 1) * block_size <= len(tokens) - leave:
        key = tuple(tokens[i * block_size:(i + 1) * block_size]) if own_tokens else prefix_key(tokens, i, block_size)
        block = cache.block_of.get(key)
        i += 1
        if block is None:
            if skip_misses:
                continue
            break
        blocks.append(block)
    return blocks


# ---- publish_blocks -----------------------------------------------------------------------
def _publish(cache, tokens, block_table, num_computed, block_size, start=0, *, upto="computed", own_tokens=False,
             ceil=False):
    count = {"computed": num_computed, "table": len(block_table) * block_size, "tokens": len(tokens)}[upto]
    full = -(-count // block_size) if ceil else count // block_size
    full = min(full, len(block_table))
    for i in range(start, full):
        key = tuple(tokens[i * block_size:(i + 1) * block_size]) if own_tokens else prefix_key(tokens, i, block_size)
        cache.add(key, block_table[i])
    return max(full, start)


# ---- speculative_masks --------------------------------------------------------------------
def _masks(matcher, drafts, *, rollback=True, rows="n+1", validate=True):
    n = matcher.validate(drafts) if validate else len(drafts)
    out = [matcher.allowed()]
    accepted = 0
    for t in drafts[:n]:
        if not matcher.accept([t]):
            break
        accepted += 1
        out.append(matcher.allowed())
    if rollback:
        matcher.rollback(accepted)
    if rows == "n":
        out = out[:-1] or out
    return n, torch.stack(out)


# ---- constrained_round --------------------------------------------------------------------
def _round(matcher, drafts, q, logits, params=GREEDY, generator=None, *, drop=False, unmasked=False, advance=True,
           keep_bonus=False, shift=False):
    n = matcher.validate(drafts)
    rows = [matcher.allowed()]
    for t in drafts[:n]:
        matcher.accept([t])
        rows.append(matcher.allowed())
    matcher.rollback(n)
    masks = torch.stack(rows)
    if shift:
        masks = torch.cat([masks[1:], masks[-1:]])
        masks[~masks.any(-1)] = True
    ended = not bool(masks[n].any())
    kept = n if ended or n == len(drafts) or drop else n + 1
    rows_used = torch.cat([masks, masks[-1:]])[: kept + 1].clone()
    if ended:
        rows_used[n] = True
    lg = logits[: kept + 1] if unmasked else masked_logits(logits[: kept + 1], rows_used)
    committed = verify_drafts(list(drafts[:kept]), q[:kept], lg, params, generator)
    if ended and not keep_bonus:
        committed = committed[:n]
    if advance:
        allowed = matcher.validate(committed)
        matcher.accept(committed[:allowed])
    return committed


# ---- propose_from_tree ---------------------------------------------------------------------
def _propose(tree, tokens, max_drafts, factor=1.0, min_prob=0.1, *, use_factor=True, pick="count", cut="product",
             match="longest", strict=True):
    if match == "longest":
        length, node = tree.longest_match(tokens)
    else:
        last = tree.root.children.get(tokens[-1]) if len(tokens) else None
        length, node = (1, last) if last is not None else (0, None)
    drafts, prob = [], 1.0
    limit = min(max_drafts, int(factor * length)) if use_factor else max_drafts
    while node is not None and node.children and len(drafts) < limit:
        items = list(node.children.items())
        if pick == "count":
            token, child = max(items, key=lambda item: (item[1].count, -item[0]))
        elif pick == "ties_high":
            token, child = max(items, key=lambda item: (item[1].count, item[0]))
        else:  # the first child ever seen
            token, child = items[0]
        share = child.count / node.count
        value = prob * share if cut == "product" else share
        if cut != "none" and (value < min_prob if strict else value <= min_prob):
            break
        prob *= share
        drafts.append(token)
        node = child
    return drafts, prob if drafts else 0.0


# ---- k_schedule / lookup_k ------------------------------------------------------------------
def _schedule(itl, rates, *, length="sum", ties="small", skip_zero=False):
    schedule = {}
    for b, row in itl.items():
        best_k, best = None, -1.0
        for k in sorted(row):
            if skip_zero and k == 0 and len(row) > 1:
                continue
            if length == "sum":
                al = 1 + sum(rates[:k])
            elif length == "product":
                al, survive = 1.0, 1.0
                for r in rates[:k]:
                    survive *= r
                    al += survive
            else:  # per step, not per token
                al = 1.0
            goodput = al / row[k]
            if goodput > best or (ties == "large" and goodput == best):
                best_k, best = k, goodput
        schedule[b] = best_k
    return dict(sorted(schedule.items()))


def _lookup(schedule, batch_size, *, how="floor"):
    sizes = sorted(schedule)
    if how == "nearest":
        return schedule[min(sizes, key=lambda s: (abs(s - batch_size), s))]
    if how == "ceil":
        i = bisect.bisect_left(sizes, batch_size)
        return schedule[sizes[min(i, len(sizes) - 1)]]
    i = bisect.bisect_right(sizes, batch_size) - 1
    if i < 0:
        return 0 if how == "zero_below" else schedule[sizes[0]]
    return schedule[sizes[i]]


def _m(exercise, name, fn, hint):
    return Mistake(exercise, name, fn, hint)


MISTAKES = [
    _m("match_prefix", "no_token_left", lambda *a: _match(*a, leave=0),
       "leave at least the last token to compute: a prompt of exactly k full blocks reuses k - 1 of them, since the "
       "last prompt token's logits give the first new token (and a hit must not leave nothing to run)."),
    _m("match_prefix", "one_block_short", lambda *a: _match(*a, leave=2),
       "a block is reusable when it ends at or before the last token: (i + 1) * block_size <= len(tokens) - 1."),
    _m("match_prefix", "key_by_block_tokens", lambda *a: _match(*a, own_tokens=True),
       "look a block up by prefix_key(tokens, i, block_size), the whole prefix up to the block's end: a block's "
       "K and V depend on every token before it, not only its own."),
    _m("match_prefix", "skips_misses", lambda *a: _match(*a, skip_misses=True),
       "stop at the first block that is not published: a later block is only reusable after every earlier one."),
    _m("publish_blocks", "publishes_lookahead", lambda *a: _publish(*a, upto="table"),
       "publish only the blocks filled with verified tokens, num_computed // block_size of them: the table also "
       "holds the lookahead slots a rejection left half-written."),
    _m("publish_blocks", "counts_the_pending_token", lambda *a: _publish(*a, upto="tokens"),
       "count num_computed, not len(tokens): the last committed token has no K and V in the cache until the next "
       "step feeds it."),
    _m("publish_blocks", "partial_block", lambda *a: _publish(*a, ceil=True),
       "a block is published only when it is full: num_computed // block_size, rounded down."),
    _m("publish_blocks", "key_by_block_tokens", lambda *a: _publish(*a, own_tokens=True),
       "publish under prefix_key(tokens, i, block_size), the whole prefix to the block's end: two requests whose "
       "blocks hold the same tokens after different prefixes have different K and V."),
    _m("speculative_masks", "no_rollback", lambda *a: _masks(*a, rollback=False),
       "roll the matcher back (matcher.rollback(n)) after reading the masks: the drafts are not committed yet, "
       "and after a rejection the grammar must continue from the last committed token."),
    _m("speculative_masks", "one_row_short", lambda *a: _masks(*a, rows="n"),
       "return n + 1 rows: one per allowed draft's position and one more, the mask at the first forbidden draft "
       "(or at the bonus position)."),
    _m("speculative_masks", "no_validation", lambda *a: _masks(*a, validate=False),
       "n is how many drafts the grammar allows in a row (matcher.validate(drafts)), not len(drafts)."),
    _m("constrained_round", "drops_the_forbidden_draft", lambda *a: _round(*a, drop=True),
       "keep the first forbidden draft in the round, as a certain rejection (its masked p is 0): the correction "
       "then comes from max(p' - q, 0). Cutting it away and sampling from p' there is biased whenever q put mass "
       "on forbidden tokens."),
    _m("constrained_round", "target_unmasked", lambda *a: _round(*a, unmasked=True),
       "mask the target's logits at every position (masked_logits with the speculative masks): the verifier, "
       "not only the drafter, must respect the grammar."),
    _m("constrained_round", "matcher_not_advanced", lambda *a: _round(*a, advance=False),
       "advance the matcher over the committed tokens (matcher.accept(committed)) before returning."),
    _m("constrained_round", "token_past_the_end", lambda *a: _round(*a, keep_bonus=True),
       "when the grammar ends after the n-th draft, commit at most n tokens: a bonus drawn past the end does not "
       "belong to the output."),
    _m("constrained_round", "masks_shifted", lambda *a: _round(*a, shift=True),
       "position i of the round uses the mask after drafts[:i]: row i of speculative_masks, not row i + 1."),
    _m("propose_from_tree", "no_length_cap", lambda *a: _propose(*a, use_factor=False),
       "cap the draft at min(max_drafts, int(factor * match length)): a short match earns a short draft."),
    _m("propose_from_tree", "first_child", lambda *a: _propose(*a, pick="first"),
       "walk to the child with the highest count (what followed most often), not the first one seen."),
    _m("propose_from_tree", "ties_to_higher_id", lambda *a: _propose(*a, pick="ties_high"),
       "break equal counts by the lower token id."),
    _m("propose_from_tree", "no_probability_cut", lambda *a: _propose(*a, cut="none"),
       "stop before the estimate (the product of child count / parent count along the walk) would fall below "
       "min_prob."),
    _m("propose_from_tree", "local_share_only", lambda *a: _propose(*a, cut="local"),
       "compare the running product with min_prob, not each step's share alone: the estimate is the probability of "
       "the whole draft so far."),
    _m("propose_from_tree", "last_token_only", lambda *a: _propose(*a, match="last"),
       "match the longest suffix the tree holds (tree.longest_match): the longer the match, the more reliable "
       "and the longer the draft."),
    _m("propose_from_tree", "stops_at_equal", lambda *a: _propose(*a, strict=False),
       "an estimate exactly equal to min_prob is still allowed: stop only when it would fall below."),
    _m("k_schedule", "rates_multiplied", lambda *a: _schedule(*a, length="product"),
       "the per-position rates are already unconditional (accepted at position i over rounds): the mean "
       "acceptance length is 1 + rates[0] + ... + rates[K - 1]; multiplying them counts earlier rejections twice."),
    _m("k_schedule", "steps_not_tokens", lambda *a: _schedule(*a, length="one"),
       "goodput is tokens per second: (1 + sum of the first K rates) / itl[B][K], not 1 / itl."),
    _m("k_schedule", "ties_to_larger_k", lambda *a: _schedule(*a, ties="large"),
       "on equal goodput keep the smaller K (less work for the same tokens)."),
    _m("k_schedule", "never_off", lambda *a: _schedule(*a, skip_zero=True),
       "K = 0 (speculation off) is a candidate like any other: at large batches it wins."),
    _m("lookup_k", "nearest_size", lambda *a: _lookup(*a, how="nearest"),
       "take the largest profiled batch size not above the batch (bisect_right - 1), not the nearest one."),
    _m("lookup_k", "next_size_up", lambda *a: _lookup(*a, how="ceil"),
       "take the largest profiled batch size not above the batch, not the next one up."),
    _m("lookup_k", "off_below_the_profile", lambda *a: _lookup(*a, how="zero_below"),
       "below the smallest profiled batch size use that size's entry, not 0."),
]
