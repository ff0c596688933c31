"""Known-wrong answers to the exercises of notebook 07 (trees)."""

from __future__ import annotations

import torch

from specdec.mistakes import Mistake
from specdec.sampling import sample
from specdec.tree import Tree, check_choices, retrieve_indices


def _flatten_depth_first(choices):
    paths = sorted(check_choices(choices))  # lexicographic: depth-first
    index, parents, depths, ranks = {(): 0}, [-1], [0], [0]
    for path in paths:
        index[path] = len(parents)
        parents.append(index[path[:-1]])
        depths.append(len(path))
        ranks.append(path[-1])
    return Tree(tuple(parents), tuple(depths), tuple(ranks))


def _mask_by_depth(parents):
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    d = torch.tensor(depth)
    return (d[None, :] < d[:, None]) | torch.eye(len(parents), dtype=torch.bool)  # siblings' subtrees leak in


def _mask_parent_only(parents):
    mask = torch.eye(len(parents), dtype=torch.bool)
    for i in range(1, len(parents)):
        mask[i, parents[i]] = True
    return mask


def _causal_mask(parents):
    return torch.ones(len(parents), len(parents), dtype=torch.bool).tril()


def _greedy(tokens, parents, logits, *, first_path=False, no_bonus=False, latest_on_ties=False):
    best = logits.argmax(-1).tolist()
    tokens = tokens.tolist()
    results = []
    for row in retrieve_indices(parents).tolist():
        path = [0]
        for node in row[1:]:
            if node < 0 or tokens[node] != best[path[-1]]:
                break
            path.append(node)
        results.append(path)
    path = results[0] if first_path else max(results, key=lambda p: (len(p), p[-1] if latest_on_ties else -p[-1]))
    committed = [tokens[i] for i in path[1:]]
    return path, committed if no_bonus else committed + [best[path[-1]]]


def _greedy_descent(tokens, parents, logits):
    """Walk down from the root, always into the first child that agrees: never backtracks,
    so a longer agreeing branch under a later sibling is missed."""
    best = logits.argmax(-1).tolist()
    tokens = tokens.tolist()
    path = [0]
    while True:
        agreeing = [c for c in range(1, len(parents)) if parents[c] == path[-1] and tokens[c] == best[path[-1]]]
        if not agreeing:
            break
        path.append(agreeing[0])
    return path, [tokens[i] for i in path[1:]] + [best[path[-1]]]


def _sampling_global_rng(tokens, tree, p, generator=None):
    return _sampling(tokens, tree, p, None)


def _compact_row_zero(cache, start, path):
    index = torch.tensor([start + node for node in path])
    cache.k[:, 0, :, start : start + len(path)] = cache.k[:, 0, :, index]
    cache.v[:, 0, :, start : start + len(path)] = cache.v[:, 0, :, index]
    cache.crop(start + len(path))


def _sampling(tokens, tree, p, generator=None, *, remove=True, renormalise=True):
    tokens = tokens.tolist()
    node, path, committed = 0, [0], []
    while True:
        residual = p[node].to(torch.float64).clone()
        for child in tree.children(node):
            y = tokens[child]
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            total = float(residual.sum()) if renormalise else 1.0
            if u * total < float(residual[y]):
                node = child
                break
            if remove:
                residual[y] = 0.0
        else:
            committed.append(int(sample(residual / residual.sum(), generator)))
            return path, committed
        path.append(node)
        committed.append(tokens[node])


def _compact(cache, start, path, *, offset=True, crop=True, contiguous=False):
    index = torch.tensor([(start if offset else 0) + node for node in path])
    if contiguous:
        index = torch.arange(start, start + len(path))
    cache.k[:, :, :, start : start + len(path)] = cache.k[:, :, :, index]
    cache.v[:, :, :, start : start + len(path)] = cache.v[:, :, :, index]
    if crop:
        cache.crop(start + len(path))


MISTAKES = [
    Mistake("flatten_tree", "depth_first_order", _flatten_depth_first,
            "Order the nodes by depth first, then by path (breadth-first), not lexicographically."),
    Mistake("tree_mask", "siblings_see_each_other", _mask_by_depth,
            "A node sees only its own ancestors, not every shallower node."),
    Mistake("tree_mask", "parent_only", _mask_parent_only,
            "A node sees all its ancestors up to the root, not just its parent."),
    Mistake("tree_mask", "causal_mask", _causal_mask,
            "A causal mask is for a chain; in a tree, earlier nodes on other branches must stay hidden."),
    Mistake("tree_position_ids", "position_by_node_index", lambda cache_len, depths: cache_len + torch.arange(len(depths)),
            "A node's position is cache_len + its depth: siblings share a position."),
    Mistake("verify_tree_greedy", "first_path", lambda *a, **k: _greedy(*a, **k, first_path=True),
            "Keep the longest agreeing path, not the first one."),
    Mistake("verify_tree_greedy", "no_bonus", lambda *a, **k: _greedy(*a, **k, no_bonus=True),
            "Commit the target's argmax at the last accepted node too."),
    Mistake("verify_tree_sampling", "rejected_child_not_removed", lambda *a, **k: _sampling(*a, **k, remove=False),
            "After rejecting a child, remove its token from the residual."),
    Mistake("verify_tree_sampling", "not_renormalised", lambda *a, **k: _sampling(*a, **k, renormalise=False),
            "Accept with probability r(x) / sum(r): the residual shrinks as children are rejected."),
    Mistake("compact_cache", "path_without_offset", lambda *a, **k: _compact(*a, **k, offset=False),
            "Node i sits at slot start + i."),
    Mistake("compact_cache", "keeps_the_first_nodes", lambda *a, **k: _compact(*a, **k, contiguous=True),
            "Move the accepted path's entries, not the first len(path) nodes."),
    Mistake("compact_cache", "no_crop", lambda *a, **k: _compact(*a, **k, crop=False),
            "Crop the cache to start + len(path)."),
    Mistake("verify_tree_greedy", "greedy_descent", _greedy_descent,
            "Do not stop at the first agreeing child: a later sibling with the same token may lead to a longer "
            "agreeing path. Find the deepest agreeing node over the whole tree (the earliest on ties)."),
    Mistake("verify_tree_greedy", "latest_on_ties", lambda *a, **k: _greedy(*a, **k, latest_on_ties=True),
            "On a tie between equally long agreeing paths the earliest node wins (the smallest index)."),
    Mistake("verify_tree_sampling", "global_rng", _sampling_global_rng,
            "Draw every uniform and the final sample with the generator you are given."),
    Mistake("compact_cache", "batch_row_zero_only", _compact_row_zero,
            "Move the entries of every batch row (dimension 1), not only row 0."),
]
