"""The speculative decoder of notebook 10's pitfalls clinic, fixed.

A batched round of speculative sampling split into the steps where real implementations go
wrong. Notebook 10 shows each step with a classic bug (the buggy versions are catalogued in
``specdec.mistakes.pitfalls``) and the learner writes the fixed one; ``pitfall_round`` puts
the steps together, and the tests check that the round samples exactly from the target.

Shapes: B sequences, gamma drafts each, vocabulary V. Probabilities are float64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from specdec.models.model import KVCache, Llama
from specdec.params import SamplingParams


def draft_propose(logits: torch.Tensor, params: SamplingParams,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) draft logits -> (tokens (B,) long, q (B, V) float64): the draft's token per row and the
    distribution it was actually drawn from. Either fix passes: sample from params.probs(logits) and return it
    (one-hot when greedy), or keep greedy drafting and return a one-hot q at each row's argmax."""
    ### BEGIN SOLUTION
    q = params.probs(logits)
    if params.temperature == 0:
        return q.argmax(-1), q
    return torch.multinomial(q, 1, generator=generator)[:, 0], q
    ### END SOLUTION


def draft_token_probs(probs: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """probs (B, gamma, V), drafts (B, gamma) -> (B, gamma): each draft token's probability."""
    ### BEGIN SOLUTION
    return probs.gather(-1, drafts[..., None])[..., 0]
    ### END SOLUTION


def accept_drafts(p_draft: torch.Tensor, q_draft: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B, gamma) target and draft probabilities of the drafts, uniforms in [0, 1) -> (B, gamma)
    bool: draft accepted by its own test (before looking at earlier rejections)."""
    ### BEGIN SOLUTION
    return u * q_draft < p_draft
    ### END SOLUTION


def accepted_counts(accept: torch.Tensor) -> torch.Tensor:
    """(B, gamma) bool -> (B,) long: drafts accepted before each row's first rejection, on the
    tensors' device, without a Python loop or a host sync."""
    ### BEGIN SOLUTION
    return accept.long().cumprod(-1).sum(-1)
    ### END SOLUTION


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(..., V) -> (..., V): max(p - q, 0) normalised; p itself where that is all zero (p == q:
    then no rejection can happen, but a batched verifier computes every row anyway)."""
    ### BEGIN SOLUTION
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)
    ### END SOLUTION


def correction_token(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) target and draft distributions at the rejected position -> (B,) long: the replacement token."""
    ### BEGIN SOLUTION
    return torch.multinomial(residual(p, q), 1, generator=generator)[:, 0]
    ### END SOLUTION


def bonus_token(p_last: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) the target's distribution after the last draft (sampling parameters already
    applied) -> (B,) long: the bonus token of rows that accepted every draft."""
    ### BEGIN SOLUTION
    return torch.multinomial(p_last, 1, generator=generator)[:, 0]
    ### END SOLUTION


def verify_logits(target: Llama, cache: KVCache, sequence: list[int], drafts: list[int]) -> torch.Tensor:
    """One sequence: the target's (gamma + 1, V) logits for its last committed token and the
    drafts. The cache holds every committed position but the last (len(sequence) - 1)."""
    ### BEGIN SOLUTION
    tokens = torch.tensor([sequence[-1:] + drafts])
    return target(tokens, cache)[0]
    ### END SOLUTION


def pitfall_round(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator | None = None,
                  steps: Mapping[str, Callable] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole batched verification from the steps above: p (B, gamma + 1, V), q (B, gamma, V),
    drafts (B, gamma) -> (tokens (B, gamma + 1) padded with -1, counts (B,)). ``steps``: the
    functions to use, by name (a notebook passes its globals()); default: this module's."""
    step = {**globals(), **(steps or {})}
    B, gamma = drafts.shape
    u = torch.rand(B, gamma, generator=generator, dtype=p.dtype)
    probs_of = step["draft_token_probs"]
    k = step["accepted_counts"](step["accept_drafts"](probs_of(p[:, :gamma], drafts), probs_of(q, drafts), u))
    rows = torch.arange(B)
    q_k = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[rows, k]
    extra = torch.where(k < gamma, step["correction_token"](p[rows, k], q_k, generator),
                        step["bonus_token"](p[:, gamma], generator))
    tokens = torch.where(torch.arange(gamma + 1) < k[:, None], torch.cat([drafts, drafts[:, :1]], 1), -1)
    tokens[rows, k] = extra
    return tokens, k + 1


def stream_counts(tokens: torch.Tensor, n_committed: torch.Tensor, generated: torch.Tensor, eos_id: int,
                  max_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How many of each row's committed tokens to stream, and which requests are finished.

    tokens (B, gamma + 1): each row's committed tokens, then -1; n_committed (B,); generated
    (B,): tokens already streamed before this round; max_tokens (B,): each request's limit.
    A row streams up to and including its first EOS, and never past its max_tokens-th token;
    it is finished when either happened. Returns (stream (B,) long, finished (B,) bool).
    """
    ### BEGIN SOLUTION
    positions = torch.arange(tokens.shape[1], device=tokens.device)  # (gamma + 1,)
    is_eos = (tokens == eos_id) & (positions < n_committed[:, None])  # (B, gamma + 1)
    has_eos = is_eos.any(-1)
    through_eos = torch.where(has_eos, is_eos.long().argmax(-1) + 1, n_committed)  # first EOS included
    stream = torch.minimum(through_eos, max_tokens - generated)
    finished = (has_eos & (through_eos <= stream)) | (generated + stream >= max_tokens)
    return stream.long(), finished
    ### END SOLUTION
