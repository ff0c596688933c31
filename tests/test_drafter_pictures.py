"""Notebook 12's pictures show what the package computes: Medusa's tree holds medusa_candidates' tokens in
flatten_tree's order beside tree_mask, EAGLE's arrows pair f_t with x_(t+1) (eagle_inputs), and EAGLE-2's
kept and expanded nodes are those expand_dynamic_tree chose. No warnings while drawing."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402

from specdec.drafters.dynamic_tree import expand_dynamic_tree  # noqa: E402
from specdec.drafters.medusa import medusa_candidates  # noqa: E402
from specdec.tree import flatten_tree, tree_mask  # noqa: E402
from specdec.viz.drafters import (  # noqa: E402
    TOY_DRAFT,
    draw_dynamic_tree,
    draw_eagle_shift,
    draw_medusa_tree,
    dynamic_tree_nodes,
    toy_expand,
    visible,
)

pytestmark = pytest.mark.filterwarnings("error")


def boxed_texts(ax) -> list[str]:
    """The labels of the boxed nodes, in drawing order."""
    return [t.get_text() for t in ax.texts if t.get_bbox_patch() is not None]


def test_medusa_tree_shows_the_candidates_in_flattened_order_and_the_mask():
    choices = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    head_logits = torch.tensor([[0.1, 0.9, 0.3, 0.5, 0.0], [0.7, 0.2, 0.8, 0.1, 0.4], [0.0, 0.3, 0.2, 0.9, 0.1]])
    words = ["a", " ", "\n", "d", "e"]
    fig = draw_medusa_tree(4, head_logits, choices, label=words.__getitem__, focus=5)
    tree_ax, mask_ax = fig.axes
    assert boxed_texts(tree_ax) == [visible(words[t]) for t in medusa_candidates(4, head_logits, choices)]
    assert (mask_ax.images[0].get_array() == tree_mask(list(flatten_tree(choices).parents)).float().numpy()).all()
    assert "row 5 sees its path [0, 1, 5]" in mask_ax.get_title()  # node 5 is (0, 1): root, (0,), itself
    plt.close(fig)


def test_eagle_picture_pairs_each_feature_with_the_next_token():
    fig = draw_eagle_shift(4)
    for ax, shift in zip(fig.axes, (1, 0)):  # EAGLE, then the off-by-one
        token_arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch) and p.get_linestyle() == "--"]
        pairs = sorted((round(p._posA_posB[1][0] - 0.2), round(p._posA_posB[0][0] - 0.15)) for p in token_arrows)
        assert pairs == [(t, t + shift) for t in range(1, 5)]
    plt.close(fig)


def test_dynamic_tree_marks_what_eagle2_expanded_and_kept():
    nodes = dynamic_tree_nodes(toy_expand, 3, 2, 6)
    assert len(nodes) == 2 + 2 * 2 * 2  # the root's 2 children, then 2 parents x 2 children per step
    assert {n.path for n in nodes if n.kept} == set(expand_dynamic_tree(toy_expand, 3, 2, 6))
    assert {n.path for n in nodes if n.expanded} == {(0,), (1,), (0, 3), (1, 3)}
    deep = next(n for n in nodes if n.path == (0, 3, 6))
    assert math.isclose(deep.prob, 0.1) and math.isclose(deep.value, 0.7 * 0.9 * 0.1)  # a path product
    assert deep.kept and not next(n for n in nodes if n.path == (0, 4)).kept  # deeper but likelier wins
    fig = draw_dynamic_tree()
    green = [t.get_text().split("\n")[0] for t in fig.axes[0].texts
             if t.get_bbox_patch() and to_hex(t.get_bbox_patch().get_facecolor()) == "#a1d99b"]
    assert green == ["i", "x", "in", "in", "range", "enumerate"]  # the 6 kept, in creation order
    assert set(TOY_DRAFT) == {(), (0,), (1,), (0, 3), (1, 3)}  # every expanded path is in the table
    plt.close(fig)
