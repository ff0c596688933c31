"""Trees: flattening, mask, positions, retrieve indices; one masked forward equals
per-path forwards; greedy and sampling tree verification; KV compaction; tree decoding
equals target-only decoding."""

import pytest
import torch

from specdec.checks.engine import target_joint, tiny_pair
from specdec.checks.stats import compare_frequencies
from specdec.checks.tree import walk_distribution
from specdec.engine import target_only_generate
from specdec.models.model import KVCache
from specdec.params import SamplingParams
from specdec.paths import DATA_DIR
from specdec.tree import (
    DEFAULT_CHOICES,
    compact_cache,
    flatten_tree,
    retrieve_indices,
    tree_generate,
    tree_mask,
    tree_position_ids,
    verify_tree_greedy,
    verify_tree_sampling,
)

#      0
#    / | \
#   1  2  3        (0,), (1,), (2,)
#  / \  \
# 4   5  6         (0, 0), (0, 1), (1, 0)
# |
# 7                (0, 0, 0)
CHOICES = [(1,), (0, 0), (0,), (2,), (0, 1), (1, 0), (0, 0, 0)]
SHIPPED = DATA_DIR / "models" / "target.safetensors"


def test_flatten_mask_positions_retrieve():
    tree = flatten_tree(CHOICES)
    assert tree.parents == (-1, 0, 0, 0, 1, 1, 2, 4)
    assert tree.depths == (0, 1, 1, 1, 2, 2, 2, 3)
    assert tree.ranks == (0, 0, 1, 2, 0, 1, 0, 0)
    mask = tree_mask(tree.parents)
    assert mask[7].nonzero().flatten().tolist() == [0, 1, 4, 7]  # ancestors and itself
    assert not mask[4, 5] and not mask[5, 4]  # siblings do not see each other
    assert tree_position_ids(10, tree.depths).tolist() == [10, 11, 11, 11, 12, 12, 12, 13]
    assert retrieve_indices(tree.parents).tolist() == [[0, 3, -1, -1], [0, 1, 5, -1], [0, 2, 6, -1], [0, 1, 4, 7]]
    with pytest.raises(ValueError, match="needs its parent"):
        flatten_tree([(0, 1)])
    with pytest.raises(ValueError, match="non-empty path"):
        flatten_tree([()])


@pytest.mark.skipif(not SHIPPED.exists(), reason="no shipped checkpoint")
@torch.no_grad()
def test_one_tree_forward_equals_each_path_alone():
    from specdec.models.checkpoints import load

    target = load(SHIPPED)
    tree = flatten_tree(DEFAULT_CHOICES)
    prefix = list(b"def f(x):\n    return")
    nodes = torch.randint(0, 256, (len(tree),), generator=torch.Generator().manual_seed(0))
    cache = KVCache(target.config)
    target(torch.tensor([prefix]), cache)
    mask = torch.cat([torch.ones(len(tree), len(prefix), dtype=torch.bool), tree_mask(tree.parents)], 1)
    tree_logits = target(nodes[None], cache, tree_position_ids(len(prefix), tree.depths), mask)[0]
    for path in retrieve_indices(tree.parents).tolist():
        path = [i for i in path if i >= 0]
        alone = target(torch.tensor([prefix + nodes[path].tolist()]))[0, len(prefix):]
        assert torch.allclose(tree_logits[path], alone, atol=1e-4), (tree_logits[path] - alone).abs().max()


def test_greedy_tree_verification_takes_the_longest_agreeing_path():
    tree = flatten_tree(CHOICES)
    V = 10
    logits = torch.zeros(len(tree), V)
    argmax = [3, 5, 1, 9, 6, 2, 4, 8]  # the target's choice after each node
    logits[range(len(tree)), argmax] = 1.0
    # node tokens: 1 (=3, agrees), 2 (=7, no), 3 (=3, agrees too but 1 comes first), 4 (=5 agrees), 5, 6, 7 (=6 agrees)
    tokens = torch.tensor([0, 3, 7, 3, 5, 0, 0, 6])
    path, committed = verify_tree_greedy(tokens, tree.parents, logits)
    assert path == [0, 1, 4, 7] and committed == [3, 5, 6, 8]
    tokens[7] = 0  # the deepest node disagrees now: stop at node 4, the target says 6
    assert verify_tree_greedy(tokens, tree.parents, logits) == ([0, 1, 4], [3, 5, 6])
    tokens = torch.tensor([0, 0, 0, 0, 0, 0, 0, 0])  # nothing agrees: just the target's token
    assert verify_tree_greedy(tokens, tree.parents, logits) == ([0], [3])


def test_sampling_tree_verification_is_exact():
    """Trying children in order under the renormalised residual commits exactly what walking the
    tree with the target's own samples would (5 sigma per outcome, 20,000 seeded runs)."""
    tree = flatten_tree(CHOICES)
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(len(tree), 4, generator=g, dtype=torch.float64), -1)
    tokens = torch.tensor([0, 2, 0, 3, 1, 2, 1, 0])  # children of each node carry distinct tokens
    exact = walk_distribution(tokens, tree, p)
    assert abs(sum(exact.values()) - 1) < 1e-12
    runs = [tuple(verify_tree_sampling(tokens, tree, p, g)[1]) for _ in range(20_000)]
    compare_frequencies(runs, exact, "verify_tree_sampling")


@torch.no_grad()
def test_compaction_equals_a_fresh_cache():
    target, _ = tiny_pair()
    tree = flatten_tree(CHOICES)
    prefix, nodes = [1, 2, 3], torch.tensor([4, 5, 6, 7, 8, 9, 10, 11])
    cache = KVCache(target.config)
    target(torch.tensor([prefix]), cache)
    mask = torch.cat([torch.ones(len(tree), 3, dtype=torch.bool), tree_mask(tree.parents)], 1)
    target(nodes[None], cache, tree_position_ids(3, tree.depths), mask)
    compact_cache(cache, 3, [0, 1, 4, 7])
    assert cache.length == 7
    after = target(torch.tensor([[12]]), cache)[0, -1]
    fresh = target(torch.tensor([prefix + [4, 5, 8, 11, 12]]))[0, -1]
    assert torch.allclose(after, fresh, atol=1e-4)


def test_tree_decoding_equals_greedy():
    target, draft = tiny_pair()
    for prompt in ([1, 2, 3, 4], [5]):
        assert tree_generate(target, draft, prompt, 30, CHOICES) == target_only_generate(target, prompt, 30)


@pytest.mark.skipif(not SHIPPED.exists(), reason="no shipped checkpoint")
def test_tree_decoding_equals_greedy_on_the_shipped_checkpoints():
    from specdec.models import corpus, tokenizer
    from specdec.models.checkpoints import load_pair

    target, draft = load_pair(SHIPPED.parent)
    for text in (corpus.code_prompts(1)[0], corpus.math_prompts(1)[0]):
        ids = tokenizer.encode(text)
        assert tree_generate(target, draft, ids, 48) == target_only_generate(target, ids, 48)


def test_tree_sampling_is_exact():
    """The first 3 tokens of tree decoding at temperature 0.8 / top-k 4 follow the target's joint."""
    target, draft = tiny_pair(vocab=6, noise=0.5, seed=3)
    params, prompt = SamplingParams(0.8, top_k=4), [1, 2]
    exact = target_joint(target, prompt, params)
    g = torch.Generator().manual_seed(0)
    runs = [tuple(tree_generate(target, draft, prompt, 3, CHOICES, params, g)) for _ in range(1500)]
    compare_frequencies(runs, exact, "tree_generate, first 3 tokens")
