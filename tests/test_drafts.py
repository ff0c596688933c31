"""Choosing a draft: exact acceptance per position, a quantised copy, and the shipped control draft."""

import json

import pytest
import torch

from specdec.checks.engine import tiny_pair
from specdec.drafts import expected_acceptance, quantised_copy
from specdec.models.checkpoints import load
from specdec.params import SamplingParams
from specdec.paths import DATA_DIR


def test_expected_acceptance_is_sum_min_and_greedy_agreement():
    target, draft = tiny_pair()
    ids = [1, 5, 9, 2, 7, 7, 3]
    got = expected_acceptance(target, draft, ids, SamplingParams(1.0))
    with torch.no_grad():
        p = torch.softmax(target(torch.tensor([ids]))[0, :-1].double(), -1)
        q = torch.softmax(draft(torch.tensor([ids]))[0, :-1].double(), -1)
    assert got.shape == (len(ids) - 1,) and torch.allclose(got, torch.minimum(p, q).sum(-1))
    greedy = expected_acceptance(target, draft, ids, SamplingParams(0.0))
    assert greedy.tolist() == (p.argmax(-1) == q.argmax(-1)).double().tolist()
    assert torch.allclose(expected_acceptance(target, target, ids, SamplingParams(0.7)), torch.ones(len(ids) - 1,
                                                                                                    dtype=torch.float64))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        expected_acceptance(target, draft, [1], SamplingParams(1.0))


def test_quantised_copy_rounds_matrices_and_leaves_the_original():
    target, _ = tiny_pair()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    four = quantised_copy(target, 4)
    for name, w in four.state_dict().items():
        assert torch.equal(before[name], target.state_dict()[name])  # the original is untouched
        if w.dim() == 2:
            scale = before[name].abs().amax(1, keepdim=True) / 7
            assert torch.allclose(w / scale, (w / scale).round(), atol=1e-4)  # on the 4-bit grid
            assert ((w - before[name]).abs() <= scale / 2 + 1e-6).all()  # round to nearest
        else:
            assert torch.equal(w, before[name])
    ids = [1, 5, 9, 2, 7]
    eight = expected_acceptance(target, quantised_copy(target, 8), ids, SamplingParams(1.0)).mean()
    two = expected_acceptance(target, quantised_copy(target, 2), ids, SamplingParams(1.0)).mean()
    assert eight > two and eight > 0.95
    with pytest.raises(ValueError, match="bits"):
        quantised_copy(target, 1)


def test_shipped_control_draft_has_the_drafts_shape_and_was_not_distilled():
    log = json.loads((DATA_DIR / "models" / "train_log.json").read_text())
    assert log["draft_undistilled"]["config"] == log["draft"]["config"]
    assert log["draft"]["distilled"] and not log["draft_undistilled"]["distilled"]
    assert load(DATA_DIR / "models" / "draft_undistilled.safetensors").num_params() == log["draft"]["params"]
