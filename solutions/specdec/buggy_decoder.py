"""The "production" speculative decoder of notebook 10, as it was shipped: every function has a bug
that real implementations have had. The fixed versions are in ``specdec.pitfalls``; the tests
prove each bug is caught (``specdec.mistakes.pitfalls`` catalogues these functions)."""

from __future__ import annotations

import torch

from specdec.models.model import KVCache, Llama
from specdec.params import SamplingParams


def draft_propose(logits: torch.Tensor, params: SamplingParams,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) draft logits -> (tokens (B,), q (B, V))."""
    q = params.probs(logits)
    return q.argmax(-1), q  # greedy drafting: propose the draft's best guess, it gets accepted more often


def draft_token_probs(probs: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """probs (B, gamma, V), drafts (B, gamma) -> (B, gamma)."""
    gamma = drafts.shape[1]
    return probs[0, torch.arange(gamma), drafts[0]].expand(drafts.shape[0], gamma)


def accept_drafts(p_draft: torch.Tensor, q_draft: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B, gamma) -> (B, gamma) bool."""
    return u * q_draft <= p_draft


def accepted_counts(accept: torch.Tensor) -> torch.Tensor:
    """(B, gamma) bool -> (B,) long."""
    counts = []
    for row in accept:
        k = 0
        for i in range(row.shape[0]):
            if not row[i].item():
                break
            k += 1
        counts.append(k)
    return torch.tensor(counts, device=accept.device)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(..., V) -> (..., V)."""
    r = (p - q).clamp_min(0)
    return r / r.sum(-1, keepdim=True)


def correction_token(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V), (B, V) -> (B,)."""
    return torch.multinomial(p, 1, generator=generator)[:, 0]  # the target has the final word


def bonus_token(p_last: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) -> (B,)."""
    return p_last.argmax(-1)


def verify_logits(target: Llama, cache: KVCache, sequence: list[int], drafts: list[int]) -> torch.Tensor:
    """-> (gamma + 1, V)."""
    logits = target(torch.tensor([sequence + drafts]))
    return logits[0, -(len(drafts) + 1):]


def stream_counts(tokens: torch.Tensor, n_committed: torch.Tensor, generated: torch.Tensor, eos_id: int,
                  max_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, gamma + 1), (B,), (B,), int, (B,) -> (stream (B,), finished (B,))."""
    finished = (tokens == eos_id).any(-1) | (generated + n_committed >= max_tokens)
    return n_committed, finished  # stream the round, then end the requests that are done
