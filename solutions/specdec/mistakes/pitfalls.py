"""Known-wrong answers to the exercises of notebook 10: the shipped decoder's bugs
(``specdec.buggy_decoder``) and a few tempting half-fixes."""

from __future__ import annotations

import torch

from specdec import buggy_decoder as shipped
from specdec.mistakes import Mistake


def _q_from_raw_logits(logits, params, generator=None):
    token = torch.multinomial(params.probs(logits), 1, generator=generator)[:, 0]
    return token, torch.softmax(logits.double(), -1)


def _counts_all_accepted(accept):
    return accept.long().sum(-1)


def _residual_zeros(p, q):
    r = (p - q).clamp_min(0)
    return torch.nan_to_num(r / r.sum(-1, keepdim=True))


def _correction_abs(p, q, generator=None):
    return torch.multinomial((p - q).abs(), 1, generator=generator)[:, 0]


def _drafts_only(target, cache, sequence, drafts):
    return target(torch.tensor([drafts]), cache)[0]


def _stream(tokens, n_committed, generated, eos_id, max_tokens, *, drop_eos=False, no_limit=False, late=0,
            row_zero=False):
    """stream_counts with one rule broken."""
    if row_zero:  # the first request's numbers for every row
        n_committed, generated, max_tokens = (x[:1].expand_as(x) for x in (n_committed, generated, max_tokens))
    positions = torch.arange(tokens.shape[1])
    is_eos = (tokens == eos_id) & (positions < n_committed[:, None])
    has_eos = is_eos.any(-1)
    through = torch.where(has_eos, is_eos.long().argmax(-1) + (0 if drop_eos else 1), n_committed)
    stream = through if no_limit else torch.minimum(through, max_tokens - generated + late)
    finished = has_eos | (generated + stream >= max_tokens + late)
    return stream.long(), finished


def _greedy_fix_softmax_q(logits, params, generator=None):
    """A "fix" that samples when the temperature is positive but keeps the softmax as q for greedy rows."""
    q = params.probs(logits)
    if params.temperature == 0:
        return logits.argmax(-1), torch.softmax(logits.double(), -1)
    return torch.multinomial(q, 1, generator=generator)[:, 0], q


def _first_row_for_all(logits, params, generator=None):
    q = params.probs(logits[:1]).expand(logits.shape[0], -1)
    return torch.multinomial(q, 1, generator=generator)[:, 0], q


def _residual_dim_one(p, q):
    r = (p - q).clamp_min(0)
    total = r.sum(1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-300), p)


def _correction_row_zero(p, q, generator=None):
    r = (p[:1] - q[:1]).clamp_min(0)
    return torch.multinomial(r.expand(p.shape[0], -1), 1, generator=generator)[:, 0]


def _bonus_row_zero(p_last, generator=None):
    return torch.multinomial(p_last[:1], p_last.shape[0], replacement=True, generator=generator)[0]


def _bonus_global_rng(p_last, generator=None):
    return torch.multinomial(p_last, 1)[:, 0]


MISTAKES = [
    Mistake("draft_propose", "greedy_softmax_q", shipped.draft_propose,
            "a draft that always proposes its argmax has a one-hot q; reporting the sampling distribution instead makes "
            "the verifier accept with min(1, p/q) a token that is proposed every time: sample the token from q, or "
            "report the one-hot q"),
    Mistake("draft_propose", "q_from_raw_logits", _q_from_raw_logits,
            "q must be the distribution the token was drawn from, after temperature, top-k and top-p "
            "(params.probs(logits)), not the softmax of the raw logits"),
    Mistake("draft_token_probs", "batch_one_indexing", shipped.draft_token_probs,
            "index every row with its own drafts (gather along the vocabulary), not row 0's"),
    Mistake("accept_drafts", "accept_on_equality", shipped.accept_drafts,
            "accept when u * q < p, strictly: a float32 uniform is exactly 0 about once in 2^24 draws, and "
            "0 <= 0 accepts a token the target gives probability 0"),
    Mistake("accepted_counts", "item_per_position", shipped.accepted_counts,
            "no Python loop and no .item(): cumprod along the drafts, then sum"),
    Mistake("accepted_counts", "counts_every_acceptance", _counts_all_accepted,
            "count the drafts before the FIRST rejection (cumprod, then sum), not every accepted draft"),
    Mistake("residual", "no_zero_guard", shipped.residual,
            "when p == q the residual is all zero and 0 / 0 is NaN: return p for those rows"),
    Mistake("residual", "zeros_instead_of_p", _residual_zeros,
            "a row with nothing left over must still be a distribution (sampling from all zeros fails): return p there"),
    Mistake("correction_token", "resample_from_p", shipped.correction_token,
            "after a rejection, sample from the residual max(p - q, 0), not from p"),
    Mistake("correction_token", "absolute_difference", _correction_abs,
            "the residual is max(p - q, 0), not |p - q|"),
    Mistake("bonus_token", "bonus_argmax", shipped.bonus_token,
            "while sampling, the bonus is a sample from p, not its argmax"),
    Mistake("verify_logits", "no_cache", shipped.verify_logits,
            "feed only the last committed token and the drafts through the cache"),
    Mistake("verify_logits", "drafts_only", _drafts_only,
            "feed the last committed token too: its logits score the first draft, and the cache needs its K and V"),
    Mistake("stream_counts", "streams_whole_round", shipped.stream_counts,
            "a round commits up to gamma + 1 tokens at once, but nothing after the first EOS (or past max_tokens) may "
            "be streamed: cut each row at its first stop"),
    Mistake("stream_counts", "drops_the_eos", lambda *a, **k: _stream(*a, **k, drop_eos=True),
            "the EOS itself is streamed (it ends the output); stop after it, not before it"),
    Mistake("stream_counts", "ignores_max_tokens", lambda *a, **k: _stream(*a, **k, no_limit=True),
            "max_tokens counts the tokens of earlier rounds too: a row may stream at most max_tokens - generated"),
    Mistake("stream_counts", "max_tokens_one_late", lambda *a, **k: _stream(*a, **k, late=1),
            "the max_tokens-th token is the last one: stream at most max_tokens - generated"),
    Mistake("stream_counts", "row_zero_for_all", lambda *a, **k: _stream(*a, **k, row_zero=True),
            "every row has its own committed count, history and limit: use row b's values for row b"),
    Mistake("draft_propose", "greedy_keeps_softmax_q", _greedy_fix_softmax_q,
            "a greedy token is drawn from the one-hot at its argmax: report that q (params.probs gives it at "
            "temperature 0), not the softmax"),
    Mistake("draft_propose", "first_row_for_all", _first_row_for_all,
            "each row has its own logits: compute q and draw the token row by row (params.probs(logits) is batched)"),
    Mistake("residual", "normalised_over_dim_1", _residual_dim_one,
            "the shapes are (..., V): normalise over the last dimension"),
    Mistake("correction_token", "row_zero_for_all", _correction_row_zero,
            "each row samples from its own residual"),
    Mistake("bonus_token", "row_zero_for_all", _bonus_row_zero,
            "each row samples from its own p_last"),
    Mistake("bonus_token", "global_rng", _bonus_global_rng,
            "draw with the generator you are given"),
]
