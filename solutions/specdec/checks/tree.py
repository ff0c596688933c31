"""Hidden-test checks for notebook 07 (tree attention and tree verification)."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from specdec import tree as ref
from specdec.checks.core import (
    CheckFailure,
    call,
    describe_types,
    diagnose,
    expect_reproducible,
    is_int_list,
    same,
    single_threaded,
    uniforms_at_zero,
    uniforms_just_below_one,
)
from specdec.checks.seeds import salted
from specdec.checks.stats import compare_frequencies
from specdec.mistakes import for_exercise
from specdec.models.model import KVCache, LlamaConfig

_SEED = 7

#: (description, choices): hand-drawn trees of every shape the exercises meet.
TREES = [
    ("the notebook's tree", [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]),
    ("a chain", [(0,), (0, 0), (0, 0, 0)]),
    ("a star", [(0,), (1,), (2,), (3,)]),
    ("choices in shuffled order, with a repeat", [(1, 0), (0,), (0, 0, 1), (1,), (0, 0), (0,)]),
    ("the default tree", ref.DEFAULT_CHOICES),
    ("a single candidate", [(0,)]),
    ("ranks with a gap", [(0,), (2,), (2, 1)]),
]


def _random_trees(n: int) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Random trees given as choices in a random order (every prefix of a choice is a choice too)."""
    rng = random.Random(salted(_SEED + 2))
    trees = []
    for k in range(n):
        nodes = {()}
        for _ in range(rng.randint(1, 14)):
            parent = rng.choice(sorted(nodes))
            if len(parent) < 4:
                nodes.add(parent + (rng.randint(0, 3),))
        choices = [c for c in nodes if c]
        rng.shuffle(choices)
        trees.append((f"random tree {k}", choices))
    return trees


def _fields(got) -> tuple | None:
    try:
        return tuple(tuple(int(x) for x in getattr(got, name)) for name in ("parents", "depths", "ranks"))
    except (AttributeError, TypeError, ValueError):
        return None


# Ranks of two digits whose string forms collide ("1" + "10" == "11" + "0"): a tree is keyed by its paths, not text.
MULTI_DIGIT = ("ranks of two digits ((1, 10) and (11, 0) read alike as text)", [(1,), (11,), (1, 10), (11, 0), (11, 0, 0)])


def check_flatten_tree(fn: Callable) -> None:
    for desc, choices in TREES + _random_trees(20) + [MULTI_DIGIT]:
        label = f"flatten_tree({desc}: {list(choices)})"
        got = call(fn, label, list(choices))
        expected = ref.flatten_tree(choices)
        if _fields(got) != _fields(expected):
            hint = diagnose(for_exercise("flatten_tree"), [((list(choices),), got)]) if _fields(got) else ""
            raise CheckFailure(f"{label}: expected parents={expected.parents}, depths={expected.depths}, "
                               f"ranks={expected.ranks}; got {got!r}. Nodes go root first, then by depth, then by "
                               f"path.{hint}")
        for name in ("parents", "depths", "ranks"):
            field = getattr(got, name)
            if not (isinstance(field, tuple) and is_int_list(list(field))):
                raise CheckFailure(f"{label}: the right values, but {name} is {describe_types(field)}; the statement "
                                   "asks for Tree(parents, depths, ranks) with three tuples of ints (a Tree is frozen "
                                   "and hashable: tuple(...) each list).")


def check_tree_mask(fn: Callable) -> None:
    wide = [(0,)] + [(0,) * d for d in range(2, 40)] + [(r,) for r in range(1, 33)]  # 71 nodes: a chain and a star
    for desc, choices in TREES + _random_trees(20) + [("a tree of 71 nodes (more than 64)", wide)]:
        parents = ref.flatten_tree(choices).parents
        label = f"tree_mask(parents={list(parents)}) for {desc}"
        got = call(fn, label, list(parents))
        expected = ref.tree_mask(parents)
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or got.shape != expected.shape:
            raise CheckFailure(f"{label}: return a bool tensor of shape {tuple(expected.shape)}, got {got!r}")
        if not torch.equal(got, expected):
            i, j = (got != expected).nonzero()[0].tolist()
            raise CheckFailure(
                f"{label}: mask[{i}, {j}] should be {bool(expected[i, j])}: node {j} is "
                f"{'' if expected[i, j] else 'not '}node {i} or one of its ancestors."
                + diagnose(for_exercise("tree_mask"), [((list(parents),), got)]))


def check_tree_position_ids(fn: Callable) -> None:
    for k, (desc, choices) in enumerate(TREES + _random_trees(20)):
        depths = ref.flatten_tree(choices).depths
        for cache_len in (0, 17) + ((300, 70_000) if k < 3 else ()):  # past 255 and 65,535: no narrow int type
            label = f"tree_position_ids(cache_len={cache_len}, depths={list(depths)}) for {desc}"
            got = call(fn, label, cache_len, list(depths))
            expected = ref.tree_position_ids(cache_len, depths)
            if not isinstance(got, torch.Tensor) or got.dtype not in (torch.int64, torch.int32) or not same(got, expected):
                raise CheckFailure(f"{label}: expected {expected.tolist()}, got {got!r}."
                                   + diagnose(for_exercise("tree_position_ids"), [((cache_len, list(depths)), got)]))
            if got.dtype != torch.int64:
                raise CheckFailure(f"{label}: the right positions, but as {got.dtype}; return a long (int64) tensor, "
                                   "the dtype position ids and token ids have everywhere in the course.")


def _greedy_cases(n: int) -> list[tuple[str, torch.Tensor, tuple, torch.Tensor]]:
    """(description, tokens, parents, logits) where the target agrees along random paths."""
    rng, g = random.Random(salted(_SEED)), torch.Generator().manual_seed(salted(_SEED))
    cases = []
    for k in range(n):
        desc, choices = TREES[k % len(TREES)]
        tree = ref.flatten_tree(choices)
        V = rng.choice([4, 8, 50])
        logits = torch.randn(len(tree), V, generator=g)
        best = logits.argmax(-1)
        tokens = torch.zeros(len(tree), dtype=torch.long)
        for parent in range(len(tree)):  # siblings carry distinct tokens, as a top-k proposer's do
            children = tree.children(parent)
            picks = torch.randperm(V, generator=g)[: len(children)]
            if children and rng.random() < 0.6:  # one child agrees with the target at this parent
                spot = rng.randrange(len(children))
                picks[picks == best[parent]] = picks[spot].clone()
                picks[spot] = best[parent]
            tokens[children] = picks
        cases.append((f"{desc}, case {k}", tokens, tree.parents, logits))
    return cases + _tie_cases(n // 2) + _tied_argmax_cases(n // 4)


def _tied_argmax_cases(n: int) -> list[tuple[str, torch.Tensor, tuple, torch.Tensor]]:
    """The course's vocabulary (256) with logits on three levels: dozens of tied maxima per node. The target's token
    at a node is its argmax, the lowest tied id; children carry that id and other tied ids (an unstable sort or a
    last-index argmax picks one of those)."""
    rng, g = random.Random(salted(_SEED + 3)), torch.Generator().manual_seed(salted(_SEED + 3))
    cases = []
    for k in range(n):
        desc, choices = TREES[(0, 4, 2)[k % 3]]
        tree = ref.flatten_tree(choices)
        logits = torch.randint(0, 3, (len(tree), 256), generator=g).float()
        tokens = torch.zeros(len(tree), dtype=torch.long)
        for parent in range(len(tree)):
            children = tree.children(parent)
            tied = (logits[parent] == logits[parent].max()).nonzero().flatten()
            picks = tied[torch.randperm(len(tied), generator=g)][: len(children)]
            if children and rng.random() < 0.7 and int(tied[0]) not in picks.tolist():
                picks[rng.randrange(len(children))] = tied[0]
            tokens[children] = picks
        cases.append((f"{desc}, V=256 with tied maxima, case {k}", tokens, tree.parents, logits))
    return cases


def _tie_cases(n: int) -> list[tuple[str, torch.Tensor, tuple, torch.Tensor]]:
    """Trees whose siblings may share a token (a Cartesian Medusa tree does), so that several
    children agree with the target at once: the longest agreeing path may run through a later
    sibling, and equally long paths must be decided by the stated tie rule (the earliest node)."""
    rng, g = random.Random(salted(_SEED + 1)), torch.Generator().manual_seed(salted(_SEED + 1))
    cases = []
    for k in range(n):
        desc, choices = TREES[(0, 2, 4)[k % 3]]
        tree = ref.flatten_tree(choices)
        V = rng.choice([3, 5])
        logits = torch.randn(len(tree), V, generator=g)
        best = logits.argmax(-1)
        tokens = torch.randint(0, V, (len(tree),), generator=g)
        for parent in range(len(tree)):
            for child in tree.children(parent):
                if rng.random() < 0.7:
                    tokens[child] = best[parent]  # this child agrees; so may its siblings
        cases.append((f"{desc} with repeated sibling tokens, case {k}", tokens, tree.parents, logits))
    # and one built so, whatever the seeds: of the root's children the first disagrees, the second and third agree,
    # and only the third has an agreeing child
    logits = torch.full((5, 8), -1.0)
    logits[0, 2] = logits[1, 0] = logits[2, 7] = logits[3, 3] = logits[4, 4] = 1.0  # argmax 2 at the root; 0, 7, 3, 4
    cases.append(("two agreeing siblings, the longer path under the later one", torch.tensor([5, 6, 2, 2, 3]),
                  (-1, 0, 0, 0, 3), logits))
    return cases


def check_verify_tree_greedy(fn: Callable) -> None:
    for desc, tokens, parents, logits in _greedy_cases(60):
        label = (f"verify_tree_greedy({desc}: tokens={tokens.tolist()}, parents={list(parents)}, "
                 f"target argmax per node={logits.argmax(-1).tolist()})")
        got = call(fn, label, tokens.clone(), list(parents), logits.clone())
        expected = ref.verify_tree_greedy(tokens, parents, logits)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise CheckFailure(f"{label}: return a tuple (path, committed) of two lists of ints, got {got!r}")
        if _ints(got[0]) != expected[0] or _ints(got[1]) != expected[1]:
            raise CheckFailure(f"{label}: expected (path, committed) = {expected}, got {got!r}. The path is the "
                               "longest one whose every token is the target's argmax at its parent (the lowest id "
                               "where several logits tie for the maximum); on a tie between paths the earliest node "
                               "wins." + diagnose(for_exercise("verify_tree_greedy"),
                                                  [((tokens, list(parents), logits), got)]))
        _expect_int_lists(label, got)


def _expect_int_lists(label: str, got) -> None:
    if not (is_int_list(got[0]) and is_int_list(got[1])):
        raise CheckFailure(f"{label}: the right values, but path is {describe_types(got[0])} and committed "
                           f"{describe_types(got[1])}; return two lists of Python ints (int(t) each token).")


def _ints(values) -> list[int] | None:
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        return None


def _sampling_scenarios():
    g = torch.Generator().manual_seed(salted(_SEED))
    tree = ref.flatten_tree(TREES[0][1])
    p = torch.softmax(torch.randn(len(tree), 4, generator=g, dtype=torch.float64), -1)
    yield "the notebook's tree, V=4", tree, torch.tensor([0, 2, 0, 3, 1, 2, 1, 0]), p
    star = ref.flatten_tree(TREES[2][1])
    p = torch.softmax(torch.randn(len(star), 5, generator=g, dtype=torch.float64), -1)
    p[0] = torch.tensor([0.1, 0.0, 0.5, 0.3, 0.1], dtype=torch.float64)  # the first child's token is impossible
    yield "a star whose first child has probability 0, V=5", star, torch.tensor([9, 1, 2, 3, 4]) % 5, p


def walk_distribution(tokens: torch.Tensor, tree: ref.Tree, p: torch.Tensor, node: int = 0) -> dict[tuple, float]:
    """Exact distribution of the committed tuple: x ~ p[node], continuing at the child whose token is x."""
    out: dict[tuple, float] = {}
    children = {int(tokens[c]): c for c in tree.children(node)}
    for x, px in enumerate(p[node].tolist()):
        if px == 0:
            continue
        if x in children:
            for rest, pr in walk_distribution(tokens, tree, p, children[x]).items():
                out[(x, *rest)] = out.get((x, *rest), 0.0) + px * pr
        else:
            out[(x,)] = out.get((x,), 0.0) + px
    return out


@single_threaded
def check_verify_tree_sampling(fn: Callable, n: int = 6000) -> None:
    """Seeded Monte Carlo of the committed tuple against the exact walk distribution."""
    for desc, tree, tokens, p in _sampling_scenarios():
        label = f"verify_tree_sampling({desc}: tokens={tokens.tolist()}, parents={list(tree.parents)})"
        g = torch.Generator().manual_seed(salted(_SEED))
        runs = []
        for _ in range(n):
            got = call(fn, label, tokens.clone(), tree, p, g)
            if not (isinstance(got, (tuple, list)) and len(got) == 2) or _ints(got[0]) is None or _ints(got[1]) is None:
                raise CheckFailure(f"{label}: return a tuple (path, committed) of two lists of ints, got {got!r}")
            path, committed = _ints(got[0]), _ints(got[1])
            walk_ok = path and path[0] == 0 and all(tree.parents[b] == a for a, b in zip(path, path[1:]))
            if not walk_ok or len(path) != len(committed) or [int(tokens[i]) for i in path[1:]] != committed[:-1]:
                raise CheckFailure(f"{label}: got path {path} and committed {committed}. The path starts at the root "
                                   "(0) and goes from parent to child; committed holds the tokens of path[1:], then "
                                   "the sampled token, so len(committed) == len(path).")
            _expect_int_lists(label, got)
            runs.append(tuple(committed))
        compare_frequencies(runs, walk_distribution(tokens, tree, p), f"{label}, {n} seeded runs",
                            hint="Try the children in order; accept child x with probability r(x) / sum(r); after a "
                                 "rejection set r(x) = 0 (renormalising implicitly); if none is accepted, sample from r.")
    _check_tree_at_fixed_uniforms(fn)
    tree = ref.flatten_tree(ref.DEFAULT_CHOICES)
    p = torch.full((len(tree), 30), 1 / 30, dtype=torch.float64)
    tokens = torch.arange(len(tree)) % 30
    expect_reproducible(fn, "verify_tree_sampling(the default tree, p uniform over 30 tokens, generator)",
                        lambda seed: (tokens.clone(), tree, p, torch.Generator().manual_seed(salted(seed))), seeds=range(5))


def _check_tree_at_fixed_uniforms(fn: Callable) -> None:
    """Deterministic walks: with every uniform 0 a child whose token has residual 0 is still rejected (u * sum(r) <
    r(x) is false; a test with <= walks into it), and the first child in order with r(x) > 0 is accepted (so the order
    is the statement's, not reversed); with every uniform 1 - 2**-53 a child of r(x) = 1 - 1e-9 is rejected in float64
    (a float32 uniform, 1 - 2**-24, accepts it)."""
    star = ref.flatten_tree(TREES[2][1])  # root and 4 children
    tokens = torch.tensor([0, 3, 1, 4, 2])
    impossible = torch.zeros(len(star), 5, dtype=torch.float64)
    impossible[:, 0] = 1.0  # after every node token 0 is certain: the children's tokens 3, 1, 4, 2 have p = 0
    p = torch.zeros(len(star), 5, dtype=torch.float64)
    p[0], p[1:, 0] = 0.2, 1.0  # the root's children tokens are all equally likely; after a child, token 0 is certain
    pair = ref.flatten_tree([(0,), (1,)])  # root and 2 children
    q = torch.zeros(len(pair), 3, dtype=torch.float64)
    q[0, 1], q[0, 0], q[1:, 2] = 1 - 1e-9, 1e-9, 1.0
    cases = [
        (uniforms_at_zero, f"a star whose children's tokens {tokens[1:].tolist()} all have p = 0, p[root] = one-hot on "
         "token 0, every uniform drawn exactly 0", tokens, star, impossible, ([0], [0]),
         "every child rejected, token 0 sampled from r. A uniform can be exactly 0: accept child x only when "
         "u * sum(r) < r(x), strictly, so a token with r(x) = 0 is never accepted"),
        (uniforms_at_zero, f"a star whose children carry tokens {tokens[1:].tolist()}, each of p = 0.2 at the root, "
         "every uniform drawn exactly 0", tokens, star, p, ([0, 1], [3, 0]),
         "with u = 0 the first child in order whose token has r(x) > 0 is accepted: try the children in the order "
         "tree.children(node) gives them"),
        (uniforms_just_below_one, "two children with tokens [1, 0], p[root] = [1e-9, 1 - 1e-9, 0], every uniform "
         "1 - 2**-53 (the largest float64 below 1)", torch.tensor([0, 1, 0]), pair, q, ([0, 2], [0, 2]),
         "draw u in float64 as the statement says (torch.rand((), generator=generator, dtype=torch.float64)): "
         "u = 1 - 2**-53 rejects token 1 of r = 1 - 1e-9, while a float32 uniform (1 - 2**-24) accepts it"),
    ]
    for fixed, desc, toks, tree, probs, (path, committed), why in cases:
        label = f"verify_tree_sampling({desc})"
        with fixed():
            got = call(fn, label, toks.clone(), tree, probs, torch.Generator().manual_seed(salted(0)))
        if not (isinstance(got, (tuple, list)) and len(got) == 2) or (_ints(got[0]), _ints(got[1])) != (path, committed):
            raise CheckFailure(f"{label}: expected ({path}, {committed}), got {got!r}: {why}.")


def check_compact_cache(fn: Callable) -> None:
    config = LlamaConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=16, max_seq_len=40)
    wide = LlamaConfig(vocab_size=16, d_model=12, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=16, max_seq_len=40)
    g = torch.Generator().manual_seed(salted(_SEED))
    cases = [(config, 1, 5, [0, 1, 4, 7], 8), (config, 1, 3, [0], 6), (config, 1, 9, [0, 2, 6], 12),
             (config, 1, 0, [0, 3], 4), (wide, 2, 4, [0, 2, 5], 7), (wide, 3, 6, [0, 1, 3, 8], 10)]
    for config, batch, start, path, written in cases:
        label = (f"compact_cache(start={start}, path={path}) after a tree of {written} nodes was written at slot {start}"
                 f", cache of {config.n_layers} layers, batch {batch}, {config.n_kv_heads} KV heads")
        cache = KVCache(config, batch_size=batch)
        cache.k.copy_(torch.randn(cache.k.shape, generator=g))
        cache.v.copy_(torch.randn(cache.v.shape, generator=g))
        cache.advance(start + written)
        want = KVCache(config, batch_size=batch)
        want.k.copy_(cache.k)
        want.v.copy_(cache.v)
        want.advance(start + written)
        ref.compact_cache(want, start, path)
        shapes = (cache.k.shape, cache.v.shape)
        call(fn, label, cache, start, list(path))
        if (cache.k.shape, cache.v.shape) != shapes:
            raise CheckFailure(f"{label}: cache.k and cache.v must keep their shape {tuple(shapes[0])} (every slot up to "
                               f"max_len), got {tuple(cache.k.shape)} and {tuple(cache.v.shape)}: copy the entries into "
                               "the slots in place and lower cache.length; later forwards write past it.")
        if cache.length != want.length:
            raise CheckFailure(f"{label}: the cache should end with length start + len(path) = {want.length}, got "
                               f"{cache.length}: crop after moving the entries.")
        n = want.length
        if not (torch.equal(cache.k[..., :n, :], want.k[..., :n, :]) and torch.equal(cache.v[..., :n, :], want.v[..., :n, :])):
            bad = [(s, name) for s in range(n) for name in ("k", "v")
                   if not torch.equal(getattr(cache, name)[..., s, :], getattr(want, name)[..., s, :])]
            slot, name = bad[0]
            raise CheckFailure(f"{label}: slot {slot} of cache.{name} should hold tree node {path[slot - start]}'s entry "
                               f"(written at slot {start + path[slot - start]}), in every layer, batch row and KV head; "
                               "move both K and V. Node i of the tree sits at slot start + i.")
