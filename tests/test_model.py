"""The small Llama and its KV cache: incremental forwards equal one full forward."""

import pytest
import torch

from specdec.models.model import KVCache, Llama, LlamaConfig

CONFIG = LlamaConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=64)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Llama(CONFIG).eval()


@torch.no_grad()
def test_cache_chunks_equal_full_forward(model):
    tokens = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    full = model(tokens)
    cache = KVCache(CONFIG, batch_size=2)
    parts = [model(tokens[:, a:b], cache) for a, b in ((0, 11), (11, 16), (16, 17), (17, 30))]
    assert cache.length == 30
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


@torch.no_grad()
def test_crop_rolls_back(model):
    tokens = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(2))
    cache = KVCache(CONFIG)
    model(tokens[:, :12], cache)
    model(torch.randint(0, 64, (1, 5)), cache)  # speculative positions that get rejected
    cache.crop(12)
    assert torch.allclose(model(tokens[:, 12:], cache), model(tokens)[:, 12:], atol=1e-5)
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(21)


@torch.no_grad()
def test_explicit_mask_and_positions(model):
    """Two branches after a shared prefix, in one forward with a mask and position ids,
    give the same logits as running each branch on its own."""
    prefix = torch.tensor([[3, 1, 4, 1, 5]])
    branch_a, branch_b = torch.tensor([[9, 2]]), torch.tensor([[6, 5]])
    cache = KVCache(CONFIG)
    model(prefix, cache)
    P = prefix.shape[1]
    nodes = torch.cat([branch_a, branch_b], 1)  # a0 a1 b0 b1
    ancestors = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones(4, P, dtype=torch.bool), ancestors], 1)
    tree = model(nodes, cache, position_ids=torch.tensor([P, P + 1, P, P + 1]), mask=mask)
    for branch, rows in ((branch_a, slice(0, 2)), (branch_b, slice(2, 4))):
        alone = model(torch.cat([prefix, branch], 1))[:, P:]
        assert torch.allclose(tree[:, rows], alone, atol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="n_kv_heads"):
        LlamaConfig(d_model=64, n_heads=4, n_kv_heads=3)
    model = Llama(CONFIG)
    with pytest.raises(ValueError, match="beyond max_seq_len"):
        model(torch.zeros(1, 65, dtype=torch.long))
    cache = KVCache(CONFIG, max_len=8)
    with pytest.raises(ValueError, match="KV cache overflow"):
        model(torch.zeros(1, 9, dtype=torch.long), cache)


def test_a_cache_copies_and_pickles():
    """copy.deepcopy and pickle build a KVCache with __new__(cls) and no config (notebook 12's checks copy caches)."""
    import copy
    import pickle

    config = LlamaConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=16)
    cache = KVCache(config)
    cache.write(0, torch.ones(1, 1, 3, 16), torch.ones(1, 1, 3, 16))
    cache.advance(3)
    for twin in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert type(twin) is KVCache and twin.length == 3 and torch.equal(twin.k, cache.k)
        twin.crop(1)
        assert cache.length == 3
