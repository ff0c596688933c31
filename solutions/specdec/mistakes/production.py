"""Known-wrong answers to the exercises of notebook 13 (speculation in production)."""

from __future__ import annotations

import bisect

import torch

from specdec.chain import verify_drafts
from specdec.mistakes import Mistake
from specdec.params import GREEDY, SamplingParams
from specdec.production.grammar import masked_logits
from specdec.serving.prefix_cache import prefix_key


# ---- match_prefix -------------------------------------------------------------------------
def _match(cache, tokens, block_size, *, leave=1, own_tokens=False, skip_misses=False, last_block_only=False,
           count_hits=False, order="prompt", refresh=False):
    blocks, i = [], 0
    while (i + 1) * block_size <= len(tokens) - leave:
        own = tuple(tokens[i * block_size:(i + 1) * block_size])
        if last_block_only:  # any published block of this length whose own tokens match: the prefix unchecked
            block = next((b for b, key in cache.key_of.items()
                          if len(key) == (i + 1) * block_size and key[-block_size:] == own), None)
        else:
            block = cache.block_of.get(own if own_tokens else prefix_key(tokens, i, block_size))
        i += 1
        if block is None:
            if skip_misses:
                continue
            break
        blocks.append(block)
    if refresh:  # "touch" each hit, as an LRU would: re-inserted, so the maps' order changes
        for block in blocks:
            key = cache.key_of.pop(block)
            del cache.block_of[key]
            cache.block_of[key], cache.key_of[block] = block, key
    if count_hits:  # the engine counts the hits itself: these count them twice
        cache.queried_tokens += len(tokens)
        cache.hit_tokens += len(blocks) * block_size
    return sorted(blocks) if order == "sorted" else blocks


def _propose_counting(tree, tokens, *rest, **kwargs):
    drafts, probability = _propose(tree, tokens, *rest, **kwargs)
    _, node = tree.longest_match(tokens)
    for token in drafts:  # each draft's node counted once more, as if it had occurred
        node = node.children[token]
        node.count += 1
    return drafts, probability


# ---- publish_blocks -----------------------------------------------------------------------
def _publish(cache, tokens, block_table, num_computed, block_size, start=0, *, upto="computed", own_tokens=False,
             ceil=False, spare_last=False, stop_at_known=False, trim_table=False):
    count = {"computed": num_computed, "table": len(block_table) * block_size, "tokens": len(tokens)}[upto]
    full = -(-count // block_size) if ceil else count // block_size
    full = min(full, len(block_table) - 1 if spare_last else len(block_table))  # spare_last: "the last is lookahead"
    order = reversed(range(start, full)) if stop_at_known else range(start, full)
    for i in order:
        key = tuple(tokens[i * block_size:(i + 1) * block_size]) if own_tokens else prefix_key(tokens, i, block_size)
        if stop_at_known and key in cache.block_of:  # "the blocks before a published one are published too"
            break
        cache.add(key, block_table[i])
    if trim_table and isinstance(block_table, list):
        del block_table[max(full, start) + 1:]  # "the lookahead blocks are not needed any more"
    return max(full, start)


# ---- speculative_masks --------------------------------------------------------------------
def _masks(matcher, drafts, *, rollback=True, rows="n+1", validate=True, cut_drafts=False, flat_when_empty=False):
    if flat_when_empty and not drafts:
        return 0, matcher.allowed().clone()
    n = matcher.validate(drafts) if validate else len(drafts)
    if cut_drafts and isinstance(drafts, list):
        del drafts[n:]  # the caller's list loses the forbidden draft
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
           keep_bonus=False, shift=False, in_place=False, end="cut_to_n", no_drafts="one_step", params_kept=True,
           accepting_is_end=False):
    if not drafts and no_drafts == "nothing":
        return []
    if not params_kept:  # temperature only: top-k and top-p lost
        params = SamplingParams(temperature=params.temperature)
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
    if accepting_is_end:  # "the output is a whole match" read as "nothing may follow"
        matcher.accept(list(drafts[:n]))
        ended = ended or matcher.grammar.accepting(matcher.state)
        matcher.rollback(n)
    kept = n if ended or n == len(drafts) or drop else n + 1
    rows_used = torch.cat([masks, masks[-1:]])[: kept + 1].clone()
    if ended:
        rows_used[n] = True
    if in_place:
        lg = logits[: kept + 1]
        lg.masked_fill_(~rows_used, float("-inf"))  # the caller's logits, masked where they lie
    else:
        lg = logits[: kept + 1] if unmasked else masked_logits(logits[: kept + 1], rows_used)
    committed = verify_drafts(list(drafts[:kept]), q[:kept], lg, params, generator)
    if ended and not keep_bonus:
        if end == "drop_last":  # "the last token is the one past the end", even after a rejection
            committed = committed[:-1]
        elif end == "only_after_a_cut":  # the grammar may also end right after the last draft
            committed = committed[:n] if n < len(drafts) else committed
        else:
            committed = committed[:n]
    if advance:
        allowed = matcher.validate(committed)
        matcher.accept(committed[:allowed])
    return committed


def _round_by_hand(matcher, drafts, q, logits, params=GREEDY, generator=None, *, residual="masked",
                   accept="masked", one_token=False, filters="after_mask"):
    """A sampled round written out (greedy rounds go to :func:`_round`), with one step done wrong."""
    if params.temperature == 0:
        return _round(matcher, drafts, q, logits, params, generator)
    n = matcher.validate(drafts)
    rows = [matcher.allowed()]
    for t in drafts[:n]:
        matcher.accept([t])
        rows.append(matcher.allowed())
    matcher.rollback(n)
    masks = torch.stack(rows)
    ended = not bool(masks[n].any())
    kept = n if ended or n == len(drafts) else n + 1
    rows_used = torch.cat([masks, masks[-1:]])[: kept + 1].clone()
    if ended:
        rows_used[n] = True
    if filters == "before_mask":  # top-k / top-p on the unmasked distribution, then the mask
        raw = params.probs(logits[: kept + 1]) * rows_used
        empty = raw.sum(-1, keepdim=True) == 0
        raw = torch.where(empty, torch.softmax(masked_logits(logits[: kept + 1], rows_used), -1), raw)
        p_masked = raw / raw.sum(-1, keepdim=True)
    else:
        p_masked = params.probs(masked_logits(logits[: kept + 1], rows_used))
    p_raw = params.probs(logits[: kept + 1])
    if one_token:  # one draw from p' per round: the drafts never used
        committed = [int(torch.multinomial(p_masked[0], 1, generator=generator))]
    else:
        committed = []
        for i in range(kept):
            y = int(drafts[i])
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            p_test = p_raw if accept == "unmasked" else p_masked
            if bool(rows_used[i, y]) and u * float(q[i, y]) < float(p_test[i, y]):
                committed.append(y)
                continue
            base = p_raw[i] * rows_used[i] if residual == "unmasked" else p_masked[i]
            left = (base - q[i]).clamp_min(0)
            left = left if left.sum() > 0 else p_masked[i]
            committed.append(int(torch.multinomial(left / left.sum(), 1, generator=generator)))
            break
        else:
            committed.append(int(torch.multinomial(p_masked[kept], 1, generator=generator)))
    if ended:
        committed = committed[:n]
    matcher.accept(committed[: matcher.validate(committed)])
    return committed


# ---- propose_from_tree ---------------------------------------------------------------------
def _propose(tree, tokens, max_drafts, factor=1.0, min_prob=0.1, *, use_factor=True, pick="count", cut="product",
             match="longest", strict=True, cap=int, slack=0.0):
    if match == "longest":
        length, node = tree.longest_match(tokens)
    else:
        last = tree.root.children.get(tokens[-1]) if len(tokens) else None
        length, node = (1, last) if last is not None else (0, None)
    drafts, prob = [], 1.0
    limit = min(max_drafts, cap(factor * length)) if use_factor else max_drafts
    min_prob *= 1 - slack  # slack: a tolerance on the threshold
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
def _schedule(itl, rates, *, length="sum", ties="small", skip_zero=False, order=sorted, margin=0.0, as_float=False,
              pop_zero=False):
    schedule = {}
    for b, row in itl.items():
        best_k, best = None, -1.0
        for k in order(row):
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
            if goodput > best * (1 + margin) or (ties == "large" and goodput == best):
                best_k, best = k, goodput
        schedule[b] = float(best_k) if as_float else best_k
    if pop_zero:  # "K = 0 has been compared: drop it"
        for row in itl.values():
            if isinstance(row, dict) and len(row) > 1:
                row.pop(0, None)
    return dict(sorted(schedule.items()))


def _lookup(schedule, batch_size, *, how="floor", listed=False, remember=False):
    if how == "power_of_two":  # B rounded down to a power of two, then looked up
        b = 1 << (batch_size.bit_length() - 1)
        while b not in schedule and b > 1:
            b >>= 1
        return schedule.get(b, schedule[min(schedule)])
    if remember and isinstance(schedule, dict):  # "cache the answer for next time": the caller's schedule grows
        schedule[batch_size] = _lookup(dict(schedule), batch_size)
        return schedule[batch_size]
    sizes = list(schedule) if listed else sorted(schedule)
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
    _m("match_prefix", "no_token_left", lambda *a, **k: _match(*a, **k, leave=0),
       "leave at least the last token to compute: a prompt of exactly k full blocks reuses k - 1 of them, since the "
       "last prompt token's logits give the first new token (and a hit must not leave nothing to run)."),
    _m("match_prefix", "one_block_short", lambda *a, **k: _match(*a, **k, leave=2),
       "a block is reusable when it ends at or before the last token: (i + 1) * block_size <= len(tokens) - 1."),
    _m("match_prefix", "key_by_block_tokens", lambda *a, **k: _match(*a, **k, own_tokens=True),
       "look a block up by prefix_key(tokens, i, block_size), the whole prefix up to the block's end: a block's "
       "K and V depend on every token before it, not only its own."),
    _m("match_prefix", "skips_misses", lambda *a, **k: _match(*a, **k, skip_misses=True),
       "stop at the first block that is not published: a later block is only reusable after every earlier one."),
    _m("match_prefix", "last_block_tokens_only", lambda *a, **k: _match(*a, **k, last_block_only=True),
       "a block matches only when its whole key, prefix_key(tokens, i, block_size), is published: a block whose own "
       "tokens (and length) match but that follows another prefix holds other K and V."),
    _m("match_prefix", "counts_the_hits", lambda *a, **k: _match(*a, **k, count_hits=True),
       "match_prefix only looks up: leave queried_tokens and hit_tokens alone, the engine adds the hit to them "
       "itself (counted here too, every hit would count twice)."),
    _m("match_prefix", "refreshes_recency", lambda *a, **k: _match(*a, **k, refresh=True),
       "match_prefix only looks up: re-inserting a hit to mark it recently used changes the cache it reads (the "
       "maps' order here; in vLLM, the free queue's eviction order), which the engine alone decides."),
    _m("match_prefix", "blocks_sorted", lambda *a, **k: _match(*a, **k, order="sorted"),
       "return the blocks in the order of the prompt (block 0 first): a table must list them in order, and block "
       "ids say nothing about it (sorting, or a set, loses it)."),
    _m("publish_blocks", "publishes_lookahead", lambda *a, **k: _publish(*a, **k, upto="table"),
       "publish only the blocks filled with verified tokens, num_computed // block_size of them: the table also "
       "holds the lookahead slots a rejection left half-written."),
    _m("publish_blocks", "counts_the_pending_token", lambda *a, **k: _publish(*a, **k, upto="tokens"),
       "count num_computed, not len(tokens): the last committed token has no K and V in the cache until the next "
       "step feeds it."),
    _m("publish_blocks", "partial_block", lambda *a, **k: _publish(*a, **k, ceil=True),
       "a block is published only when it is full: num_computed // block_size, rounded down."),
    _m("publish_blocks", "key_by_block_tokens", lambda *a, **k: _publish(*a, **k, own_tokens=True),
       "publish under prefix_key(tokens, i, block_size), the whole prefix to the block's end: two requests whose "
       "blocks hold the same tokens after different prefixes have different K and V."),
    _m("publish_blocks", "spares_the_last_block", lambda *a, **k: _publish(*a, **k, spare_last=True),
       "publish every full block of computed tokens, the table's last one included: the last block holds lookahead "
       "only when num_computed says so."),
    _m("publish_blocks", "stops_at_a_published_prefix", lambda *a, **k: _publish(*a, **k, stop_at_known=True),
       "go through every block from start to num_computed // block_size: a prefix already published (another row "
       "computed it too) says nothing about the blocks around it, one of which may have been evicted since."),
    _m("publish_blocks", "trims_the_table", lambda *a, **k: _publish(*a, **k, trim_table=True),
       "publish_blocks only publishes: leave tokens and block_table as they were (the engine still frees the "
       "lookahead blocks through the row's table)."),
    _m("speculative_masks", "no_rollback", lambda *a, **k: _masks(*a, **k, rollback=False),
       "roll the matcher back (matcher.rollback(n)) after reading the masks: the drafts are not committed yet, "
       "and after a rejection the grammar must continue from the last committed token."),
    _m("speculative_masks", "one_row_short", lambda *a, **k: _masks(*a, **k, rows="n"),
       "return n + 1 rows: one per allowed draft's position and one more, the mask at the first forbidden draft "
       "(or at the bonus position)."),
    _m("speculative_masks", "no_validation", lambda *a, **k: _masks(*a, **k, validate=False),
       "n is how many drafts the grammar allows in a row (matcher.validate(drafts)), not len(drafts)."),
    _m("speculative_masks", "cuts_the_drafts", lambda *a, **k: _masks(*a, **k, cut_drafts=True),
       "leave the drafts as they were: the round still verifies the first forbidden one (a certain rejection), so "
       "cutting the caller's list loses it."),
    _m("speculative_masks", "flat_without_drafts", lambda *a, **k: _masks(*a, **k, flat_when_empty=True),
       "with no drafts, return (0, masks) with masks of shape (1, V): one row, the mask at the bonus position."),
    _m("constrained_round", "drops_the_forbidden_draft", lambda *a, **k: _round(*a, **k, drop=True),
       "keep the first forbidden draft in the round, as a certain rejection (its masked p is 0): the correction "
       "then comes from max(p' - q, 0). Cutting it away and sampling from p' there is biased whenever q put mass "
       "on forbidden tokens."),
    _m("constrained_round", "target_unmasked", lambda *a, **k: _round(*a, **k, unmasked=True),
       "mask the target's logits at every position (masked_logits with the speculative masks): the verifier, "
       "not only the drafter, must respect the grammar."),
    _m("constrained_round", "matcher_not_advanced", lambda *a, **k: _round(*a, **k, advance=False),
       "advance the matcher over the committed tokens (matcher.accept(committed)) before returning."),
    _m("constrained_round", "accepting_state_as_the_end", lambda *a, **k: _round(*a, **k, accepting_is_end=True),
       "the grammar ends where no token is allowed (matcher.finished()), not where the output is a whole match "
       "(an accepting state): a match may go on (\"ab\" then \"abc\"), and the target's token there is kept."),
    _m("constrained_round", "token_past_the_end", lambda *a, **k: _round(*a, **k, keep_bonus=True),
       "when the grammar ends after the n-th draft, commit at most n tokens: a bonus drawn past the end does not "
       "belong to the output."),
    _m("constrained_round", "masks_shifted", lambda *a, **k: _round(*a, **k, shift=True),
       "position i of the round uses the mask after drafts[:i]: row i of speculative_masks, not row i + 1."),
    _m("constrained_round", "masks_the_logits_in_place", lambda *a, **k: _round(*a, **k, in_place=True),
       "mask a copy (masked_logits returns one): the logits you are given belong to the caller."),
    _m("constrained_round", "drops_a_token_at_the_end", lambda *a, **k: _round(*a, **k, end="drop_last"),
       "when the grammar ends after draft n, keep committed[:n]: a rejection before the end still commits its "
       "correction, and only a token past the end goes."),
    _m("constrained_round", "end_only_after_a_cut", lambda *a, **k: _round(*a, **k, end="only_after_a_cut"),
       "the grammar can end right after the last draft too (masks[n] allows nothing with n = len(drafts)): the bonus "
       "then lies past the end, so commit at most n tokens there as well."),
    _m("constrained_round", "nothing_without_drafts", lambda *a, **k: _round(*a, **k, no_drafts="nothing"),
       "a round with no drafts is one plain constrained step: it commits one token (verify_drafts with no drafts "
       "samples it from the masked logits)."),
    _m("constrained_round", "filters_dropped", lambda *a, **k: _round(*a, **k, params_kept=False),
       "verify with the request's own SamplingParams: its top-k and top-p act on the masked distribution too."),
    _m("constrained_round", "filters_before_the_mask", lambda *a, **k: _round_by_hand(*a, **k, filters="before_mask"),
       "mask first, then let temperature, top-k and top-p act (params.probs on the masked logits): a filter applied "
       "before the mask keeps forbidden tokens and drops allowed ones."),
    _m("constrained_round", "residual_from_unmasked_p", lambda *a, **k: _round_by_hand(*a, **k, residual="unmasked"),
       "after a rejection the correction comes from max(p' - q, 0) with p' the masked, renormalised target "
       "distribution, not from the unmasked p restricted to the allowed tokens."),
    _m("constrained_round", "acceptance_against_unmasked_p", lambda *a, **k: _round_by_hand(*a, **k, accept="unmasked"),
       "accept an allowed draft x with probability min(1, p'(x) / q(x)), p' masked and renormalised: the unmasked "
       "p(x) is smaller and rejects drafts the constrained target would keep."),
    _m("constrained_round", "one_token_per_round", lambda *a, **k: _round_by_hand(*a, **k, one_token=True),
       "verify the drafts (verify_drafts): drawing one token from p' per round is exact but never speculates, and a "
       "draft the target agrees with must be accepted."),
    _m("propose_from_tree", "no_length_cap", lambda *a, **k: _propose(*a, **k, use_factor=False),
       "cap the draft at min(max_drafts, int(factor * match length)): a short match earns a short draft."),
    _m("propose_from_tree", "first_child", lambda *a, **k: _propose(*a, **k, pick="first"),
       "walk to the child with the highest count (what followed most often), not the first one seen."),
    _m("propose_from_tree", "counts_its_drafts", _propose_counting,
       "propose_from_tree only reads the tree: counting the drafts as seen changes the counts every later proposal "
       "reads; the tree learns tokens when they are committed (extend), never when they are proposed."),
    _m("propose_from_tree", "ties_to_higher_id", lambda *a, **k: _propose(*a, **k, pick="ties_high"),
       "break equal counts by the lower token id."),
    _m("propose_from_tree", "no_probability_cut", lambda *a, **k: _propose(*a, **k, cut="none"),
       "stop before the estimate (the product of child count / parent count along the walk) would fall below "
       "min_prob."),
    _m("propose_from_tree", "local_share_only", lambda *a, **k: _propose(*a, **k, cut="local"),
       "compare the running product with min_prob, not each step's share alone: the estimate is the probability of "
       "the whole draft so far."),
    _m("propose_from_tree", "last_token_only", lambda *a, **k: _propose(*a, **k, match="last"),
       "match the longest suffix the tree holds (tree.longest_match): the longer the match, the more reliable "
       "and the longer the draft."),
    _m("propose_from_tree", "stops_at_equal", lambda *a, **k: _propose(*a, **k, strict=False),
       "an estimate exactly equal to min_prob is still allowed: stop only when it would fall below."),
    _m("propose_from_tree", "cap_rounded", lambda *a, **k: _propose(*a, **k, cap=round),
       "the cap is int(factor * match length), rounded down: a 3-token match at factor 0.5 earns 1 draft, not 2."),
    _m("propose_from_tree", "threshold_with_slack", lambda *a, **k: _propose(*a, **k, slack=0.01),
       "compare the estimate with min_prob itself, with no tolerance: an estimate a hair below min_prob stops the "
       "walk."),
    _m("k_schedule", "rates_multiplied", lambda *a, **k: _schedule(*a, **k, length="product"),
       "the per-position rates are already unconditional (accepted at position i over rounds): the mean "
       "acceptance length is 1 + rates[0] + ... + rates[K - 1]; multiplying them counts earlier rejections twice."),
    _m("k_schedule", "steps_not_tokens", lambda *a, **k: _schedule(*a, **k, length="one"),
       "goodput is tokens per second: (1 + sum of the first K rates) / itl[B][K], not 1 / itl."),
    _m("k_schedule", "ties_to_larger_k", lambda *a, **k: _schedule(*a, **k, ties="large"),
       "on equal goodput keep the smaller K (less work for the same tokens)."),
    _m("k_schedule", "never_off", lambda *a, **k: _schedule(*a, **k, skip_zero=True),
       "K = 0 (speculation off) is a candidate like any other: at large batches it wins."),
    _m("k_schedule", "first_listed_on_ties", lambda *a, **k: _schedule(*a, **k, order=list),
       "go through the K in increasing order (sorted(itl[B])), or break ties by K explicitly: a profile is a "
       "mapping, and the first K it lists need not be the smallest."),
    _m("k_schedule", "near_ties_as_ties", lambda *a, **k: _schedule(*a, **k, margin=0.01),
       "compare goodputs exactly: a K that is better by a small margin is better (only an exact tie goes to the "
       "smaller K)."),
    _m("k_schedule", "k_as_float", lambda *a: {b: float(k) for b, k in _schedule(*a).items()},
       "return ints: {B: K} with K an int, the draft length a step uses."),
    _m("k_schedule", "profile_changed", lambda *a, **k: _schedule(*a, **k, pop_zero=True),
       "leave itl and rates as they were: the profile is the caller's, and the next schedule is built from it."),
    _m("k_schedule", "no_profile_check", lambda *a, **k: _schedule(*a, **k),
       "the profile is invalid: keep the template's first line, check_profile(itl, rates), which rejects it with a "
       "ValueError."),
    _m("lookup_k", "nearest_size", lambda *a, **k: _lookup(*a, **k, how="nearest"),
       "take the largest profiled batch size not above the batch (bisect_right - 1), not the nearest one."),
    _m("lookup_k", "next_size_up", lambda *a, **k: _lookup(*a, **k, how="ceil"),
       "take the largest profiled batch size not above the batch, not the next one up."),
    _m("lookup_k", "off_below_the_profile", lambda *a, **k: _lookup(*a, **k, how="zero_below"),
       "below the smallest profiled batch size use that size's entry, not 0."),
    _m("lookup_k", "sizes_as_listed", lambda *a, **k: _lookup(*a, **k, listed=True),
       "sort the profiled batch sizes (sorted(schedule)) before searching them: a schedule is a mapping, its keys "
       "may come in any order."),
    _m("lookup_k", "power_of_two_buckets", lambda *a, **k: _lookup(*a, **k, how="power_of_two"),
       "search the profiled batch sizes themselves (the largest not above B): they need not be powers of two."),
    _m("lookup_k", "schedule_changed", lambda *a, **k: _lookup(*a, **k, remember=True),
       "leave the schedule as it was: it is the caller's, shared by every later lookup."),
]
