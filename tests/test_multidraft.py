"""Multi-draft verification at one node (notebook 07, 4b): exact by enumeration, and the stale rule is not."""

import pytest
import torch

from specdec.multidraft import node_outcome


def pairs(seed: int, V: int, spread: float):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g, dtype=torch.float64) * spread
    p = torch.softmax(logits, 0)
    q = torch.softmax(logits + torch.randn(V, generator=g, dtype=torch.float64), 0)
    return p, q


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_residual_and_one_hot_rules_output_p(seed, k):
    p, q = pairs(seed, V=5, spread=1.0 + seed)
    for rule, replacement in (("residual", True), ("residual", False), ("one_hot", True), ("one_hot", False)):
        out, accepted = node_outcome(p, q, k, rule, replacement)
        assert torch.allclose(out, p, atol=1e-12), (rule, replacement)
        assert 0 <= accepted <= 1


def test_acceptance_of_one_child_is_notebook_03s():
    p, q = pairs(0, V=6, spread=2.0)
    assert node_outcome(p, q, 1, "residual")[1] == pytest.approx(float(torch.minimum(p, q).sum()), abs=1e-12)
    assert node_outcome(p, q, 1, "one_hot")[1] == pytest.approx(float((p * q).sum()), abs=1e-12)


def test_more_children_accept_more_and_without_replacement_most():
    p, q = pairs(1, V=6, spread=2.0)
    accepted = [node_outcome(p, q, k, "residual")[1] for k in (1, 2, 3)]
    assert accepted[0] < accepted[1] < accepted[2]
    assert node_outcome(p, q, 3, "residual", replacement=False)[1] > accepted[2]


def test_stale_residual_is_not_exact_from_two_children():
    p, q = pairs(1, V=6, spread=2.0)
    assert torch.allclose(node_outcome(p, q, 1, "stale")[0], p, atol=1e-12)
    out, _ = node_outcome(p, q, 2, "stale")
    assert float((out - p).abs().sum()) / 2 > 0.05


def test_bad_input():
    p, q = pairs(0, V=4, spread=1.0)
    with pytest.raises(ValueError, match="rule must be one of"):
        node_outcome(p, q, 2, "greedy")
    with pytest.raises(ValueError, match="k must be >= 1"):
        node_outcome(p, q, 0, "residual")
    with pytest.raises(ValueError, match="k must be >= 1"):
        node_outcome(p, q, 5, "residual", replacement=False)
    with pytest.raises(ValueError, match="one shape"):
        node_outcome(p, q[:3], 1, "residual")
