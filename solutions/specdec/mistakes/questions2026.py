"""Known-wrong answers to the exercises of notebook 15 (parallel drafting, targets with state, a drafter's life)."""

from __future__ import annotations

import math

import torch

from specdec.chain import expected_committed_length, verify_drafts
from specdec.engine import propose, rollback
from specdec.mistakes import Mistake
from specdec.models.model import KVCache
from specdec.questions2026.hybrid import HybridCache
from specdec.questions2026.parallel import mask_id
from specdec.sampling import sample

# -- parallel_training_mask ------------------------------------------------------------------------------------


def _mask(positions, depths, *, real_upto=0, own_chain=True, self_too=True, later_own=False, by_order=False,
          by_position=False):
    positions, depths = positions.long(), depths.long()
    N = len(positions)
    if by_order:
        return torch.ones(N, N, dtype=torch.bool).tril()
    if by_position:
        return positions[None, :] <= positions[:, None]
    anchors = positions - depths
    real = (depths == 0)[None, :]
    sees_real = real & (positions[None, :] <= anchors[:, None] + real_upto)
    same = ~real & (anchors[None, :] == anchors[:, None])
    if later_own:
        own = same
    elif self_too:
        own = same & (positions[None, :] <= positions[:, None])
    else:
        own = same & (positions[None, :] < positions[:, None])
    if not own_chain:
        own = same & (positions[None, :] == positions[:, None])
    return sees_real | own


MASK_MISTAKES = [
    Mistake("parallel_training_mask", "causal_by_order", lambda p, d: _mask(p, d, by_order=True),
            "A causal mask over the sequence order lets a mask see every real token (the answers it must predict) "
            "and the masks of other chains. Decide from positions and depths: anchor = position - depth."),
    Mistake("parallel_training_mask", "causal_by_position", lambda p, d: _mask(p, d, by_position=True),
            "Comparing positions alone lets a mask at position p see the real tokens up to p, which include the token "
            "it predicts: a mask sees real tokens only up to its anchor, position - depth."),
    Mistake("parallel_training_mask", "independent_masks", lambda p, d: _mask(p, d, own_chain=False),
            "At inference a mask follows the earlier masks of its chain under a causal mask and attends to them; "
            "training must show it the same: its own chain's masks up to itself."),
    Mistake("parallel_training_mask", "not_itself", lambda p, d: _mask(p, d, self_too=False),
            "Every token attends to itself (the diagonal), masks included, as at inference."),
    Mistake("parallel_training_mask", "anchor_plus_one", lambda p, d: _mask(p, d, real_upto=1),
            "Off by one: the anchor is position - depth, the last real token the chain sees. One more real token is "
            "the first answer of the chain."),
    Mistake("parallel_training_mask", "anchor_minus_one", lambda p, d: _mask(p, d, real_upto=-1),
            "Off by one: the anchor itself (position - depth) is real and visible; at inference it is the last fed "
            "token."),
    Mistake("parallel_training_mask", "whole_chain", lambda p, d: _mask(p, d, later_own=True),
            "A mask must not see the later masks of its own chain: inference is causal."),
]

# -- parallel_propose -------------------------------------------------------------------------------------------


def _propose(drafter, cache, feed, gamma, params=None, generator=None, *, masks=None, read=None, crop="feed",
             full_vocab=False, argmax=False, raw=False, slice_after=False):
    from specdec.params import GREEDY

    params = params or GREEDY
    B, n = feed.shape
    start = cache.length
    count = gamma - 1 if masks is None else masks(gamma)
    tail = torch.full((B, count), mask_id(drafter), dtype=torch.long)
    logits = drafter(torch.cat([feed.long(), tail], 1), cache)
    if crop == "feed":
        cache.crop(start + n)
    elif crop == "start":
        cache.crop(start)
    first = n - 1 if read is None else read(n)
    logits = logits[:, first : first + gamma]
    if slice_after:
        q = params.probs(logits)[..., : mask_id(drafter)]
    else:
        logits = logits if full_vocab else logits[..., : mask_id(drafter)]
        q = torch.softmax(logits.double(), -1) if raw else params.probs(logits)
    drafts = q.argmax(-1) if argmax else sample(q, generator)
    return drafts, q


def _autoregressive(drafter, cache, feed, gamma, params=None, generator=None):
    from specdec.params import GREEDY

    params = params or GREEDY
    drafts, qs = [], []
    logits = drafter(feed.long(), cache)[:, -1]
    for j in range(gamma):
        q = params.probs(logits[..., : mask_id(drafter)])
        token = sample(q, generator)
        drafts.append(token)
        qs.append(q)
        if j < gamma - 1:
            logits = drafter(token[:, None], cache)[:, -1]
    cache.crop(cache.length - (gamma - 1))
    return torch.stack(drafts, 1), torch.stack(qs, 1)


PROPOSE_MISTAKES = [
    Mistake("parallel_propose", "gamma_masks", lambda *a: _propose(*a, masks=lambda g: g, read=lambda n: n),
            "gamma - 1 masks, not gamma: draft 1 comes from the output at the last fed token, which already predicts "
            "the next token; reading the masks only shifts every draft one place too far."),
    Mistake("parallel_propose", "no_crop", lambda *a: _propose(*a, crop=None),
            "After the forward the cache still holds the masks' keys and values: crop it back to what it held plus "
            "the fed tokens, or the next round's real tokens land after stale masks."),
    Mistake("parallel_propose", "crop_to_start", lambda *a: _propose(*a, crop="start"),
            "Crop to the length before the call plus n: the fed tokens are real and stay; only the masks go."),
    Mistake("parallel_propose", "mask_in_vocab", lambda *a: _propose(*a, full_vocab=True),
            "The mask is the drafter's last id and is never a draft: q covers ids 0..mask_id - 1."),
    Mistake("parallel_propose", "probs_then_slice", lambda *a: _propose(*a, slice_after=True),
            "Slice the logits to the real ids before params.probs: a distribution over all ids with the mask's column "
            "dropped no longer sums to 1 (and is all zeros where the mask was the argmax)."),
    Mistake("parallel_propose", "argmax_when_sampling", lambda *a: _propose(*a, argmax=True),
            "At temperature > 0 draw each draft from its q; the argmax is right only when greedy, and verification "
            "is exact only when the drafts follow q."),
    Mistake("parallel_propose", "ignores_params", lambda *a: _propose(*a, raw=True),
            "Apply params.probs to the logits (temperature, top-k, top-p): q must be the distribution the drafts "
            "are drawn from at the request's settings."),
    Mistake("parallel_propose", "autoregressive", _autoregressive,
            "This drafts token by token, feeding each draft back: gamma forwards and another q. A parallel drafter "
            "feeds gamma - 1 mask tokens and reads every draft from one forward."),
]

# -- acceptance_by_position -----------------------------------------------------------------------------------------


def _alphas(accepted, proposed, *, unconditional=False, ignore_accepted=False, ignore_proposed=False, empty=math.nan):
    out = []
    for k in range(1, max(proposed) + 1):
        if unconditional:
            reached = len(accepted)
        elif ignore_accepted:
            reached = sum(1 for p in proposed if p >= k)
        elif ignore_proposed:
            reached = sum(1 for a in accepted if a >= k - 1)
        else:
            reached = sum(1 for a, p in zip(accepted, proposed) if p >= k and a >= k - 1)
        passed = sum(1 for a in accepted if a >= k)
        out.append(passed / reached if reached else empty)
    return out


def _constant(accepted, proposed):
    rate = sum(accepted) / sum(proposed)
    return [rate] * max(proposed)


ACCEPTANCE_MISTAKES = [
    Mistake("acceptance_by_position", "unconditional", lambda a, p: _alphas(a, p, unconditional=True),
            "That is P(accepted >= k), the chance of getting that far, not alpha_k: divide by the rounds that "
            "reached draft k (accepted the first k - 1 and proposed at least k)."),
    Mistake("acceptance_by_position", "ignores_earlier", lambda a, p: _alphas(a, p, ignore_accepted=True),
            "A round that rejected an earlier draft never tried draft k: count only rounds that accepted the first "
            "k - 1."),
    Mistake("acceptance_by_position", "ignores_short_rounds", lambda a, p: _alphas(a, p, ignore_proposed=True),
            "A round that proposed fewer than k drafts never offered draft k (a request's last round can be "
            "shorter): it is not in alpha_k's denominator."),
    Mistake("acceptance_by_position", "zero_when_unreached", lambda a, p: _alphas(a, p, empty=0.0),
            "Where no round reached draft k nothing was measured: return float('nan'), not 0."),
    Mistake("acceptance_by_position", "one_rate", _constant,
            "One acceptance rate for every position hides what this exercise is about: acceptance depends on the "
            "position (and falls faster for a parallel drafter)."),
]

# -- best_gamma_by_position ----------------------------------------------------------------------------------------------------


def _best(alphas, draft_cost, verify_cost, *, constant=False, free_draft=False, per_token=False, largest=False,
          no_bonus=False, verify_fixed=False, unscaled=False):
    best = (0, -math.inf)
    for g in range(1, len(alphas) + 1):
        rates = [alphas[0]] * g if constant else alphas[:g]
        tokens = expected_committed_length(rates) - (1 if no_bonus else 0)
        drafting = 0.0 if free_draft else (g * draft_cost(1) if per_token else draft_cost(g))
        verify = verify_cost(0) if verify_fixed else verify_cost(g)
        speedup = tokens * (1.0 if unscaled else verify_cost(0)) / (drafting + verify)
        if speedup > best[1] or (largest and speedup == best[1]):
            best = (g, speedup)
    return best


GAMMA_MISTAKES = [
    Mistake("best_gamma_by_position", "constant_alpha", lambda *a: _best(*a, constant=True),
            "alphas[k - 1] is the acceptance of draft k: use each position's own, not alpha_1 for all (a parallel "
            "drafter's falls with k)."),
    Mistake("best_gamma_by_position", "free_drafting", lambda *a: _best(*a, free_draft=True),
            "Drafting costs time: the round costs draft_cost(g) + verify_cost(g)."),
    Mistake("best_gamma_by_position", "per_token_draft", lambda *a: _best(*a, per_token=True),
            "Call draft_cost(g): a parallel drafter's g drafts cost one pass, not g times one draft."),
    Mistake("best_gamma_by_position", "ties_to_largest", lambda *a: _best(*a, largest=True),
            "Ties go to the smaller gamma (the same speedup for less work): keep the first best, replace it only "
            "when strictly better."),
    Mistake("best_gamma_by_position", "no_bonus", lambda *a: _best(*a, no_bonus=True),
            "A round commits its accepted drafts plus one token of the target's: E_g = 1 + sum of the prefix "
            "products."),
    Mistake("best_gamma_by_position", "verify_fixed", lambda *a: _best(*a, verify_fixed=True),
            "Verifying g drafts is a forward over g + 1 positions: verify_cost(g), not verify_cost(0)."),
    Mistake("best_gamma_by_position", "unscaled", lambda *a: _best(*a, unscaled=True),
            "The speedup compares with target-only decoding, verify_cost(0) per token: multiply by it."),
]

# -- select_states ----------------------------------------------------------------------------------------------------


def _select(per_position, accepted, *, shift=0, last=False, first_row=False):
    out = []
    for states in per_position:
        rows, T = states.shape[0], states.shape[1]
        if last:
            index = torch.full((rows,), T - 1)
        elif first_row:
            index = accepted[:1].long().expand(rows)
        else:
            index = (accepted.long() + shift).clamp(0, T - 1)
        out.append(states[torch.arange(rows), index])
    return out


STATE_MISTAKES = [
    Mistake("select_states", "plus_one", lambda s, a: _select(s, a, shift=1),
            "One position too far: the state after fed position k + 1 has read draft k + 1, which was rejected (or "
            "is the correction the next round feeds). Keep the state after position k = accepted."),
    Mistake("select_states", "last_position", lambda s, a: _select(s, a, last=True),
            "The state after the last verified position has read every draft, rejected ones included: keep the state "
            "after the last accepted draft."),
    Mistake("select_states", "minus_one", lambda s, a: _select(s, a, shift=-1),
            "One position short: position 0 is the last committed token, so k accepted drafts end at position k."),
    Mistake("select_states", "one_row", lambda s, a: _select(s, a, first_row=True),
            "Rows accept different numbers of drafts: index each row with its own count."),
]

# -- hybrid_speculative_generate ------------------------------------------------------------------------------------


@torch.inference_mode()
def _hybrid(target, draft, prompt, n_tokens, gamma, params=None, generator=None, *, keep="accepted"):
    from specdec.params import GREEDY

    params = params or GREEDY
    cache, draft_cache = HybridCache(target.config), KVCache(draft.config)
    tokens = list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        before = [s.clone() for s in cache.states]
        logits, per_position = target(torch.tensor([tokens[-1:] + drafts]), cache, keep_states=True)
        committed = verify_drafts(drafts, q, logits[0], params, generator)
        k = len(committed) - 1
        if keep == "accepted":
            cache.states = [s[:, k] for s in per_position]
        elif keep == "next":
            cache.states = [s[:, min(k + 1, gamma)] for s in per_position]
        elif keep == "before":
            cache.states = before
        tokens += committed
        pending = rollback(cache.kv, draft_cache, P, drafts, committed)
    return tokens[len(prompt) : len(prompt) + n_tokens]


@torch.inference_mode()
def _hybrid_prefill_all(target, draft, prompt, n_tokens, gamma, params=None, generator=None):
    """Prefills every prompt token, then feeds the last one again as the first round's input."""
    from specdec.params import GREEDY

    params = params or GREEDY
    cache, draft_cache = HybridCache(target.config), KVCache(draft.config)
    target(torch.tensor([prompt]), cache)
    draft(torch.tensor([prompt]), draft_cache)
    tokens, pending = list(prompt), list(prompt[-1:])
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        logits, per_position = target(torch.tensor([tokens[-1:] + drafts]), cache, keep_states=True)
        committed = verify_drafts(drafts, q, logits[0], params, generator)
        cache.states = [s[:, len(committed) - 1] for s in per_position]
        cache.kv.crop(cache.kv.length - (len(drafts) + 1) + len(committed))
        draft_cache.crop(min(draft_cache.length, P + len(committed)))
        tokens += committed
        pending = [committed[-1]]
    return tokens[len(prompt) : len(prompt) + n_tokens]


def _greedy_verify_only(target, draft, prompt, n_tokens, gamma, params=None, generator=None):
    from specdec.params import GREEDY

    return _hybrid(target, draft, prompt, n_tokens, gamma, GREEDY, generator)


HYBRID_MISTAKES = [
    Mistake("hybrid_speculative_generate", "no_state_rollback", lambda *a: _hybrid(*a, keep="last"),
            "The KV cache was cropped but the recurrent state kept every verified draft, rejected ones included: "
            "keep the state after the last accepted draft."),
    Mistake("hybrid_speculative_generate", "state_one_too_far", lambda *a: _hybrid(*a, keep="next"),
            "The state after position k + 1 has read a draft that was rejected: keep the one after position k."),
    Mistake("hybrid_speculative_generate", "state_before_round", lambda *a: _hybrid(*a, keep="before"),
            "Restoring the state from before the round forgets the tokens it committed: either keep the state after "
            "the last accepted draft, or restore and re-feed the last committed token and the accepted drafts."),
    Mistake("hybrid_speculative_generate", "prefill_everything", _hybrid_prefill_all,
            "The prefill takes every prompt token but the last: the last is the first round's input, which the "
            "target then reads once, not twice."),
    Mistake("hybrid_speculative_generate", "greedy_always", _greedy_verify_only,
            "At temperature > 0 verify with the request's params: verify_drafts(drafts, q, logits, params, "
            "generator)."),
]

# -- committed_logprobs ---------------------------------------------------------------------------------------------


def _logprobs(logits, committed, n_committed, temperature=None, *, probs=False, multiply=False, shift=0,
              single=False, raw_logits=False, log_of_probs=False):
    out = []
    scale = 1.0 if temperature is None else temperature
    for b in range(logits.shape[0]):
        n = int(n_committed[b])
        x = logits[b].to(torch.float32 if single else torch.float64)
        x = x * scale if multiply else x / scale
        rows = x if raw_logits else (torch.softmax(x, -1) if probs else torch.log_softmax(x, -1))
        rows = torch.softmax(x, -1).log() if log_of_probs else rows
        index = (torch.arange(n) + shift).clamp(0, logits.shape[1] - 1)
        out.append(rows[index].gather(-1, committed[b, :n].long()[:, None]).squeeze(-1).to(torch.float64))
    return out


LOGPROB_MISTAKES = [
    Mistake("committed_logprobs", "probabilities", lambda *a: _logprobs(*a, probs=True),
            "Probabilities, not log-probabilities: take log_softmax."),
    Mistake("committed_logprobs", "logits", lambda *a: _logprobs(*a, raw_logits=True),
            "A logit is not a log-probability: normalise over the vocabulary (log_softmax)."),
    Mistake("committed_logprobs", "multiplied", lambda *a: _logprobs(*a, multiply=True),
            "Temperature divides the logits: softmax(logits / temperature)."),
    Mistake("committed_logprobs", "ignores_temperature", lambda l, c, n, t=None: _logprobs(l, c, n, None),
            "A temperature was given: the log-probabilities asked for are those of softmax(logits / temperature), "
            "the distribution the token was drawn from."),
    Mistake("committed_logprobs", "next_position", lambda *a: _logprobs(*a, shift=1),
            "Off by one: position j of the verify logits (the last committed token, then draft j) scores committed "
            "token j, the token after it."),
    Mistake("committed_logprobs", "log_of_softmax", lambda *a: _logprobs(*a, log_of_probs=True),
            "The log of a softmax underflows: a token a few hundred logits below the best has probability 0 in "
            "float64 and log-probability -inf. Take log_softmax, which subtracts the log-sum-exp and stays finite."),
    Mistake("committed_logprobs", "float32", lambda *a: _logprobs(*a, single=True),
            "Computed in float32: the statement asks for float64 (an RL ratio exp(new - old) amplifies rounding)."),
]

MISTAKES = (MASK_MISTAKES + PROPOSE_MISTAKES + ACCEPTANCE_MISTAKES + GAMMA_MISTAKES + STATE_MISTAKES
            + HYBRID_MISTAKES + LOGPROB_MISTAKES)
