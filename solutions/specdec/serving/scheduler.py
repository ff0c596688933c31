"""Notebook 11, the scheduler: who runs in the next step, and how many tokens each feeds.

One step is one forward over a flat batch of at most ``token_budget`` tokens. Running
requests come first, in order: a decoding row feeds its last token plus ``lookahead``
drafts, a row still in prefill feeds a chunk of its prompt. Waiting requests are admitted
in arrival order with what is left. KV blocks are the other limit: a row that cannot get
the blocks for its tokens makes room by preempting the most recently admitted running
request (its blocks are freed; it is recomputed later), as vLLM V1 does.
"""

from __future__ import annotations

from specdec.serving.blocks import blocks_for
from specdec.serving.sequence import Seq
from specdec.validate import check_positive_int


def schedule_step(running: list[Seq], waiting: list[Seq], token_budget: int, num_free_blocks: int,
                  block_size: int) -> tuple[dict[Seq, int], list[Seq]]:
    """The requests scheduled, with the tokens each feeds (``{seq: n}``), and the requests preempted, in the
    order preempted: the ``Seq`` objects themselves, never their ids. Changes neither list nor any request.

    1. Running rows, in list order. A row wants ``num_tokens - num_computed + lookahead``
       tokens and gets ``min(want, budget left)``; a row that gets 0 is not scheduled. Its
       block table must then cover ``num_computed + n`` slots. If there are too few free
       blocks, preempt the last running row not yet scheduled (all its blocks become free)
       until there are enough; if the row itself is the last one left, preempt it and stop.
    2. Only if nothing was preempted: waiting rows, in order, want ``num_tokens - num_computed``
       (their whole prompt, in chunks) and get ``min(want, budget left)``; stop at the first
       that gets 0 or whose blocks do not fit (first come, first served: nobody overtakes).
    """
    check_positive_int(token_budget, "token_budget")
    check_positive_int(num_free_blocks, "num_free_blocks", minimum=0)
    check_positive_int(block_size, "block_size")
    ### BEGIN SOLUTION
    scheduled: dict[Seq, int] = {}
    preempted: list[Seq] = []
    budget, free = token_budget, num_free_blocks
    queue = list(running)
    i = 0
    while i < len(queue):
        seq = queue[i]
        n = min(seq.num_tokens - seq.num_computed + seq.lookahead, budget)
        if n <= 0:
            i += 1
            continue
        need = max(blocks_for(seq.num_computed + n, block_size) - len(seq.block_table), 0)
        while need > free and len(queue) > i + 1:
            victim = queue.pop()
            free += len(victim.block_table)
            preempted.append(victim)
        if need > free:  # nobody left to preempt but the row itself
            preempted.append(seq)
            queue.pop(i)
            break
        scheduled[seq] = n
        budget, free = budget - n, free - need
        i += 1
    if preempted:
        return scheduled, preempted
    for seq in waiting:
        n = min(seq.num_tokens - seq.num_computed, budget)
        need = max(blocks_for(seq.num_computed + n, block_size) - len(seq.block_table), 0)
        if n <= 0 or need > free:
            break
        scheduled[seq] = n
        budget, free = budget - n, free - need
    return scheduled, preempted
    ### END SOLUTION
