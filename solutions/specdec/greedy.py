"""Notebook 02, greedy verification: keep the drafts the target would have chosen.

Reference solutions of the exercises in ``grader/source/02_greedy_verify``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models.toy import ToyLM
from specdec.validate import check_positive_int, check_tensor, check_token_ids

#: Filler for the unused slots of a padded (B, gamma + 1) output.
PAD = -1


@dataclass(frozen=True)
class RoundShapes:
    """What one round does to the lengths, for committed length P, gamma drafts, k accepted."""

    target_input_len: int  # positions fed to the target: last committed token + gamma drafts
    target_logit_rows: int  # next-token distributions the target returns
    committed_len: int  # committed tokens after the round
    target_cache_len: int  # target KV entries kept after the rollback
    target_discarded: int  # target KV entries thrown away (rejected drafts)
    draft_cache_len: int  # draft KV entries kept after the rollback
    draft_catch_up: int  # tokens the draft must feed next round before its own last committed token


def round_shapes(P: int, gamma: int, k: int) -> RoundShapes:
    """Lengths around one greedy round.

    Invariant at the start of a round: the target's cache holds KV for the first P - 1
    committed tokens (the last one is its next input); the draft's for the first
    P - len(pending), pending being the committed tokens it has not fed yet (the last one,
    and after a full acceptance also its own last draft). The draft feeds the pending
    tokens and drafts 1..gamma-1 (never its own last draft), so it holds P - 1 + gamma.
    """
    check_positive_int(P, "P")
    check_positive_int(gamma, "gamma")
    check_positive_int(k, "k", minimum=0)
    if k > gamma:
        raise ValueError(f"k (accepted drafts) must be <= gamma, got k={k}, gamma={gamma}")
    ### BEGIN SOLUTION
    draft_fed = P - 1 + gamma  # cache entries the draft holds after drafting
    return RoundShapes(
        target_input_len=gamma + 1,
        target_logit_rows=gamma + 1,
        committed_len=P + k + 1,
        target_cache_len=P + k,
        target_discarded=gamma - k,
        draft_cache_len=min(P + k, draft_fed),
        draft_catch_up=1 if k == gamma else 0,
    )
    ### END SOLUTION


def greedy_verify(draft: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Greedy verification of one sequence's drafts.

    draft: (gamma,) token ids. target_logits: (gamma + 1, V), row i scoring the token
    after prefix + draft[:i]. Returns the committed tokens, (k + 1,): the k leading
    drafts that equal the target's argmax (the lowest id on a tie), then the target's own
    token at position k.
    """
    check_tensor(target_logits, "target_logits", 2, floating=True)
    check_token_ids(draft, "draft", target_logits.shape[-1], ndim=1)
    if target_logits.shape[0] != draft.shape[0] + 1:
        raise ValueError(f"target_logits needs gamma + 1 = {draft.shape[0] + 1} rows, got {target_logits.shape[0]}")
    ### BEGIN SOLUTION
    target = target_logits.argmax(-1)  # (gamma + 1,)
    matches = (draft == target[:-1]).long()  # (gamma,)
    k = int(matches.cumprod(0).sum())  # length of the leading run of matches
    return target[: k + 1]
    ### END SOLUTION


def greedy_verify_batched(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of B sequences at once, with no Python loop.

    draft: (B, gamma); target_logits: (B, gamma + 1, V). Returns tokens (B, gamma + 1),
    row b holding its committed tokens then PAD, and n_committed (B,) in 1..gamma + 1.
    The target's token is its argmax, the lowest id on a tie.
    """
    check_tensor(target_logits, "target_logits", 3, floating=True)
    check_token_ids(draft, "draft", target_logits.shape[-1], ndim=2)
    if target_logits.shape[:2] != (draft.shape[0], draft.shape[1] + 1):
        raise ValueError(
            f"target_logits must have shape (B, gamma + 1, V) = ({draft.shape[0]}, {draft.shape[1] + 1}, V) "
            f"for draft of shape {tuple(draft.shape)}, got {tuple(target_logits.shape)}"
        )
    ### BEGIN SOLUTION
    target = target_logits.argmax(-1)  # (B, gamma + 1)
    n_accepted = (draft == target[:, :-1]).long().cumprod(1).sum(1)  # (B,)
    n_committed = n_accepted + 1
    positions = torch.arange(target.shape[1], device=target.device)  # (gamma + 1,)
    tokens = torch.where(positions < n_committed[:, None], target, torch.full_like(target, PAD))
    return tokens, n_committed
    ### END SOLUTION


def speculative_greedy_generate(
    target: ToyLM, draft: ToyLM, prompt: torch.Tensor, n_tokens: int, gamma: int
) -> tuple[torch.Tensor, list[int]]:
    """Greedy speculative decoding: the same n_tokens ids as target-only greedy decoding.

    Each round: the draft proposes gamma tokens greedily; the target scores the last
    committed token and the drafts in one call of ``target.logits``; greedy_verify
    decides what to commit. Returns (tokens (n_tokens,) int64 whatever the prompt's integer dtype,
    tokens committed per round as a list of ints).
    """
    check_positive_int(n_tokens, "n_tokens")
    check_positive_int(gamma, "gamma")
    ### BEGIN SOLUTION
    tokens = prompt.clone()
    per_round = []
    while len(tokens) - len(prompt) < n_tokens:
        context = tokens.clone()
        for _ in range(gamma):
            context = torch.cat([context, draft.next_logits(context).argmax().view(1)])
        drafts = context[len(tokens):]
        scored = target.logits(context)[-(gamma + 1) :]  # (gamma + 1, V): one target call
        committed = greedy_verify(drafts, scored)
        tokens = torch.cat([tokens, committed])
        per_round.append(len(committed))
    return tokens[len(prompt) : len(prompt) + n_tokens], per_round
    ### END SOLUTION
