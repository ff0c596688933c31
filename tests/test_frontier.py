"""Notebook 14's lessons: block verification, MoE verification cost, the long-context ledger, layer-skip drafts."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specdec import kernels  # noqa: F401  (first: the mistake catalogue imports it, and it must precede Triton)
from specdec.frontier.block import (
    block_outcomes,
    block_verify,
    block_weights,
    constant_model,
    expected_accepted,
    random_models,
    round_outcomes,
    sequence_law,
    target_law,
)


def test_block_verification_reproduces_the_papers_two_token_example():
    """Sun et al. (ICLR 2025), section 1: p = (1/3, 2/3) and q = (2/3, 1/3) at every position, gamma = 2: token-wise
    verification accepts 10/9 tokens per round in expectation, block verification 11/9."""
    target, draft = constant_model([1 / 3, 2 / 3]), constant_model([2 / 3, 1 / 3])
    assert expected_accepted(round_outcomes(target, draft, (), 2, "token")) == pytest.approx(10 / 9)
    assert expected_accepted(round_outcomes(target, draft, (), 2, "block")) == pytest.approx(11 / 9)


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_verification_is_exact_and_never_accepts_less_than_token_wise(gamma, seed):
    """Enumeration: the first four tokens that rounds of block verification emit follow the target's law exactly
    (models whose distributions depend on the whole prefix, 3 tokens), and a round accepts at least as many drafts
    in expectation as token-wise verification, at every prefix visited."""
    target, draft = random_models(3, seed)
    law, truth = sequence_law(target, draft, 4, gamma, "block"), target_law(target, 4)
    assert set(law) <= set(truth)
    assert max(abs(law.get(k, 0.0) - v) for k, v in truth.items()) < 1e-12
    for prefix in [(), (0,), (1, 2), (2, 2, 0)]:
        block = expected_accepted(round_outcomes(target, draft, prefix, gamma, "block"))
        token = expected_accepted(round_outcomes(target, draft, prefix, gamma, "token"))
        assert block >= token - 1e-12
    if gamma > 1:  # strictly more somewhere: the point of it
        assert any(expected_accepted(round_outcomes(target, draft, prefix, gamma, "block"))
                   > expected_accepted(round_outcomes(target, draft, prefix, gamma, "token")) + 1e-6
                   for prefix in [(), (0,), (1,), (2,)])


def test_block_weights_follow_their_definition_on_ties_and_extremes():
    """w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1); h_gamma = w_gamma; h_i = 1 wherever w_i = 1 (p = q: keep all)."""
    p = torch.tensor([[0.5, 0.5], [0.2, 0.8], [0.5, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.25, 0.75], [0.6, 0.4]], dtype=torch.float64)
    w, h = block_weights(p, q, torch.tensor([1, 0]))
    assert w.tolist() == pytest.approx([0.5 / 0.75, 0.5 / 0.75 * 0.2 / 0.6])
    excess = float((w[0] * p[1] - q[1]).clamp_min(0).sum())
    assert h.tolist() == pytest.approx([excess / (excess + 1 - float(w[0])), float(w[1])])
    same = torch.full((3, 4), 0.25, dtype=torch.float64)
    assert block_weights(same, same[:2], torch.tensor([3, 1])) == (pytest.approx(torch.ones(2, dtype=torch.float64)),
                                                                   pytest.approx(torch.ones(2, dtype=torch.float64)))
    with pytest.raises(ValueError, match="q gives probability 0"):
        block_weights(p, torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64), torch.tensor([1, 0]))


def test_block_verify_samples_what_the_enumeration_says():
    """Seeded Monte Carlo (8,000 rounds of one drafted block, 3 drafts, 4 tokens): every committed block's frequency
    within 0.025 of its exact probability (4.5 standard deviations at the largest possible, p = 1/2); the sampler
    draws from the generator it is given only."""
    gen = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(4, 4, generator=gen, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(torch.randn(3, 4, generator=gen, dtype=torch.float64) * 1.5, -1)
    draft = torch.tensor([2, 0, 3])
    exact = block_outcomes(p, q, draft)
    counts: dict[tuple[int, ...], int] = {}
    torch.manual_seed(0)
    state = torch.get_rng_state()
    sampler = torch.Generator().manual_seed(1)
    for _ in range(8000):
        tokens = tuple(block_verify(p, q, draft, sampler).tolist())
        counts[tokens] = counts.get(tokens, 0) + 1
    assert torch.equal(state, torch.get_rng_state())
    assert set(counts) <= set(exact)
    assert max(abs(counts.get(k, 0) / 8000 - v) for k, v in exact.items()) < 0.025


def test_expected_experts_match_simulated_independent_routing_and_measured_routing_is_counted_per_layer():
    """E(1 - (1 - k/E)^n) against 4,000 seeded simulations of n tokens each routed to k distinct uniform experts
    (within 1%); the union counted per layer, once per expert however many tokens share it."""
    from specdec.frontier.moe import expected_experts_touched, experts_touched

    rng = random.Random(0)
    for tokens, top_k, experts in [(1, 2, 8), (5, 2, 8), (5, 8, 64), (40, 8, 64), (3, 1, 1)]:
        runs = [len({e for _ in range(tokens) for e in rng.sample(range(experts), top_k)}) for _ in range(4000)]
        assert expected_experts_touched(tokens, top_k, experts) == pytest.approx(sum(runs) / 4000, rel=0.01)
    assert expected_experts_touched(0, 2, 8) == 0 and expected_experts_touched(1, 2, 8) == 2
    with pytest.raises(ValueError, match="top_k"):
        expected_experts_touched(3, 9, 8)
    routing = torch.tensor([[[0, 1], [1, 0], [2, 1]], [[3, 4], [5, 6], [7, 0]]])  # (layers 2, tokens 3, top_k 2)
    assert experts_touched(routing).tolist() == [3, 6]
    with pytest.raises(ValueError, match="routing"):
        experts_touched(routing.float())


def test_an_moe_target_gains_less_than_a_dense_one_at_batch_1_and_more_at_a_medium_batch():
    """MoESD's argument in the roofline: a Mixtral-8x7B-shaped target (8 experts, top 2) against a dense target of
    the same active size, the same draft, H100 figures: at batch 1 verifying 5 tokens reads about 3 times the
    experts of one token, so speculation gains less; at 256 rows every expert is read anyway and the MoE step is
    still memory bound where the dense one is compute bound, so it gains more."""
    from specdec.frontier.moe import MoEModel, moe_step_seconds, speculative_speedup
    from specdec.ledger import roofline_step_time_s

    moe = MoEModel("mixtral-like", 1.6e9, 3 * 4096 * 14336, experts=8, top_k=2, layers=32)
    bw, fl = 3.35e12, 989e12

    def draft(n):
        return roofline_step_time_s(int(0.5e9), 2, n, bw, fl)

    def gains(batch):
        sparse = speculative_speedup(0.8, 4, batch, lambda n: moe_step_seconds(moe, n, 2, bw, fl), draft)
        dense = speculative_speedup(0.8, 4, batch, lambda n: roofline_step_time_s(int(moe.active_params), 2, n, bw, fl),
                                    draft)
        return sparse, dense

    sparse, dense = gains(1)
    assert sparse < dense - 0.5
    sparse, dense = gains(256)
    assert dense < 1 < sparse
    # measured routing that is more correlated than independent touches fewer experts: a cheaper verify step
    assert moe_step_seconds(moe, 5, 2, bw, fl, touched=lambda n: 2.5) < moe_step_seconds(moe, 5, 2, bw, fl)


def test_long_context_moves_the_crossover_out_and_a_bounded_draft_cache_keeps_the_draft_cheap():
    """Llama-3-8B-shaped target, Llama-3.2-1B-shaped draft, H100: the batch at which speculation stops paying grows
    with the context; at 128k positions a 4k-window draft gains more than a full-cache one (whose KV read grows
    with the target's)."""
    from specdec.frontier.long_context import Decoder, crossover_batch, speedup_at, step_seconds

    target = Decoder("8B", 8.03e9, 2 * 32 * 8 * 128 * 2, 4 * 32 * 32 * 128)
    full = Decoder("1B", 1.24e9, 2 * 16 * 8 * 64 * 2, 4 * 16 * 32 * 64)
    window = Decoder("1B, 4k window", 1.24e9, 2 * 16 * 8 * 64 * 2, 4 * 16 * 32 * 64, window=4096)
    bw, fl = 3.35e12, 989e12
    short, long = crossover_batch(0.8, 4, 512, target, full, 2, bw, fl), crossover_batch(0.8, 4, 8192, target, full, 2, bw, fl)
    assert short is not None and (long is None or long > short)
    assert speedup_at(0.8, 4, 64, 131072, target, window, 2, bw, fl) > speedup_at(0.8, 4, 64, 131072, target, full, 2, bw, fl)
    # the gamma + 1 tokens of a row read its cache once: at long context a verify step costs about a decode step
    assert step_seconds(target, 64, 5, 131072, 2, bw, fl) == pytest.approx(step_seconds(target, 64, 1, 131072, 2, bw, fl))
    assert step_seconds(window, 8, 1, 131072, 2, bw, fl) == step_seconds(window, 8, 1, 4096, 2, bw, fl)


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
def test_a_layer_skip_draft_is_exact_and_never_runs_an_early_layer_twice(exit_layer):
    """Greedy self-speculation with the shipped target's first layers as the draft: the output equals target-only
    greedy decoding, and every layer processes the same positions, counted by hooks on the layers (the early layers
    are not run again by verification: their KV and hidden states from drafting are reused)."""
    from specdec.engine import target_only_generate
    from specdec.frontier.layerskip import layer_skip_generate, positions_per_layer
    from specdec.models.checkpoints import load_pair
    from specdec.models.tokenizer import encode

    target, _ = load_pair()
    for text in ("def parse(self, line):\n", "Tom has 3 apples and buys 4 more. How many"):
        prompt = encode(text)
        with positions_per_layer(target) as counts:
            out, stats = layer_skip_generate(target, exit_layer, prompt, 24, gamma=3)
        assert out == target_only_generate(target, prompt, 24)
        assert len(set(counts)) == 1 and stats["proposed"] >= stats["accepted"] > 0
        assert counts[0] == len(prompt) - 1 + stats["rounds"] + stats["proposed"]
    with pytest.raises(ValueError, match="exit_layer"):
        layer_skip_generate(target, 4, prompt, 4, 2)


def test_a_mixture_of_one_expert_is_the_dense_mlp_and_routing_is_recorded_per_token():
    """MoEMLP with one expert and top_k 1 computes the dense MLP with the same weights (the softmax of one score is 1);
    with 8 experts, top 2, the routing holds each token's two distinct experts, cached decoding gives the logits of
    the full forward, and the balance loss is 1 when the router spreads evenly (a zero router)."""
    from specdec.models.model import MLP, KVCache, Llama, LlamaConfig, MoEMLP

    torch.manual_seed(0)
    one = LlamaConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=48, n_experts=1, top_k=1)
    moe, dense = MoEMLP(one), MLP(one)
    dense.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(2, 5, 32)
    assert torch.allclose(moe(x), dense(x), atol=1e-6)
    config = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=16, n_experts=8, top_k=2)
    model = Llama(config).eval()
    tokens = torch.randint(0, 256, (3, 12))
    with torch.no_grad():
        full = model(tokens)
        routing = model.layers[1].mlp.routing
        assert routing.shape == (36, 2) and bool((routing[:, 0] != routing[:, 1]).all())
        cache = KVCache(config, batch_size=3)
        steps = torch.cat([model(tokens[:, :7], cache), model(tokens[:, 7:], cache)], dim=1)
    assert torch.allclose(steps, full, atol=1e-5)
    layer = MoEMLP(config).train()
    torch.nn.init.zeros_(layer.router.weight)
    layer(torch.randn(64, 32))
    assert layer.balance.item() == pytest.approx(1.0)
    with torch.no_grad():  # every token to experts 0 and 1, nearly all router mass there: 8 * (1/2 * 1/2) * 2 = 4
        layer.router.weight[:2] = 1.0
    layer(torch.ones(64, 32))
    assert layer.balance.item() == pytest.approx(4.0, rel=1e-4)
    with pytest.raises(ValueError, match="top_k"):
        LlamaConfig(n_experts=4, top_k=5)


def test_the_cpu_ledger_describes_the_course_target_and_its_fit_recovers_known_rates():
    """decoder_of counts the target's parameters as the checkpoint holds them, and fitting step times that four known
    rates produced gives those rates back (rates on the fit's grid, so exactly)."""
    from specdec.frontier.long_context import CpuRates, cpu_step_seconds, decoder_of, fit_cpu_rates
    from specdec.models.checkpoints import load_pair

    target, _ = load_pair()
    shape = decoder_of(target.config, "target")
    assert shape.params == sum(p.numel() for p in target.parameters())
    assert shape.kv_bytes == 2 * target.config.n_layers * target.config.n_kv_heads * 64 * 4  # fp32 K and V
    known = CpuRates(2e-4 * 100 ** 0.5, 1e9 * 300 ** 0.5, 1e8 * 1000 ** 0.5, 1e9 * 1000 ** 0.5)
    points = [(rows, tokens, context, cpu_step_seconds(known, shape, rows, tokens, context))
              for rows in (1, 4, 16, 64) for tokens in (1, 5) for context in (16, 128, 480)]
    rates, error = fit_cpu_rates(points, shape)
    assert error < 1e-9
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(vars(rates).values(), vars(known).values()))
