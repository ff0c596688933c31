"""Prompt lookup: n-gram proposals without a draft model (notebook 06).

The proposer looks for the most recent earlier occurrence of the sequence's last n
tokens (n from n_max down to n_min) and proposes the up to gamma tokens that followed it.
The proposal is deterministic, so sampling-mode verification uses the one-hot q rule of
notebook 03: accept draft y with probability p(y), on rejection sample from p with y
removed. Only the target has a cache to roll back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.chain import verify_chain
from specdec.greedy import greedy_verify
from specdec.models.model import KVCache, Llama
from specdec.params import GREEDY, SamplingParams, check_request
from specdec.sampling import sample
from specdec.validate import check_positive_int, check_tensor


def check_lookup_args(n: int, tokens: Sequence[int] | torch.Tensor) -> None:
    check_positive_int(n, "n")
    if len(tokens) == 0:
        raise ValueError("tokens must hold at least one token")


def find_match(tokens: Sequence[int], n: int) -> int:
    """Start of the most recent earlier occurrence of the last n tokens, or -1 if none.

    "Earlier" means starting before len(tokens) - n, where the suffix itself starts; the
    occurrence may overlap the suffix. At least one token follows any match.
    """
    check_lookup_args(n, tokens)
    ### BEGIN SOLUTION
    suffix = list(tokens[len(tokens) - n :])
    for start in range(len(tokens) - n - 1, -1, -1):  # latest first; empty when n >= len(tokens)
        if list(tokens[start : start + n]) == suffix:
            return start
    return -1
    ### END SOLUTION


def propose_ngram(tokens: Sequence[int], gamma: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """Up to gamma tokens that followed the latest earlier match of the last n tokens,
    trying n = n_max, n_max - 1, ..., n_min; [] when nothing matches."""
    check_positive_int(gamma, "gamma")
    check_positive_int(n_min, "n_min")
    if n_max < n_min:
        raise ValueError(f"n_max must be >= n_min, got n_max={n_max}, n_min={n_min}")
    ### BEGIN SOLUTION
    for n in range(n_max, n_min - 1, -1):
        start = find_match(tokens, n)
        if start >= 0:
            return list(tokens[start + n : start + n + gamma])
    return []
    ### END SOLUTION


def find_match_vectorised(tokens: torch.Tensor, n: int) -> int:
    """find_match on a (L,) tensor with no Python loop over positions."""
    check_tensor(tokens, "tokens", 1, floating=False)
    check_lookup_args(n, tokens)
    ### BEGIN SOLUTION
    if n >= tokens.shape[0]:
        return -1
    windows = tokens[:-1].unfold(0, n, 1)  # (L - n, n): the windows that start before the suffix
    hits = (windows == tokens[-n:]).all(-1).nonzero()  # (matches, 1), ascending
    return int(hits[-1]) if hits.numel() else -1
    ### END SOLUTION


@torch.inference_mode()
def lookup_generate(target: Llama, prompt: list[int], n_tokens: int, gamma: int, params: SamplingParams = GREEDY,
                    generator: torch.Generator | None = None, n_max: int = 3, n_min: int = 1) -> list[int]:
    """Speculative decoding with prompt-lookup proposals: the target's output distribution
    (its greedy output at temperature 0), in fewer target forwards when the text repeats."""
    check_request(target, None, prompt, n_tokens, gamma)
    ### BEGIN SOLUTION
    cache = KVCache(target.config)
    tokens = list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    while len(tokens) - len(prompt) < n_tokens:
        P = len(tokens)
        drafts = propose_ngram(tokens, gamma, n_max, n_min)
        logits = target(torch.tensor([tokens[-1:] + drafts]), cache)[0]  # (len(drafts) + 1, V)
        if not drafts:
            committed = [int(sample(params.probs(logits[-1]), generator))]
        elif params.temperature == 0:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:  # a deterministic proposal: q is one-hot at each draft
            q = torch.nn.functional.one_hot(torch.tensor(drafts), logits.shape[-1]).to(torch.float64)
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        tokens += committed
        cache.crop(P + len(committed) - 1)
    return tokens[len(prompt) : len(prompt) + n_tokens]
    ### END SOLUTION
