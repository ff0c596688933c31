"""The speculative decoding engine for the course's Llama models (batch 1), notebook 05.

One round: the draft proposes gamma tokens, one forward each from its KV cache
(:func:`propose`); the target scores the last committed token and the drafts in one
forward; verification decides what to commit (greedy_verify at temperature 0,
verify_chain otherwise); both caches are rolled back to what was committed
(:func:`rollback`). :func:`speculative_generate` is the loop; :func:`target_only_generate`
is plain decoding through the same cache code, so the two are timed alike.

Cache invariant at the start of a round, with P committed tokens: the target's cache
holds P - 1 entries (the last committed token is its next input); the draft's holds
P - len(pending), where ``pending`` is 1 token, or 2 after a full acceptance (its own
last draft, which it never fed, and the bonus).

:class:`specdec.recording.SpeculativeEngine` runs the same functions with every forward
recorded and derives per-round statistics from the record.
"""

from __future__ import annotations

import torch

from specdec.chain import verify_chain
from specdec.greedy import greedy_verify
from specdec.models.model import KVCache, Llama
from specdec.params import GREEDY, SamplingParams, StopCriteria, accept_until_stop, check_request
from specdec.sampling import sample


@torch.inference_mode()
def target_only_generate(target: Llama, prompt: list[int], n_tokens: int, params: SamplingParams = GREEDY,
                         generator: torch.Generator | None = None) -> list[int]:
    """Plain decoding, one target forward per token: the baseline and the reference output."""
    check_request(target, None, prompt, n_tokens, 0)
    ### BEGIN SOLUTION
    cache = KVCache(target.config)
    tokens = list(prompt)
    if len(prompt) > 1:  # everything but the last token, which is the first step's input
        target(torch.tensor([prompt[:-1]]), cache)
    for _ in range(n_tokens):
        logits = target(torch.tensor([tokens[-1:]]), cache)[0, -1]  # (V,): the token after everything fed
        tokens.append(int(sample(params.probs(logits), generator)))
    return tokens[len(prompt):]
    ### END SOLUTION


@torch.inference_mode()
def propose(draft: Llama, cache: KVCache, pending: list[int], gamma: int, params: SamplingParams = GREEDY,
            generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor]:
    """The draft's gamma proposals, one cached forward each.

    ``pending``: the committed tokens the draft has not fed yet (1, or 2 after a full
    acceptance). Returns the drafts and q (gamma, V), float64: row i is the distribution
    draft i was drawn from. The last draft is never fed, so the cache grows by
    len(pending) + gamma - 1.
    """
    ### BEGIN SOLUTION
    drafts, q_rows, feed = [], [], list(pending)
    for _ in range(gamma):
        logits = draft(torch.tensor([feed]), cache)[0, -1]  # (V,): the token after everything fed so far
        q = params.probs(logits)
        drafts.append(int(sample(q, generator)))
        q_rows.append(q)
        feed = drafts[-1:]
    return drafts, torch.stack(q_rows)
    ### END SOLUTION


def rollback(target_cache: KVCache, draft_cache: KVCache, P: int, drafts: list[int], committed: list[int]) -> list[int]:
    """Crop both caches after a round that started with P committed tokens.

    ``drafts``: the gamma proposals; ``committed``: what verification committed (the
    accepted drafts, then the target's token). Returns the draft's pending input for the
    next round.
    """
    k = len(committed) - 1  # accepted drafts
    ### BEGIN SOLUTION
    target_cache.crop(P + k)  # the prefix and the accepted drafts; the new token has no KV yet
    if k < len(drafts):
        draft_cache.crop(P + k)
        return [committed[-1]]
    return [drafts[-1], committed[-1]]  # the draft never fed its last draft: it catches up next round
    ### END SOLUTION


@torch.inference_mode()
def speculative_generate(target: Llama, draft: Llama, prompt: list[int], n_tokens: int, gamma: int,
                         params: SamplingParams = GREEDY, generator: torch.Generator | None = None) -> list[int]:
    """n_tokens new tokens, distributed exactly as target_only_generate's (equal when greedy)."""
    check_request(target, draft, prompt, n_tokens, gamma)
    ### BEGIN SOLUTION
    target_cache, draft_cache = KVCache(target.config), KVCache(draft.config)
    tokens = list(prompt)
    if len(prompt) > 1:  # everything but the last token, which is the first round's input
        target(torch.tensor([prompt[:-1]]), target_cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        logits = target(torch.tensor([tokens[-1:] + drafts]), target_cache)[0]  # (gamma + 1, V)
        if params.temperature == 0:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        tokens += committed
        pending = rollback(target_cache, draft_cache, P, drafts, committed)
    return tokens[len(prompt) : len(prompt) + n_tokens]
    ### END SOLUTION


@torch.inference_mode()
def generate_until_stop(target: Llama, draft: Llama, prompt: list[int], stop: StopCriteria, gamma: int,
                        params: SamplingParams = GREEDY,
                        generator: torch.Generator | None = None) -> tuple[list[int], KVCache, KVCache]:
    """speculative_generate with stops: (output, target cache, draft cache). The output ends at
    the first stop (tokens committed after it are dropped); both caches are rolled back to the
    output, the target's holding every token but the last, so a next turn can continue."""
    check_request(target, draft, prompt, stop.max_tokens, gamma)
    ### BEGIN SOLUTION
    target_cache, draft_cache = KVCache(target.config), KVCache(draft.config)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), target_cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    output, pending, finished = [], list(prompt[-1:]), False
    while not finished:
        P = len(prompt) + len(output)
        drafts, q = propose(draft, draft_cache, pending, gamma, params, generator)
        last = output[-1:] or list(prompt[-1:])
        logits = target(torch.tensor([last + drafts]), target_cache)[0]  # (gamma + 1, V)
        if params.temperature == 0:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        emitted, finished = accept_until_stop(output, committed, stop)
        output += emitted
        pending = rollback(target_cache, draft_cache, P, drafts, emitted)  # roll back to what was emitted
    return output, target_cache, draft_cache
    ### END SOLUTION
