"""Drill templates on trees: paths and masks (notebook 07), Medusa's Cartesian tree and EAGLE-2's dynamic tree
(notebook 12)."""

from __future__ import annotations

import itertools
import random

import torch

from specdec.drafters.dynamic_tree import expand_dynamic_tree
from specdec.drill.questions import Number, number, show
from specdec.tree import flatten_tree, retrieve_indices, tree_mask


def _random_choices(rng: random.Random) -> list[tuple[int, ...]]:
    """A Medusa-style list of 5 to 14 paths: 2 or 3 candidates at the top, random branching below, depth <= 4."""
    while True:
        paths = _grow(rng)
        if 5 <= len(paths) <= 14:
            return paths


def _grow(rng: random.Random) -> list[tuple[int, ...]]:
    paths = [(r,) for r in range(rng.randrange(2, 4))]
    frontier = list(paths)
    for _ in range(3):
        grown = []
        for path in frontier:
            width = rng.choice([0, 1, 1, 2]) if path[-1] == 0 else rng.choice([0, 0, 1])
            grown += [path + (r,) for r in range(width)]
        paths += grown
        frontier = grown
    return paths


@number("tree_leaves", topic="tree", notebook="07_tree_attention", section="1. A tree as a list of paths")
def leaves(rng: random.Random) -> Number:
    choices = _random_choices(rng)
    tree = flatten_tree(choices)
    paths = retrieve_indices(tree.parents)
    return Number(
        f"A candidate tree given as Medusa-style choices (ranks on the path from the root): {choices}. How many "
        "root-to-leaf paths does retrieve_indices list (one row per path)?",
        paths.shape[0],
        f"Flattened, the tree has {len(tree)} nodes with parents {list(tree.parents)}. A leaf is a node that is no "
        f"one's parent; each gives one path: {show(paths.shape[0])} rows.",
        unit="paths", rel=0)


@number("tree_mask_entries", topic="tree", notebook="07_tree_attention", section="2. The mask and the positions")
def mask_entries(rng: random.Random) -> Number:
    choices = _random_choices(rng)
    tree = flatten_tree(choices)
    visible = int(tree_mask(tree.parents).sum())
    return Number(
        f"A candidate tree given as choices: {choices}, plus the root. In the (N, N) tree-attention mask over its nodes "
        "(node i sees itself and its ancestors), how many entries are True?",
        visible,
        f"Node i sees depth(i) + 1 nodes (its ancestors up to the root, and itself). Depths {list(tree.depths)} over "
        f"{len(tree)} nodes: sum of (depth + 1) = {show(visible)}.",
        unit="entries", rel=0)


@number("tree_medusa_positions", topic="tree", notebook="12_self_drafting", section="2. Medusa heads")
def medusa_positions(rng: random.Random) -> Number:
    widths = [rng.randrange(2, 5) for _ in range(rng.randrange(2, 4))]
    paths = [p for depth in range(1, len(widths) + 1)
             for p in itertools.product(*(range(w) for w in widths[:depth]))]
    n = len(flatten_tree(paths))
    levels, prod = [], 1
    for w in widths:
        prod *= w
        levels.append(prod)
    return Number(
        f"Medusa with {len(widths)} heads keeps the top {widths} candidates of heads 0..{len(widths) - 1} and verifies the "
        "full Cartesian tree of them (every combination, every depth). How many positions does the target's verify "
        "forward score, the root included?",
        n,
        f"Levels multiply: {' + '.join(str(x) for x in levels)} = {sum(levels)} candidate nodes, plus the root (the last "
        f"committed token, the target's next input): {show(n)}.",
        unit="positions", rel=0)


def _fake_expand(vocab: int):
    """A stand-in drafter: distinct log-probabilities for every path (only the tree's shape matters here)."""
    def expand(paths: list[tuple[int, ...]]) -> torch.Tensor:
        rows = [torch.log_softmax(torch.arange(vocab, dtype=torch.float64) * -(1 + len(p) / 10), 0) for p in paths]
        return torch.stack(rows)

    return expand


@number("tree_eagle2_nodes_created", topic="tree", notebook="12_self_drafting",
        section="4. EAGLE-2: a tree where the drafter is confident")
def eagle2_nodes(rng: random.Random) -> Number:
    top_k, depth = rng.randrange(3, 11), rng.randrange(3, 8)
    budget = rng.randrange(20, 80)
    created = len(expand_dynamic_tree(_fake_expand(top_k + 2), depth, top_k, budget=10**6))
    return Number(
        f"EAGLE-2 expands a dynamic tree with top_k = {top_k} for {depth} steps, then reranks to a budget of {budget} "
        "nodes. How many nodes does the drafter create before the rerank?",
        created,
        f"Step 1 expands the root into {top_k} children; each of the {depth - 1} later steps expands the {top_k} best new "
        f"nodes into {top_k} children each, {top_k * top_k} per step: {top_k} + {depth - 1} x {top_k * top_k} = "
        f"{show(created)}; the rerank keeps {budget} of them (plus the root) for one verify forward.",
        unit="nodes", rel=0)
