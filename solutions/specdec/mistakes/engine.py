"""Known-wrong answers to the exercises of notebook 05 (the KV cache and the loop)."""

from __future__ import annotations

import torch

from specdec.chain import verify_chain
from specdec.engine import propose, rollback
from specdec.greedy import greedy_verify
from specdec.mistakes import Mistake
from specdec.models.model import KVCache
from specdec.params import GREEDY, StopCriteria, accept_until_stop
from specdec.sampling import sample


def _rollback(target_cache, draft_cache, P, drafts, committed, *, target_len=None, catch_up=True, crop=True):
    k = len(committed) - 1
    if crop:
        target_cache.crop(min(target_len(P, k) if target_len else P + k, target_cache.length))
    if k < len(drafts) or not catch_up:
        if crop:
            draft_cache.crop(min(P + k, draft_cache.length))
        return [committed[-1]]
    return [drafts[-1], committed[-1]]


@torch.inference_mode()  # as in the notebook, where the decorator is outside the answer
def _propose(draft, cache, pending, gamma, params=GREEDY, generator=None, *, catch_up=True, feed_last=False,
             raw_softmax=False, one_at_a_time=False):
    if one_at_a_time and len(pending) > 1:  # feed the catch-up token alone first: one extra forward
        draft(torch.tensor([pending[:1]]), cache)
        pending = pending[1:]
    drafts, q_rows, feed = [], [], list(pending) if catch_up else list(pending[-1:])
    for _ in range(gamma):
        logits = draft(torch.tensor([feed]), cache)[0, -1].double()
        if raw_softmax:  # q from the raw logits, while the token follows the request's settings
            q = torch.softmax(logits, -1)
            y = int(logits.argmax()) if params.temperature == 0 else int(sample(params.probs(logits), generator))
        else:
            q = params.probs(logits)
            y = int(sample(q, generator))
        drafts.append(y)
        q_rows.append(q)
        feed = [y]
    if feed_last:
        draft(torch.tensor([feed]), cache)
    return drafts, torch.stack(q_rows)


@torch.inference_mode()
def _generate(target, draft, prompt, n_tokens, gamma, params=GREEDY, generator=None, *, roll=rollback,
              use_cache=True, always_greedy=False, prefill_all=False, extra_round=False, propose_fn=propose,
              global_rng=False):
    if global_rng:
        generator = None
    t_cache, d_cache = KVCache(target.config), KVCache(draft.config)
    tokens = list(prompt)
    head = prompt if prefill_all else prompt[:-1]
    if head:
        target(torch.tensor([head]), t_cache)
        draft(torch.tensor([head]), d_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) <= n_tokens if extra_round else len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts, q = propose_fn(draft, d_cache, pending, gamma, params, generator)
        if use_cache:
            logits = target(torch.tensor([tokens[-1:] + drafts]), t_cache)[0]
        else:  # the whole sequence again, every round
            logits = target(torch.tensor([tokens + drafts]))[0, -(gamma + 1):]
        if params.temperature == 0 or always_greedy:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        tokens += committed
        pending = roll(t_cache, d_cache, P, drafts, committed)
    return tokens[len(prompt) : len(prompt) + n_tokens]


@torch.inference_mode()  # as in the notebook, where the decorator is outside the answer
def _plain(target, prompt, n_tokens, params=GREEDY, generator=None, *, use_cache=True, prefill_all=False,
           raw_softmax=False):
    cache = KVCache(target.config)
    tokens = list(prompt)
    head = prompt if prefill_all else prompt[:-1]
    if head and use_cache:
        target(torch.tensor([head]), cache)
    for _ in range(n_tokens):
        if use_cache:
            logits = target(torch.tensor([tokens[-1:]]), cache)[0, -1]
        else:
            logits = target(torch.tensor([tokens]))[0, -1]
        if raw_softmax and params.temperature > 0:  # temperature, but no top-k / top-p
            probs = torch.softmax(logits.double() / params.temperature, -1)
        else:
            probs = params.probs(logits)
        tokens.append(int(sample(probs, generator)))
    return tokens[len(prompt):]


@torch.inference_mode()
def _draft_refilled(target, draft, prompt, n_tokens, gamma, params=GREEDY, generator=None):
    """Right output, but the draft's cache is rebuilt from scratch every round (no rollback)."""
    t_cache = KVCache(target.config)
    tokens = list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), t_cache)
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        d_cache = KVCache(draft.config)
        if len(tokens) > 1:
            draft(torch.tensor([tokens[:-1]]), d_cache)
        drafts, q = propose(draft, d_cache, tokens[-1:], gamma, params, generator)
        logits = target(torch.tensor([tokens[-1:] + drafts]), t_cache)[0]
        if params.temperature == 0:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        tokens += committed
        t_cache.crop(P + len(committed) - 1)
    return tokens[len(prompt) : len(prompt) + n_tokens]


def _target_only(target, draft, prompt, n_tokens, gamma, params=GREEDY, generator=None):
    from specdec.engine import target_only_generate

    return target_only_generate(target, prompt, n_tokens, params, generator)


def _no_rollback(target_cache, draft_cache, P, drafts, committed):
    return _rollback(target_cache, draft_cache, P, drafts, committed, crop=False)


def _no_catch_up(target_cache, draft_cache, P, drafts, committed):
    return _rollback(target_cache, draft_cache, P, drafts, committed, catch_up=False)


def _accept(output, committed, stop: StopCriteria, *, check_after_round=False, stop_before_append=False,
            sequences_in_round_only=False, max_tokens_after_round=False, max_tokens_off_by_one=0,
            never_finished=False, stop_ids_on_drafts_only=False):
    """accept_until_stop with one rule broken (each keyword is one wrong reading of the statement)."""
    text = list(output)
    for i, token in enumerate(committed):
        if stop_before_append and token in stop.stop_token_ids:
            return list(committed[:i]), not never_finished
        text.append(token)
        window = text[len(output):] if sequences_in_round_only else text
        is_stop = (token in stop.stop_token_ids and not (stop_ids_on_drafts_only and i == len(committed) - 1)) or \
            any(window[-len(seq):] == list(seq) for seq in stop.stop_sequences)
        at_max = not max_tokens_after_round and len(text) == stop.max_tokens + max_tokens_off_by_one
        if (is_stop or at_max) and not check_after_round:
            return list(committed[: i + 1]), not never_finished
    if check_after_round and (any(t in stop.stop_token_ids for t in committed) or len(text) >= stop.max_tokens):
        return list(committed), True
    if max_tokens_after_round and len(text) >= stop.max_tokens:
        return list(committed[: stop.max_tokens - len(output)]), True
    return list(committed), False


@torch.inference_mode()  # as in the notebook, where the decorator is outside the answer
def _until_stop(target, draft, prompt, stop, gamma, params=GREEDY, generator=None, *, roll_with_committed=False,
                truncate_at_end=False, accept=accept_until_stop):
    """generate_until_stop with one step wrong."""
    t_cache, d_cache = KVCache(target.config), KVCache(draft.config)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), t_cache)
        draft(torch.tensor([prompt[:-1]]), d_cache)
    output, pending, finished, everything = [], list(prompt[-1:]), False, []
    while not finished:
        P = len(prompt) + len(everything if truncate_at_end else output)
        drafts, q = propose(draft, d_cache, pending, gamma, params, generator)
        last = (everything if truncate_at_end else output)[-1:] or list(prompt[-1:])
        logits = target(torch.tensor([last + drafts]), t_cache)[0]
        if params.temperature == 0:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        if truncate_at_end:  # run to max_tokens, cut at the first stop afterwards
            everything += committed
            pending = rollback(t_cache, d_cache, P, drafts, committed)
            finished = len(everything) >= stop.max_tokens
            if finished:
                output, _ = accept([], everything, stop)
            continue
        emitted, finished = accept(output, committed, stop)
        output += emitted
        pending = rollback(t_cache, d_cache, P, drafts, committed if roll_with_committed else emitted)
    return output, t_cache, d_cache


MISTAKES = [
    Mistake("target_only_generate", "no_cache", lambda *a, **k: _plain(*a, **k, use_cache=False),
            "Use the KV cache: prefill once, then one position per step."),
    Mistake("target_only_generate", "prefill_whole_prompt", lambda *a, **k: _plain(*a, **k, prefill_all=True),
            "Prefill prompt[:-1]: the last prompt token is the first step's input."),
    Mistake("target_only_generate", "ignores_top_k", lambda *a, **k: _plain(*a, **k, raw_softmax=True),
            "Sample from params.probs(logits), which applies top-k and top-p too."),
    Mistake("rollback", "crop_one_too_many", lambda *a, **k: _rollback(*a, **k, target_len=lambda P, k: P + k + 1),
            "The new token has no KV entry yet (it is the next round's input): keep P + k entries."),
    Mistake("rollback", "crop_one_too_few", lambda *a, **k: _rollback(*a, **k, target_len=lambda P, k: P + k - 1),
            "Keep the prefix (P - 1 entries before the round) plus the last committed token and the k accepted drafts: P + k."),
    Mistake("rollback", "no_rollback", _no_rollback,
            "Crop both caches: the rejected drafts' entries must go."),
    Mistake("rollback", "no_draft_catch_up", _no_catch_up,
            "After a full acceptance the draft never fed its last draft: pending must be [drafts[-1], bonus]."),
    Mistake("rollback", "not_advanced_by_accepted", lambda *a, **k: _rollback(*a, **k, target_len=lambda P, k: P - 1),
            "The cache must advance by the accepted drafts, not return to where the round started."),
    Mistake("propose", "no_catch_up", lambda *a, **k: _propose(*a, **k, catch_up=False),
            "Feed every pending token in the first forward."),
    Mistake("propose", "feeds_last_draft", lambda *a, **k: _propose(*a, **k, feed_last=True),
            "The last draft is not fed: the cache grows by len(pending) + gamma - 1."),
    Mistake("propose", "softmax_q", lambda *a, **k: _propose(*a, **k, raw_softmax=True),
            "q must be the distribution the draft was drawn from: params.probs(logits), one-hot when greedy."),
    Mistake("speculative_generate", "no_rollback", lambda *a, **k: _generate(*a, **k, roll=_no_rollback),
            "Roll both caches back after each round."),
    Mistake("speculative_generate", "no_draft_catch_up", lambda *a, **k: _generate(*a, **k, roll=_no_catch_up),
            "After a full acceptance the draft must catch up."),
    Mistake("speculative_generate", "draft_refilled_every_round", _draft_refilled,
            "Roll the draft's cache back; do not rebuild it each round."),
    Mistake("speculative_generate", "no_cache", lambda *a, **k: _generate(*a, **k, use_cache=False),
            "Use the target's KV cache: feed only the last committed token and the drafts."),
    Mistake("speculative_generate", "target_only", _target_only,
            "Speculate: one target forward per round over gamma + 1 positions."),
    Mistake("speculative_generate", "prefill_whole_prompt", lambda *a, **k: _generate(*a, **k, prefill_all=True),
            "Prefill prompt[:-1]: the last prompt token is the first round's input."),
    Mistake("speculative_generate", "greedy_verify_when_sampling", lambda *a, **k: _generate(*a, **k, always_greedy=True),
            "At temperature > 0 verify with verify_chain."),
    Mistake("accept_until_stop", "checks_after_the_round", lambda *a, **k: _accept(*a, **k, check_after_round=True),
            "Check every committed token as you go: a stop in the middle of the round ends the output there, and the "
            "tokens after it are never emitted."),
    Mistake("accept_until_stop", "drops_the_stop_token", lambda *a, **k: _accept(*a, **k, stop_before_append=True),
            "The stop token itself is part of the output: emit it, then stop."),
    Mistake("accept_until_stop", "stop_sequence_within_round_only",
            lambda *a, **k: _accept(*a, **k, sequences_in_round_only=True),
            "A stop sequence can start in an earlier round: match it against output + the tokens of this round."),
    Mistake("accept_until_stop", "max_tokens_after_the_round", lambda *a, **k: _accept(*a, **k, max_tokens_after_round=True),
            "max_tokens is a stop like the others: the max_tokens-th new token ends the request, even if a stop "
            "token comes later in the same round."),
    Mistake("accept_until_stop", "max_tokens_one_late", lambda *a, **k: _accept(*a, **k, max_tokens_off_by_one=1),
            "Finish at the max_tokens-th new token (len(output) + emitted == max_tokens), not one after."),
    Mistake("accept_until_stop", "never_finishes", lambda *a, **k: _accept(*a, **k, never_finished=True),
            "Return finished = True when a stop ends the request, so the loop stops."),
    Mistake("accept_until_stop", "stop_ids_on_drafts_only", lambda *a, **k: _accept(*a, **k, stop_ids_on_drafts_only=True),
            "The target's own token (the correction or the bonus, last in committed) can be a stop token too."),
    Mistake("generate_until_stop", "rolls_back_with_committed", lambda *a, **k: _until_stop(*a, **k, roll_with_committed=True),
            "Roll back with the emitted tokens: the caches must not keep the KV of tokens after the stop."),
    Mistake("generate_until_stop", "truncates_at_the_end", lambda *a, **k: _until_stop(*a, **k, truncate_at_end=True),
            "Stop the loop in the round that reaches the stop; running on to max_tokens wastes forwards and leaves "
            "caches that hold tokens nobody sees."),
    Mistake("generate_until_stop", "emits_whole_round",
            lambda *a, **k: _until_stop(*a, **k, accept=lambda o, c, s: _accept(o, c, s, check_after_round=True)),
            "Cut each round's committed tokens at the first stop (accept_until_stop)."),
    Mistake("propose", "pending_one_at_a_time", lambda *a, **k: _propose(*a, **k, one_at_a_time=True),
            "Feed all pending tokens in the first forward: one forward per draft, gamma in all."),
    Mistake("speculative_generate", "extra_round", lambda *a, **k: _generate(*a, **k, extra_round=True),
            "Stop as soon as n_tokens new tokens are committed."),
    Mistake("speculative_generate", "pending_one_at_a_time",
            lambda *a, **k: _generate(*a, **k, propose_fn=lambda *b: _propose(*b, one_at_a_time=True)),
            "The draft feeds its pending tokens in one forward."),
    Mistake("speculative_generate", "global_rng", lambda *a, **k: _generate(*a, **k, global_rng=True),
            "Pass the generator on to every random draw (propose, verify_chain)."),
]
