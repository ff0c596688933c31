"""Known-wrong answers to the exercises of notebook 11 (speculation in a serving engine)."""

from __future__ import annotations

import torch

from specdec.ledger import expected_tokens_per_round
from specdec.mistakes import Mistake
from specdec.params import StopCriteria, accept_until_stop
from specdec.serving.blocks import blocks_for
from specdec.serving.sequence import SeqStatus


# ---- reserve_slots ------------------------------------------------------------------------
def _reserve(free, table, num_slots, block_size, *, count=blocks_for, partial=False, fresh=False, peek=False,
             exactly_short=False):
    missing = count(num_slots, block_size) - (0 if fresh else len(table))
    if (missing >= len(free) > 0 if exactly_short else missing > len(free)) and not partial:
        return False
    ok = missing <= len(free)
    for _ in range(max(min(missing, len(free)), 0)):
        table.append(free[-1] if peek else free.pop())
    return ok


def _floor_blocks(num_slots, block_size):
    return num_slots // block_size


# ---- release_slots ------------------------------------------------------------------------
def _release(free, table, num_kept, block_size, *, give_back=True, remove=True, count=blocks_for, head=False,
             keep_none=False):
    keep = 0 if keep_none else count(num_kept, block_size)
    surplus = table[: max(len(table) - keep, 0)] if head else table[keep:]
    if give_back:
        free.extend(reversed(surplus))
    if remove:
        for block in surplus:
            table.remove(block)


# ---- slot_mapping -------------------------------------------------------------------------
def _slots(block_tables, starts, counts, block_size, *, shift=0, logical=False, first_table=False, scale=True,
           restart=False):
    out = []
    for b, (table, start, count) in enumerate(zip(block_tables, starts, counts)):
        table = block_tables[0] if first_table else table
        first = 0 if restart else start + shift
        for pos in range(first, first + count):
            index = pos // block_size
            block = index if logical else (table[index] if index < len(table) else table[-1])
            out.append(block * block_size + pos % block_size if scale else block + pos % block_size)
    return torch.tensor(out, dtype=torch.long)


# ---- commit_round -------------------------------------------------------------------------
def _commit(seqs, committed, gammas, *, same_k=False, ignore_stops=False, no_max=False, computed="emitted",
            draft="min", draft_on_zero=False, keep_finished=False):
    rows = []
    for seq, tokens, gamma in zip(seqs, committed, gammas):
        P = seq.num_tokens
        k = (len(committed[0]) if same_k else len(tokens)) - 1
        if ignore_stops:
            emitted = list(tokens[: max(seq.stop.max_tokens - len(seq.output), 0)])
            finished = len(seq.output) + len(emitted) >= seq.stop.max_tokens
        elif no_max:
            relaxed = StopCriteria(10**9, seq.stop.stop_token_ids, seq.stop.stop_sequences)
            emitted, finished = accept_until_stop(seq.output, tokens, relaxed)
        else:
            emitted, finished = accept_until_stop(seq.output, tokens, seq.stop)
        seq.output += emitted
        if finished and not keep_finished:
            seq.status = SeqStatus.FINISHED
        seq.num_computed = {"emitted": P + len(emitted) - 1, "gamma": P + gamma, "k": P + k}[computed]
        if gamma >= 1 or draft_on_zero:
            value = P + (k if draft == "k" else min(k, gamma - 1))
            seq.draft_computed = value if draft == "uncapped" or draft == "k" else min(value, seq.num_computed)
        rows.append(emitted)
    return rows


# ---- schedule_step ------------------------------------------------------------------------
def _schedule(running, waiting, token_budget, num_free_blocks, block_size, *, lookahead=True, budget_cap=True,
              waiting_first=False, admit_after_preempt=False, overtake=False, victim="last", count_victim=True,
              need_from="computed", ids=False):
    scheduled, preempted = {}, []
    state = {"budget": token_budget, "free": num_free_blocks}

    def grant(seq, want):
        return min(want, state["budget"]) if budget_cap else want

    def blocks_needed(seq, n):
        slots = seq.num_computed + n if need_from == "computed" else seq.num_tokens + seq.lookahead
        return max(blocks_for(slots, block_size) - len(seq.block_table), 0)

    def serve_running():
        queue, i = list(running), 0
        while i < len(queue):
            seq = queue[i]
            n = grant(seq, seq.num_tokens - seq.num_computed + (seq.lookahead if lookahead else 0))
            if n <= 0:
                i += 1
                continue
            need = blocks_needed(seq, n)
            while need > state["free"] and len(queue) > i + 1:
                v = queue.pop() if victim == "last" else queue.pop(i + 1)
                if count_victim:
                    state["free"] += len(v.block_table)
                preempted.append(v)
            if need > state["free"]:
                preempted.append(seq)
                queue.pop(i)
                break
            scheduled[seq] = n
            state["budget"] -= n
            state["free"] -= need
            i += 1

    def serve_waiting():
        for seq in waiting:
            n = grant(seq, seq.num_tokens - seq.num_computed)
            need = blocks_needed(seq, n)
            if n <= 0 or need > state["free"]:
                if overtake:
                    continue
                break
            scheduled[seq] = n
            state["budget"] -= n
            state["free"] -= need

    if waiting_first:
        serve_waiting()
        serve_running()
    else:
        serve_running()
        if not preempted or admit_after_preempt:
            serve_waiting()
    if ids:  # the old contract: ids, so the engine had to look every request up again
        return {s.seq_id: n for s, n in scheduled.items()}, [s.seq_id for s in preempted]
    return scheduled, preempted


# ---- choose_gamma -------------------------------------------------------------------------
def _choose(alpha, batch_size, step_time, draft_step_time, max_gamma, *, batch_verify=True, linear=False, lowest=0,
            ties_up=False, draft_rows=True, include_max=True):
    best, best_rate = None, -1.0
    for gamma in range(lowest, max_gamma + (1 if include_max else 0)):
        verify = step_time(batch_size * (gamma + 1) if batch_verify else gamma + 1)
        seconds = gamma * draft_step_time(batch_size if draft_rows else 1) + verify
        E = 1 + alpha * gamma if linear else expected_tokens_per_round(alpha, gamma)
        rate = batch_size * E / seconds
        if rate > best_rate or (ties_up and rate == best_rate):
            best, best_rate = gamma, rate
    return best if best is not None else 0


def _m(exercise, name, fn, hint):
    return Mistake(exercise, name, fn, hint)


MISTAKES = [
    _m("reserve_slots", "floor_blocks", lambda *a, **k: _reserve(*a, **k, count=_floor_blocks),
       "the table must cover num_slots slots: ceil(num_slots / block_size) blocks. Floor division leaves the last, "
       "partly used block out, so the verify's lookahead tokens are written into a block the request does not own."),
    _m("reserve_slots", "partial_on_failure", lambda *a, **k: _reserve(*a, **k, partial=True),
       "when there are too few free blocks, take none: all or nothing. Taking some and returning False leaks them "
       "(the caller does not know the request holds them)."),
    _m("reserve_slots", "fresh_blocks", lambda *a, **k: _reserve(*a, **k, fresh=True),
       "count the blocks the table already has: only ceil(num_slots / block_size) - len(block_table) are missing."),
    _m("reserve_slots", "exactly_enough_refused", lambda *a, **k: _reserve(*a, **k, exactly_short=True),
       "exactly as many free blocks as are missing is enough: refuse only when len(free_blocks) is smaller than "
       "the number of blocks missing (compare with >, not >=)."),
    _m("reserve_slots", "peek_not_pop", lambda *a, **k: _reserve(*a, **k, peek=True),
       "take blocks with free_blocks.pop(): reading free_blocks[-1] leaves the block in the free list, so two "
       "requests end up sharing it."),
    _m("release_slots", "no_give_back", lambda *a, **k: _release(*a, **k, give_back=False),
       "append every block you remove from the table to free_blocks: dropping it leaks the block for good."),
    _m("release_slots", "double_free", lambda *a, **k: _release(*a, **k, remove=False),
       "remove the released blocks from the table as well (pop them): a block left in the table is freed again "
       "next time, and then handed to two requests."),
    _m("release_slots", "floor_keep", lambda *a, **k: _release(*a, **k, count=_floor_blocks),
       "keep ceil(num_kept / block_size) blocks: the last, partly filled block still holds KV of the request."),
    _m("release_slots", "frees_head", lambda *a, **k: _release(*a, **k, head=True),
       "free the blocks at the end of the table: the first blocks hold the earliest positions, which stay."),
    _m("release_slots", "frees_everything", lambda *a, **k: _release(*a, **k, keep_none=True),
       "keep the blocks that hold slots 0..num_kept-1; only the rest go back (num_kept = 0 frees all)."),
    _m("slot_mapping", "off_by_one", lambda *a, **k: _slots(*a, **k, shift=1),
       "row b's first new token is at position starts[b] (the cache holds positions 0..starts[b]-1), not starts[b] + 1."),
    _m("slot_mapping", "logical_block", lambda *a, **k: _slots(*a, **k, logical=True),
       "pos // block_size is the index into the row's block table, not the physical block: look it up in "
       "block_tables[b]."),
    _m("slot_mapping", "first_table_for_every_row", lambda *a, **k: _slots(*a, **k, first_table=True),
       "each row has its own block table: use block_tables[b] for row b."),
    _m("slot_mapping", "forgot_block_size", lambda *a, **k: _slots(*a, **k, scale=False),
       "a block holds block_size slots: the slot is block * block_size + pos % block_size."),
    _m("slot_mapping", "ignores_starts", lambda *a, **k: _slots(*a, **k, restart=True),
       "new tokens continue the row's cache: their positions start at starts[b], not 0."),
    _m("commit_round", "same_k_for_every_row", lambda *a, **k: _commit(*a, **k, same_k=True),
       "each row accepted its own number of drafts: use len(committed[b]) - 1 for row b, not the first row's."),
    _m("commit_round", "ignores_stops", lambda *a, **k: _commit(*a, **k, ignore_stops=True),
       "a stop token or stop string inside the accepted drafts ends the request there: cut with accept_until_stop."),
    _m("commit_round", "max_tokens_overrun", lambda *a, **k: _commit(*a, **k, no_max=True),
       "the accepted drafts may reach max_tokens mid-round: the max_tokens-th new token is the last one emitted."),
    _m("commit_round", "computed_plus_gamma", lambda *a, **k: _commit(*a, **k, computed="gamma"),
       "after a round the target's cache holds what was committed, not all gamma + 1 positions it was fed: "
       "num_computed = P + len(emitted) - 1 (rejected drafts' KV is garbage)."),
    _m("commit_round", "computed_ignores_stop", lambda *a, **k: _commit(*a, **k, computed="k"),
       "num_computed counts emitted tokens: after a stop inside the drafts it is P + len(emitted) - 1, not P + k."),
    _m("commit_round", "draft_fed_last_draft", lambda *a, **k: _commit(*a, **k, draft="k"),
       "the draft never fed its last draft: after a full acceptance its cache holds P + gamma - 1 entries, "
       "draft_computed = P + min(k, gamma - 1)."),
    _m("commit_round", "draft_updated_without_drafting", lambda *a, **k: _commit(*a, **k, draft_on_zero=True),
       "a row that verified no drafts (gamma 0) did not run the draft: leave its draft_computed unchanged."),
    _m("commit_round", "never_finished", lambda *a, **k: _commit(*a, **k, keep_finished=True),
       "set seq.status = SeqStatus.FINISHED when a stop or max_tokens ended the request, so the engine frees its blocks."),
    _m("schedule_step", "no_lookahead", lambda *a, **k: _schedule(*a, **k, lookahead=False),
       "a decoding row feeds its last token and its lookahead drafts: want = num_tokens - num_computed + lookahead. "
       "Without the lookahead no slots are reserved for the drafts."),
    _m("schedule_step", "budget_ignored", lambda *a, **k: _schedule(*a, **k, budget_cap=False),
       "a row gets min(want, budget left): the step's tokens must not exceed token_budget (a long prompt goes in chunks)."),
    _m("schedule_step", "waiting_first", lambda *a, **k: _schedule(*a, **k, waiting_first=True),
       "running requests come first: admitting new prompts before them stalls requests already streaming."),
    _m("schedule_step", "admits_after_preempting", lambda *a, **k: _schedule(*a, **k, admit_after_preempt=True),
       "if anything was preempted this step, admit nobody: the blocks are too few for the running requests already."),
    _m("schedule_step", "waiting_overtake", lambda *a, **k: _schedule(*a, **k, overtake=True),
       "first come, first served: stop at the first waiting request that does not fit; a later, smaller one must "
       "not overtake it (it could starve)."),
    _m("schedule_step", "preempts_oldest", lambda *a, **k: _schedule(*a, **k, victim="next"),
       "preempt the last running request (the most recently admitted), not the next one in line."),
    _m("schedule_step", "victim_blocks_not_freed", lambda *a, **k: _schedule(*a, **k, count_victim=False),
       "a preempted request gives back all its blocks: add len(victim.block_table) to the free count."),
    _m("schedule_step", "blocks_from_want", lambda *a, **k: _schedule(*a, **k, need_from="tokens"),
       "the blocks needed cover num_computed + n slots, n being what the row was granted (a chunk may be "
       "less than it wants)."),
    _m("schedule_step", "returns_ids", lambda *a, **k: _schedule(*a, **k, ids=True),
       "return the Seq objects themselves, {seq: n} and [seq, ...], not their seq_id: the engine uses them "
       "directly."),
    _m("choose_gamma", "verify_ignores_batch", lambda *a, **k: _choose(*a, **k, batch_verify=False),
       "the target's forward carries batch_size * (gamma + 1) tokens: every row verifies its own drafts."),
    _m("choose_gamma", "linear_expected_tokens", lambda *a, **k: _choose(*a, **k, linear=True),
       "expected tokens per round are 1 + alpha + ... + alpha^gamma (expected_tokens_per_round), not 1 + alpha * gamma."),
    _m("choose_gamma", "never_off", lambda *a, **k: _choose(*a, **k, lowest=1),
       "gamma = 0 (speculation off) is a choice: at a large batch it is often the best one."),
    _m("choose_gamma", "ties_to_larger", lambda *a, **k: _choose(*a, **k, ties_up=True),
       "ties go to the smaller gamma: replace the best only when the rate is strictly higher."),
    _m("choose_gamma", "draft_for_one_row", lambda *a, **k: _choose(*a, **k, draft_rows=False),
       "the draft also runs on the whole batch: each of its gamma forwards carries batch_size tokens."),
    _m("choose_gamma", "max_gamma_excluded", lambda *a, **k: _choose(*a, **k, include_max=False),
       "max_gamma itself is allowed: try gamma = 0, 1, ..., max_gamma."),
]
