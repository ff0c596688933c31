"""Tree attention and tree verification (notebook 07).

Candidates form a tree instead of a chain: node 0 is the root (the last committed
token, the target's next input), every other node a candidate token whose parent
precedes it. A tree is given Medusa-style as "choices": one tuple per node, the ranks
of the candidates on the path from the root ((0,) is the root's best child, (0, 1) the
second-best child of that, ...). One target forward over all nodes, with a mask that
lets each node see the committed prefix, its ancestors and itself, scores every path at
once. Greedy verification keeps the longest path the target agrees with; sampling
verification walks down the tree trying children in order under the current residual.
The accepted path's KV entries are then compacted into contiguous cache slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.models.devices import on_device
from specdec.models.model import KVCache
from specdec.params import GREEDY, SamplingParams, check_request
from specdec.sampling import sample


@dataclass(frozen=True)
class Tree:
    """A flattened candidate tree: parents[0] = -1 (the root), parents[i] < i otherwise."""

    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]  # node i is its parent's ranks[i]-th best candidate (root: 0)

    def __len__(self) -> int:
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents) if parent == node]


def check_choices(choices: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The distinct paths, validated: non-empty tuples of ranks >= 0, every prefix present."""
    paths = {tuple(int(r) for r in path) for path in choices}
    for path in paths:
        if not path or min(path) < 0:
            raise ValueError(f"each choice must be a non-empty path of ranks >= 0, got {path}")
        if len(path) > 1 and path[:-1] not in paths:
            raise ValueError(f"choice {path} needs its parent {path[:-1]} in the tree too")
    return sorted(paths, key=lambda p: (len(p), p))


def flatten_tree(choices: Sequence[Sequence[int]]) -> Tree:
    """Nodes in breadth-first order (by depth, then by path), the root first."""
    paths = check_choices(choices)
    ### BEGIN SOLUTION
    index = {(): 0}
    parents, depths, ranks = [-1], [0], [0]
    for path in paths:  # parents come first: their paths are shorter
        index[path] = len(parents)
        parents.append(index[path[:-1]])
        depths.append(len(path))
        ranks.append(path[-1])
    return Tree(tuple(parents), tuple(depths), tuple(ranks))
    ### END SOLUTION


def tree_mask(parents: Sequence[int]) -> torch.Tensor:
    """(N, N) bool: mask[i, j] is True when node j is node i or one of its ancestors."""
    ### BEGIN SOLUTION
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):  # a node sees what its parent sees, and itself
        mask[i] |= mask[parents[i]]
    return mask
    ### END SOLUTION


def tree_position_ids(cache_len: int, depths: Sequence[int]) -> torch.Tensor:
    """(N,) positions: the root continues the cache, each node sits at its depth below it."""
    ### BEGIN SOLUTION
    return cache_len + torch.tensor(depths, dtype=torch.long)
    ### END SOLUTION


def retrieve_indices(parents: Sequence[int]) -> torch.Tensor:
    """(leaves, max_depth + 1): the node indices of each root-to-leaf path, padded with -1."""
    ### BEGIN SOLUTION
    n = len(parents)
    leaves = [i for i in range(n) if i not in set(parents)]
    paths = []
    for leaf in leaves:
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    width = max(len(p) for p in paths)
    return torch.tensor([p + [-1] * (width - len(p)) for p in paths], dtype=torch.long)
    ### END SOLUTION


def verify_tree_greedy(tokens: torch.Tensor, parents: Sequence[int], logits: torch.Tensor) -> tuple[list[int], list[int]]:
    """Greedy tree verification.

    tokens (N,): node tokens (tokens[0] is the root, already committed); logits (N, V):
    the target's next-token scores at each node. Returns (path, committed): the nodes of
    the longest path whose every token is the target's argmax at its parent (root first;
    the earliest such path on ties), and the committed tokens: the path's tokens after
    the root, then the target's argmax at the path's last node.
    """
    ### BEGIN SOLUTION
    best = logits.argmax(-1).tolist()  # (N,)
    tokens = tokens.tolist()
    agreed = [True] + [False] * (len(parents) - 1)  # the root is committed already
    for i in range(1, len(parents)):  # parents come first
        agreed[i] = agreed[parents[i]] and tokens[i] == best[parents[i]]
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    end = max((i for i in range(len(parents)) if agreed[i]), key=lambda i: (depth[i], -i))
    path = [end]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    path = path[::-1]
    return path, [tokens[i] for i in path[1:]] + [best[end]]
    ### END SOLUTION


def verify_tree_sampling(tokens: torch.Tensor, tree: Tree, p: torch.Tensor,
                         generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """Exact sampling over a tree of deterministic candidates.

    p (N, V): the target's distribution after each node. Walk down from the root: at a
    node, try its children in order; accept child x with probability r(x) / sum(r), where
    r starts as p[node]; on rejection set r(x) = 0 and try the next child. If a child is
    accepted, move to it; if all are rejected (or the node is a leaf), commit a token
    sampled from r and stop. Returns (path, committed) like verify_tree_greedy.
    """
    ### BEGIN SOLUTION
    tokens = tokens.tolist()
    node, path, committed = 0, [0], []
    while True:
        residual = p[node].to(torch.float64).clone()
        for child in tree.children(node):
            y = tokens[child]
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u * float(residual.sum()) < float(residual[y]):
                node = child
                break
            residual[y] = 0.0  # rejected: y is no longer possible here
        else:
            committed.append(int(sample(residual / residual.sum(), generator)))
            return path, committed
        path.append(node)
        committed.append(tokens[node])
    ### END SOLUTION


def verify_tree(tokens: torch.Tensor, tree: Tree, logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """(path, committed) at the request's settings: verify_tree_greedy at temperature 0, verify_tree_sampling
    otherwise. ``tokens``: (N,) the tree's nodes; ``logits``: (N, V), the target's at each node. Runs where the
    logits are (on a GPU: ``generator`` must be there too)."""
    if params.temperature == 0:
        return verify_tree_greedy(tokens, tree.parents, logits)
    with on_device(logits.device):  # verify_tree_sampling (notebook 07) draws its uniforms with no device named
        return verify_tree_sampling(tokens, tree, params.probs(logits), generator)


def compact_cache(cache: KVCache, start: int, path: Sequence[int]) -> None:
    """After a tree forward that wrote node i's KV at slot start + i, move the accepted
    path's entries to the contiguous slots start, start + 1, ... and crop the rest."""
    ### BEGIN SOLUTION
    index = torch.tensor([start + node for node in path])  # path[0] is the root: already in place
    cache.k[:, :, :, start : start + len(path)] = cache.k[:, :, :, index]
    cache.v[:, :, :, start : start + len(path)] = cache.v[:, :, :, index]
    cache.crop(start + len(path))
    ### END SOLUTION


#: A small default tree: 3 candidates for the next token, then 2, 2 and 1 below the best ones (12 nodes).
DEFAULT_CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0)]


def _tree_attention_mask(prefix: int, ancestors: torch.Tensor) -> torch.Tensor:
    """(T, prefix + S) bool: every row sees the whole prefix, then ancestors (T, S) over the tree slots."""
    return torch.cat([torch.ones(ancestors.shape[0], prefix, dtype=torch.bool), ancestors], dim=1)


def propose_tree(draft, cache: KVCache, pending: list[int], tree: Tree) -> list[int]:
    """Node tokens from the draft's top-k, depth by depth: node i is the ranks[i]-th most
    likely token after its parent. The draft feeds the pending tokens (the root last),
    then each depth's nodes that have children, with the tree mask; on return its cache
    is cropped back to hold the prefix and the root."""
    mask = tree_mask(tree.parents)
    root_slot = cache.length + len(pending) - 1
    logits = {0: draft(torch.tensor([pending]), cache)[0, -1]}
    tokens, fed = [pending[-1]] + [0] * (len(tree) - 1), [0]
    for depth in range(1, max(tree.depths) + 1):
        level = [i for i in range(len(tree)) if tree.depths[i] == depth]
        for i in level:
            tokens[i] = int(logits[tree.parents[i]].topk(tree.ranks[i] + 1).indices[-1])
        inner = [i for i in level if tree.children(i)]
        if not inner:
            continue
        rows = _tree_attention_mask(root_slot, mask[inner][:, fed + inner])
        positions = torch.full((len(inner),), root_slot + depth)
        out = draft(torch.tensor([[tokens[i] for i in inner]]), cache, positions, rows)[0]
        logits.update(zip(inner, out))
        fed += inner
    cache.crop(root_slot + 1)
    return tokens


@torch.inference_mode()
def tree_generate(target, draft, prompt: list[int], n_tokens: int, choices=DEFAULT_CHOICES,
                  params: SamplingParams = GREEDY, generator: torch.Generator | None = None) -> list[int]:
    """Speculative decoding with a tree of draft candidates, verified by one target forward
    per round with the tree mask; the same output distribution as target-only decoding."""
    tree = flatten_tree(choices)
    check_request(target, draft, prompt, n_tokens, max(tree.depths))
    for name, model in (("target", target), ("draft", draft)):
        if len(prompt) + n_tokens + len(tree) > model.config.max_seq_len:
            raise ValueError(f"prompt + n_tokens + the tree's {len(tree)} nodes exceed the {name}'s context")
    mask = tree_mask(tree.parents)
    t_cache, d_cache = KVCache(target.config), KVCache(draft.config)
    tokens = list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), t_cache)
        draft(torch.tensor([prompt[:-1]]), d_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) < n_tokens:
        start = len(tokens) - 1  # the target's cache length: the root goes in this slot
        nodes = torch.tensor(propose_tree(draft, d_cache, pending, tree))
        logits = target(nodes[None], t_cache, tree_position_ids(start, tree.depths),
                        _tree_attention_mask(start, mask))[0]  # (N, V)
        path, committed = verify_tree(nodes, tree, logits, params, generator)
        compact_cache(t_cache, start, path)
        tokens += committed
        pending = committed  # the draft holds the prefix and the root; it feeds the accepted path and the new token
    return tokens[len(prompt) : len(prompt) + n_tokens]
