"""Prompt lookup: the loop and vectorised searches agree, proposals follow the latest
match, and lookup decoding equals target-only greedy decoding."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specdec.checks.engine import tiny_pair
from specdec.engine import target_only_generate
from specdec.lookup import find_match, find_match_vectorised, lookup_generate, propose_ngram
from specdec.recording import SpeculativeEngine


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=20), st.integers(1, 5))
def test_vectorised_search_agrees_with_the_loop(tokens, n):
    start = find_match(tokens, n)
    assert find_match_vectorised(torch.tensor(tokens), n) == start
    if start >= 0:  # a real earlier occurrence, followed by at least one token
        assert tokens[start : start + n] == tokens[-n:] and start + n < len(tokens)
        later = [s for s in range(start + 1, len(tokens) - n) if tokens[s : s + n] == tokens[-n:]]
        assert not later


def test_proposal_edge_cases():
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3], 4) == [5, 1, 2, 3]
    assert propose_ngram([7, 7, 7], 4) == [7]
    assert propose_ngram([1, 2, 3], 2) == []
    assert propose_ngram([9], 3) == []
    with pytest.raises(ValueError, match="n_max must be >= n_min"):
        propose_ngram([1, 2], 2, n_max=1, n_min=2)
    with pytest.raises(ValueError, match="gamma must be >= 1"):
        propose_ngram([1, 2], 0)
    with pytest.raises(ValueError, match="at least one token"):
        find_match([], 1)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_lookup_decoding_equals_greedy(gamma):
    target, _ = tiny_pair()
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [5], [4, 4, 4, 4]):
        assert lookup_generate(target, prompt, 30, gamma) == target_only_generate(target, prompt, 30)


def test_engine_reports_lookup_rounds():
    target, _ = tiny_pair()
    gen = SpeculativeEngine(target).generate_lookup([1, 2, 3, 1, 2, 3, 1, 2], 30, 4)
    assert sum(r.committed for r in gen.rounds) >= 30 and len(gen.rounds) < 30
    assert all(0 <= r.accepted <= r.proposed <= 4 for r in gen.rounds)
