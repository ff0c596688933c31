"""The fused chain verifier (Triton; the interpreter on CPU) equals its PyTorch
specification on random shapes, and the specification samples exactly."""

import pytest
import torch

from specdec.chain import outcome_distribution
from specdec.checks.stats import compare_frequencies
from specdec.kernels import PAD, verify_chain_fused, verify_chain_reference


def _inputs(B: int, gamma: int, V: int, seed: int):
    """Rows of every kind: sampling rows with a draft close to the target (partial acceptance),
    q == p (all accepted), p(draft[0]) = 0 (first rejected), and greedy rows."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(B, gamma + 1, V, generator=g), -1)
    q = torch.softmax(p[:, :gamma].log() + 0.7 * torch.randn(B, gamma, V, generator=g), -1)
    q[0] = p[0, :gamma]  # row 0 accepts everything
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, gamma)
    if B > 1:
        p[1, 0, draft[1, 0]] = 0.0  # row 1 rejects its first draft
        p[1, 0] /= p[1, 0].sum()
    greedy = torch.arange(B) % 3 == 2
    draft[greedy] = torch.where(torch.rand(int(greedy.sum()), gamma, generator=g) < 0.7,
                                p[greedy, :gamma].argmax(-1), draft[greedy])
    u = torch.rand(B, gamma, generator=g)
    e = -torch.log1p(-torch.rand(B, V, generator=g))  # Exponential(1)
    return p, q, draft, u, e, greedy


@pytest.mark.parametrize("B, gamma, V, block", [(1, 1, 7, 8), (3, 2, 130, 32), (8, 4, 1000, 256), (6, 3, 1025, 128)])
def test_fused_kernel_equals_reference(B, gamma, V, block):
    args = _inputs(B, gamma, V, seed=B * 100 + gamma)
    tokens, counts = verify_chain_fused(*args, block_v=block)
    want_tokens, want_counts = verify_chain_reference(*args)
    assert torch.equal(counts, want_counts) and torch.equal(tokens, want_tokens)
    if B > 1:
        assert counts[0] == gamma + 1 and counts[1] == 1
    assert ((tokens == PAD).sum(-1) == gamma + 1 - counts).all()


def test_reference_samples_the_exact_chain_distribution():
    """20,000 rows with the same p, q and draft but independent noise: the committed tuples
    follow notebook 04's exact outcome distribution (5 sigma per outcome)."""
    g = torch.Generator().manual_seed(1)
    gamma, V, n = 2, 4, 20_000
    p = torch.softmax(torch.randn(gamma + 1, V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(gamma, V, generator=g, dtype=torch.float64), -1)
    draft = torch.tensor([1, 3])
    u = torch.rand(n, gamma, generator=g, dtype=torch.float64)
    e = -torch.log1p(-torch.rand(n, V, generator=g, dtype=torch.float64))
    tokens, counts = verify_chain_reference(p.expand(n, -1, -1), q.expand(n, -1, -1), draft.expand(n, -1), u, e,
                                            torch.zeros(n, dtype=torch.bool))
    runs = [tuple(row[:c].tolist()) for row, c in zip(tokens, counts)]
    compare_frequencies(runs, outcome_distribution(p, q, draft), "verify_chain_reference")


def test_bad_input_is_refused():
    p, q, draft, u, e, greedy = _inputs(2, 2, 10, seed=0)
    with pytest.raises(ValueError, match="float32"):
        verify_chain_fused(p.double(), q.double(), draft, u, e, greedy)
    with pytest.raises(ValueError, match="shapes"):
        verify_chain_fused(p, q, draft, u[:, :1], e, greedy)


@pytest.mark.parametrize("H, L, D, block", [(1, 0, 8, 4), (2, 17, 16, 8), (4, 40, 24, 16), (2, 130, 64, 64)])
def test_tree_attention_kernel_equals_reference(H, L, D, block):
    from specdec.kernels import tree_attention, tree_attention_reference
    from specdec.tree import DEFAULT_CHOICES, flatten_tree, tree_mask

    tree = flatten_tree(DEFAULT_CHOICES)
    N = len(tree)
    g = torch.Generator().manual_seed(H * 1000 + L)
    q = torch.randn(H, N, D, generator=g)
    k = 3 * torch.randn(H, L + N, D, generator=g)  # large scores: the running max matters
    v = torch.randn(H, L + N, D, generator=g)
    mask = tree_mask(tree.parents)
    out = tree_attention(q, k, v, mask, block_k=block)
    assert torch.allclose(out, tree_attention_reference(q, k, v, mask), atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the benchmark really runs")
def test_kernel_benchmark_says_it_needs_a_gpu(capsys):
    from specdec.bench_kernels import main

    assert main([]) == 0
    assert "No CUDA GPU" in capsys.readouterr().out
