"""The Triton kernels (the interpreter on CPU) equal their PyTorch specifications on random
shapes, the specifications sample exactly, and the launchers refuse bad input."""

import math

import numpy as np
import pytest
import torch

from specdec import kernels
from specdec.chain import outcome_distribution
from specdec.checks.stats import compare_frequencies
from specdec.kernels import (
    PAD,
    exponential_noise,
    logsumexp,
    race,
    race_reference,
    tree_attention,
    verify_chain_fused,
    verify_chain_reference,
)


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


def test_a_residual_of_zeros_falls_back_to_p():
    """After a rejection where rounding leaves q >= p at every token, max(p - q, 0) is 0 everywhere: the kernel and
    its reference then race on p, as notebook 04's verify_chain does, and never commit a token p gives 0."""
    from specdec.checks.kernels import verify_cases

    desc, args, block = next(case for case in verify_cases() if "residual of zeros" in case[0])
    p, q, draft, u, e, greedy = args
    for tokens, counts in (verify_chain_fused(*args, block_v=block), verify_chain_reference(*args)):
        for row, position in ((0, 0), (1, 1)):
            assert counts[row] == position + 1, "the draft at the zero-residual position must be rejected"
            extra = int(tokens[row, position])
            assert extra in (4, 7, 9) and p[row, position, extra] > 0, f"row {row} committed {extra}, p gives it 0"
    weights = p[0, 0] / e[0]
    assert int(verify_chain_reference(*args)[0][0, 0]) == int(weights.argmax())  # the race on p, same noise


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
    with pytest.raises(ValueError, match=r"draft token ids must lie in \[0, 10\)"):
        verify_chain_fused(p, q, draft + 10, u, e, greedy)
    with pytest.raises(ValueError, match="noise e must be > 0"):
        verify_chain_fused(p, q, draft, u, e * 0, greedy)
    with pytest.raises(ValueError, match="noise e must be > 0"):
        race(p[:, 0], torch.zeros_like(p[:, 0]))
    with pytest.raises(ValueError, match=r"\(B, V\)"):
        logsumexp(p)
    h = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="bool"):
        tree_attention(h, h, h, torch.eye(3))
    with pytest.raises(ValueError, match="every node must see itself and the root"):
        tree_attention(h, h, h, torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="every node must see itself and the root"):
        tree_attention(h, h, h, torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("B, V, block", [(1, 1, 8), (3, 100, 32), (5, 1000, 128)])
def test_race_and_logsumexp_kernels_equal_torch(B, V, block):
    g = torch.Generator().manual_seed(V)
    w, e = torch.rand(B, V, generator=g), exponential_noise(B, V, generator=g)
    assert torch.equal(race(w, e, block_v=block), race_reference(w, e))
    x = 50 * torch.randn(B, V, generator=g)
    x[0, : V // 2] = float("-inf")
    assert torch.allclose(logsumexp(x, block_v=block), torch.logsumexp(x, -1), rtol=1e-5)


def test_logsumexp_of_only_minus_inf_is_minus_inf():
    x = torch.full((2, 40), float("-inf"))
    with np.errstate(divide="ignore"):
        assert logsumexp(x, block_v=16).tolist() == [float("-inf")] * 2


def test_race_reference_samples_proportionally_to_the_weights():
    """20,000 rows, same weights, independent noise: frequencies match w / sum(w) (5 sigma)."""
    g = torch.Generator().manual_seed(3)
    w = torch.tensor([0.5, 2.0, 0.0, 1.0, 0.25, 0.25], dtype=torch.float64)
    picks = race_reference(w.expand(20_000, -1), exponential_noise(20_000, 6, generator=g).double())
    compare_frequencies(picks.tolist(), {x: float(w[x] / w.sum()) for x in range(6)}, "race_reference")


@pytest.mark.parametrize("u, expected", [(0.0, -math.log(torch.finfo(torch.float32).tiny)), (0.5, math.log(2))])
def test_exponential_noise_is_positive_and_finite(monkeypatch, u, expected):
    """A uniform of exactly 0 (float32: about once in 2**24) must give neither 0 (w / 0 wins whatever w is)
    nor infinity (w / inf = 0 ties with the zero-weight tokens)."""
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.full(shape, u))
    assert exponential_noise(3).tolist() == pytest.approx([expected] * 3)


def test_reference_kernels_compile_for_a_gpu():
    """Triton's compiler front end accepts every kernel for an sm_90 target (no GPU needed), so the
    interpreter-tested kernels also run compiled; a kernel the compiler rejects is reported."""
    from specdec import kernels
    from specdec.bench.compiled import KERNELS
    from specdec.checks.kernels import compile_error
    from specdec.mistakes.kernels import _edited

    for name in KERNELS:
        assert compile_error(getattr(kernels, name), name) is None, name
    broken = _edited(kernels.race_kernel, "int_start", ('best, best_col = -float("inf"), 0', "best, best_col = 0, 0"))
    assert "Loop-carried variable best" in compile_error(broken, "race_kernel")


def test_launchers_write_into_out_and_check_it():
    w, e = torch.rand(2, 9), exponential_noise(2, 9)
    out = torch.full((2,), -5)
    assert race(w, e, out=out) is out and torch.equal(out, race_reference(w, e))
    with pytest.raises(ValueError, match="out must be a contiguous torch.int64 tensor of shape"):
        race(w, e, out=torch.zeros(3, dtype=torch.long))


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
    from specdec.bench.kernels import main

    assert main([]) == 0
    assert "No CUDA GPU" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without a GPU")
def test_the_interpreter_patches_its_language_once_per_launch():
    """kernels._interpret_faster is in place (a Triton whose interpreter changed would silently lose it: about half
    of every kernel test's time), and a launch after it computes what the reference computes."""
    import os

    from specdec import kernels

    assert os.environ.get("TRITON_INTERPRET") == "1" and kernels._interpret_faster()
    w = torch.rand(3, 37, generator=torch.Generator().manual_seed(0))
    e = kernels.exponential_noise(3, 37, generator=torch.Generator().manual_seed(1))
    assert torch.equal(kernels.race(w, e, block_v=8), (w / e).argmax(-1))


def test_exponential_noise_from_a_cpu_generator_lands_on_the_device_asked_for(monkeypatch):
    """Notebook 08 draws noise with a seeded CPU generator for kernels on the GPU. CUDA refuses to fill a tensor from
    a generator on another device; 'meta' stands in for CUDA here, with torch.rand held to that rule."""
    rand = torch.rand

    def rand_as_on_cuda(*size, generator=None, device=None, **kwargs):
        if generator is not None and torch.device(device or "cpu") != generator.device:
            raise RuntimeError(f"Expected a '{torch.device(device).type}' device type for generator")
        return rand(*size, generator=generator, device=device, **kwargs)

    monkeypatch.setattr(torch, "rand", rand_as_on_cuda)
    noise = kernels.exponential_noise(3, 5, generator=torch.Generator().manual_seed(0), device="meta")
    assert noise.device.type == "meta" and noise.shape == (3, 5)
    assert torch.equal(kernels.exponential_noise(3, 5, generator=torch.Generator().manual_seed(0)),
                       kernels.exponential_noise(3, 5, generator=torch.Generator().manual_seed(0), device="cpu"))
