"""Notebook 11, committing a step: ragged acceptance and stops inside accepted drafts."""

from __future__ import annotations

from specdec.params import accept_until_stop
from specdec.serving.sequence import Seq, SeqStatus


def commit_round(seqs: list[Seq], committed: list[list[int]], gammas: list[int]) -> list[list[int]]:
    """Apply one step's verification to every row, in place; return the tokens each row emits.

    Row b had P = ``seqs[b].num_tokens`` tokens before the step and verified ``gammas[b]``
    drafts (0: it only sampled a token); ``committed[b]`` is its k accepted drafts and then
    one token of the target. For each row:

    - emit ``committed[b]`` up to and including the first token that ends the request (its
      max_tokens-th new token, a stop token, the end of a stop sequence: notebook 05's
      ``accept_until_stop``); append them to ``output``; if it ended, set ``status`` to
      ``SeqStatus.FINISHED`` (otherwise leave it);
    - the target's cache now holds every emitted token but the last:
      ``num_computed = P + len(emitted) - 1``;
    - if the row drafted (``gammas[b] >= 1``) the draft fed its pending tokens and all but its
      last draft, so it holds ``P + min(k, gammas[b] - 1)`` valid entries: set ``draft_computed``
      to that, but never beyond ``num_computed``. With ``gammas[b] == 0`` it is unchanged.
    """
    if not len(seqs) == len(committed) == len(gammas):
        raise ValueError(f"one committed list and one gamma per row: {len(seqs)} rows, "
                         f"{len(committed)} committed, {len(gammas)} gammas")
    for b, (row, gamma) in enumerate(zip(committed, gammas)):
        if not 1 <= len(row) <= gamma + 1:
            raise ValueError(f"row {b} verified {gamma} drafts, so it commits 1 to {gamma + 1} tokens, got {len(row)}")
    ### BEGIN SOLUTION
    emitted_rows = []
    for seq, tokens, gamma in zip(seqs, committed, gammas):
        P, k = seq.num_tokens, len(tokens) - 1
        emitted, ended = accept_until_stop(seq.output, tokens, seq.stop)
        seq.output += emitted
        if ended:
            seq.status = SeqStatus.FINISHED
        seq.num_computed = P + len(emitted) - 1
        if gamma >= 1:
            seq.draft_computed = min(P + min(k, gamma - 1), seq.num_computed)
        emitted_rows.append(emitted)
    return emitted_rows
    ### END SOLUTION
