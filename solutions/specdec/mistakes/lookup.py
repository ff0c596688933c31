"""Known-wrong answers to the exercises of notebook 06 (prompt lookup)."""

from __future__ import annotations

import torch

from specdec.greedy import greedy_verify
from specdec.lookup import find_match, propose_ngram
from specdec.mistakes import Mistake
from specdec.models.model import KVCache
from specdec.params import GREEDY, check_request
from specdec.sampling import sample


def _find(tokens, n, *, latest=True, last_start=lambda L, n: L - n - 1):
    suffix = list(tokens[len(tokens) - n :])
    starts = range(last_start(len(tokens), n), -1, -1)
    for start in starts if latest else reversed(starts):
        if start >= 0 and list(tokens[start : start + n]) == suffix and len(suffix) == n:
            return start
    return -1


def _propose(tokens, gamma, n_max=3, n_min=1, *, itself=False, shortest_first=False, cap=True, fallback=True):
    order = range(n_min, n_max + 1) if shortest_first else range(n_max, n_min - 1, -1)
    for n in order:
        start = find_match(tokens, n)
        if start >= 0:
            first = start if itself else start + n
            return list(tokens[first : first + gamma]) if cap else list(tokens[first:])
        if not fallback:
            return []
    return []


def _vectorised_loop(tokens, n):
    return find_match([t for t in tokens], n)  # one tensor element at a time


def _vectorised_with_suffix(tokens, n):
    if n > tokens.shape[0]:
        return -1
    hits = (tokens.unfold(0, n, 1) == tokens[-n:]).all(-1).nonzero()
    return int(hits[-1]) if hits.numel() else -1


@torch.no_grad()
def _generate(target, prompt, n_tokens, gamma, params=GREEDY, generator=None, n_max=3, n_min=1, *, crop=True,
              greedy_always=False, resample_from_p=False, extra_round=False):
    check_request(target, None, prompt, n_tokens, gamma)
    cache = KVCache(target.config)
    tokens = list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    while len(tokens) - len(prompt) < n_tokens + (1 if extra_round else 0):
        P = len(tokens)
        drafts = propose_ngram(tokens, gamma, n_max, n_min)
        logits = target(torch.tensor([tokens[-1:] + drafts]), cache)[0]
        if params.temperature == 0 or greedy_always:
            committed = greedy_verify(torch.tensor(drafts, dtype=torch.long), logits).tolist()
        else:
            p = params.probs(logits)
            committed = []
            for i, y in enumerate(drafts):
                if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(p[i, y]):
                    committed.append(y)
                    continue
                rest = p[i] if resample_from_p else p[i].clone().index_fill_(0, torch.tensor([y]), 0.0)
                committed.append(int(sample(rest / rest.sum(), generator)))
                break
            else:
                committed.append(int(sample(p[len(drafts)], generator)))
        tokens += committed
        if crop:
            cache.crop(P + len(committed) - 1)
        else:
            cache.crop(min(cache.length, P + len(drafts)))
    return tokens[len(prompt) : len(prompt) + n_tokens]


MISTAKES = [
    Mistake("find_match", "earliest_match", lambda t, n: _find(t, n, latest=False),
            "Search backwards: the most recent earlier occurrence is the best predictor."),
    Mistake("find_match", "includes_the_suffix", lambda t, n: _find(t, n, last_start=lambda L, n: L - n),
            "The suffix itself is not an earlier occurrence: start at len(tokens) - n - 1."),
    Mistake("find_match", "no_overlap", lambda t, n: _find(t, n, last_start=lambda L, n: L - 2 * n),
            "A match may overlap the suffix (think of a run of one token)."),
    Mistake("propose_ngram", "returns_the_match", lambda *a, **k: _propose(*a, **k, itself=True),
            "Propose what follows the match, not the match itself."),
    Mistake("propose_ngram", "shortest_first", lambda *a, **k: _propose(*a, **k, shortest_first=True),
            "Try the longest n first."),
    Mistake("propose_ngram", "no_gamma_cap", lambda *a, **k: _propose(*a, **k, cap=False),
            "Propose at most gamma tokens."),
    Mistake("propose_ngram", "no_fallback", lambda *a, **k: _propose(*a, **k, fallback=False),
            "When the n_max-gram has no match, try shorter ones down to n_min."),
    Mistake("find_match_vectorised", "python_loop", _vectorised_loop,
            "No Python loop over positions: compare all windows at once."),
    Mistake("find_match_vectorised", "tolist_then_loop", lambda tokens, n: find_match(tokens.tolist(), n),
            "Converting to a list and looping is still a loop over positions."),
    Mistake("find_match_vectorised", "includes_the_suffix", _vectorised_with_suffix,
            "Windows must start before the suffix: unfold tokens[:-1]."),
    Mistake("lookup_generate", "no_rollback", lambda *a, **k: _generate(*a, **k, crop=False),
            "Crop the target's cache to P + k after each round."),
    Mistake("lookup_generate", "greedy_when_sampling", lambda *a, **k: _generate(*a, **k, greedy_always=True),
            "At temperature > 0 verify by the one-hot rule, not by argmax."),
    Mistake("lookup_generate", "resample_from_p", lambda *a, **k: _generate(*a, **k, resample_from_p=True),
            "On a rejection, sample from p with the rejected draft removed (the residual of a one-hot q)."),
    Mistake("lookup_generate", "extra_round", lambda *a, **k: _generate(*a, **k, extra_round=True),
            "Stop as soon as n_tokens new tokens are committed: the loop condition is < n_tokens."),
]
