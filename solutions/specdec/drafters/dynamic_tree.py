"""Notebook 12, EAGLE-2's dynamic draft tree (Li et al. 2024).

The drafter is well calibrated: its confidence in a path approximates the chance the target
accepts it. So instead of a fixed tree shape, EAGLE-2 grows the tree where the drafter is confident
(expansion), then keeps the drafted nodes most likely to be accepted (reranking).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.validate import check_positive_int

TokenPath = tuple[int, ...]


def expand_dynamic_tree(expand: Callable[[list[TokenPath]], torch.Tensor], depth: int, top_k: int,
                        budget: int) -> list[TokenPath]:
    """The paths (token tuples after the root) of EAGLE-2's tree, sorted by depth, then creation order.

    ``expand(paths)`` returns (len(paths), V) log-probabilities of the drafter's next token after each
    path. Step 1 expands the root (the empty path); each later step expands the ``top_k`` nodes of
    highest value among those created in the step before. Expanding a node creates its ``top_k``
    children with the highest log-probability (lower token id first on ties); a node's **value** is the
    sum of the log-probabilities along its path (the log of the product of the draft's probabilities).
    After ``depth`` steps, keep the ``budget`` created nodes of highest value. Nodes are created in
    order: step by step, each step's parents in the order they were ranked, each parent's children
    best first; between equal values, the earlier created node ranks higher (so a kept node's parent
    is kept too).
    """
    for name, value in (("depth", depth), ("top_k", top_k), ("budget", budget)):
        check_positive_int(value, name)
    ### BEGIN SOLUTION
    created: list[tuple[float, TokenPath]] = []  # (value, path) in creation order
    frontier: list[tuple[float, TokenPath]] = [(0.0, ())]
    for _ in range(depth):
        logprobs = expand([path for _, path in frontier])  # (len(frontier), V)
        new = []
        for (value, path), row in zip(frontier, logprobs):
            order = torch.sort(row, descending=True, stable=True).indices[:top_k].tolist()
            new += [(value + float(row[token]), path + (token,)) for token in order]
        created += new
        ranked = sorted(range(len(new)), key=lambda i: (-new[i][0], i))
        frontier = [new[i] for i in ranked[:top_k]]
    kept = sorted(range(len(created)), key=lambda i: (-created[i][0], i))[:budget]
    return [created[i][1] for i in sorted(kept, key=lambda i: (len(created[i][1]), i))]
    ### END SOLUTION
