"""Known-wrong answers to the exercises of notebook 02 (greedy verification)."""

from __future__ import annotations

import torch

from specdec.greedy import PAD, RoundShapes, greedy_verify, greedy_verify_batched, round_shapes
from specdec.mistakes import Mistake


def _shapes(P: int, gamma: int, k: int, **wrong) -> RoundShapes:
    right = round_shapes(P, gamma, k)
    return RoundShapes(**{**right.__dict__, **wrong})


def _count_all_matches(draft, logits):
    target = logits.argmax(-1)
    k = int((draft == target[:-1]).sum())
    return target[: k + 1]


def _no_bonus(draft, logits):
    committed = greedy_verify(draft, logits)
    return committed[:-1] if len(committed) == len(draft) + 1 else committed


def _draft_at_mismatch(draft, logits):
    committed = greedy_verify(draft, logits)
    k = len(committed) - 1
    return torch.cat([draft[: k + 1], committed[k + 1 :]]) if k < len(draft) else committed


def _off_by_one(draft, logits):
    target = logits.argmax(-1)
    k = int((draft == target[1:]).long().cumprod(0).sum())
    return target[: k + 1]


def _batched(fn):
    """A batched wrong answer built from a single-sequence one, row by row."""

    def batched(draft, logits):
        rows = [fn(d, lg) for d, lg in zip(draft, logits)]
        tokens = torch.full((draft.shape[0], draft.shape[1] + 1), PAD, dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = row
        return tokens, torch.tensor([len(r) for r in rows])

    return batched


def _batched_pad_zero(draft, logits):
    tokens, n = _batched(greedy_verify)(draft, logits)
    return tokens.clamp_min(0), n


def _batched_first_row_only(draft, logits):
    committed = greedy_verify(draft[0], logits[0])
    tokens = torch.full((draft.shape[0], draft.shape[1] + 1), PAD, dtype=torch.long)
    tokens[:, : len(committed)] = committed
    return tokens, torch.full((draft.shape[0],), len(committed))


def _int32_counts(draft, logits):
    tokens, n = greedy_verify_batched(draft, logits)
    return tokens.int(), n.int()


def _generate_extra_round(target, draft, prompt, n_tokens, gamma):
    """Right tokens, but the loop runs one round too many (its output is then trimmed)."""
    tokens, per_round = prompt.clone(), []
    while len(tokens) - len(prompt) <= n_tokens:
        context = tokens.clone()
        for _ in range(gamma):
            context = torch.cat([context, draft.next_logits(context).argmax().view(1)])
        committed = greedy_verify(context[len(tokens):], target.logits(context)[-(gamma + 1):])
        tokens = torch.cat([tokens, committed])
        per_round.append(len(committed))
    return tokens[len(prompt) : len(prompt) + n_tokens], per_round


def _generate_unverified(target, draft, prompt, n_tokens, gamma):
    tokens = prompt.clone()
    while len(tokens) - len(prompt) < n_tokens:
        tokens = torch.cat([tokens, draft.next_logits(tokens).argmax().view(1)])
    return tokens[len(prompt):], [1] * n_tokens


def _generate_no_trim(target, draft, prompt, n_tokens, gamma):
    from specdec.greedy import speculative_greedy_generate

    tokens, rounds = speculative_greedy_generate(target, draft, prompt, n_tokens, gamma)
    extra_needed = sum(rounds) - n_tokens
    if extra_needed == 0:
        return tokens, rounds
    more, _ = speculative_greedy_generate(target, draft, prompt, sum(rounds), gamma)
    return more, rounds


def _generate_one_row_short(target, draft, prompt, n_tokens, gamma):
    """Scores gamma rows instead of gamma + 1: never sees the bonus position."""
    tokens = prompt.clone()
    per_round = []
    while len(tokens) - len(prompt) < n_tokens:
        context = tokens.clone()
        for _ in range(gamma):
            context = torch.cat([context, draft.next_logits(context).argmax().view(1)])
        scored = target.logits(context)[-(gamma + 1) : -1]
        target_tokens = scored.argmax(-1)
        k = int((context[len(tokens):] == target_tokens).long().cumprod(0).sum())
        committed = target_tokens[: max(k, 1)]
        tokens = torch.cat([tokens, committed])
        per_round.append(len(committed))
    return tokens[len(prompt): len(prompt) + n_tokens], per_round


MISTAKES: list[Mistake] = [
    Mistake("round_shapes", "keeps_new_token_kv", lambda P, g, k: _shapes(P, g, k, target_cache_len=P + k + 1),
            "the target cache keeps P + k + 1 entries; the newly committed token has no KV yet (it is next round's input)."),
    Mistake("round_shapes", "no_bonus_in_length", lambda P, g, k: _shapes(P, g, k, committed_len=P + k),
            "the committed length forgets the target's own token: every round commits k + 1."),
    Mistake("round_shapes", "no_catch_up", lambda P, g, k: _shapes(P, g, k, draft_cache_len=P + k, draft_catch_up=0),
            "after a full acceptance the draft never fed its last draft token, so its cache holds P + gamma - 1 "
            "and it must catch up by one."),
    Mistake("round_shapes", "gamma_positions", lambda P, g, k: _shapes(P, g, k, target_input_len=g, target_logit_rows=g),
            "the target is fed only the gamma drafts; it also needs the last committed token (gamma + 1 positions)."),
    Mistake("greedy_verify", "counts_after_mismatch", _count_all_matches,
            "matches after the first mismatch are counted; stop at the first mismatch (a leading run)."),
    Mistake("greedy_verify", "no_bonus", _no_bonus,
            "no bonus token when every draft matches: the target's last row gives one more token for free."),
    Mistake("greedy_verify", "draft_at_mismatch", _draft_at_mismatch,
            "the draft's token is committed at the mismatch; commit the target's argmax there."),
    Mistake("greedy_verify", "off_by_one_rows", _off_by_one,
            "drafts are compared with target[1:]; row i scores the token after prefix + draft[:i], "
            "so compare draft[i] with row i."),
    Mistake("greedy_verify_batched", "counts_after_mismatch", _batched(_count_all_matches),
            "matches after the first mismatch are counted (use a cumulative product to keep the leading run)."),
    Mistake("greedy_verify_batched", "no_bonus", _batched(_no_bonus),
            "no bonus token when a row's drafts all match."),
    Mistake("greedy_verify_batched", "pad_with_zero", _batched_pad_zero,
            f"unused slots hold 0, a real token id; pad with PAD = {PAD}."),
    Mistake("greedy_verify_batched", "first_row_only", _batched_first_row_only,
            "every row gets row 0's result (batch-1 indexing)."),
    Mistake("greedy_verify_batched", "python_loop", _batched(greedy_verify),
            "right answers from a Python loop over rows: one small operation (and on a GPU one host sync) per position."),
    Mistake("speculative_greedy_generate", "unverified_draft", _generate_unverified,
            "the draft's tokens are committed without the target's verification."),
    Mistake("speculative_greedy_generate", "no_trim", _generate_no_trim,
            "the last round can commit past n_tokens; return exactly n_tokens ids."),
    Mistake("speculative_greedy_generate", "one_row_short", _generate_one_row_short,
            "the target's last row (the bonus position) is dropped: score gamma + 1 positions."),
    Mistake("greedy_verify_batched", "int32_outputs", _int32_counts,
            "Return long (int64) tensors, the dtype of token ids."),
    Mistake("speculative_greedy_generate", "extra_round", _generate_extra_round,
            "Stop as soon as you have n_tokens new tokens: the loop condition is < n_tokens."),
]
