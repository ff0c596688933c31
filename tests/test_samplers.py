"""The reference samplers are exact: by enumeration where the space is small, by seeded
Monte Carlo elsewhere (tolerance: 5 binomial standard deviations per outcome, see
specdec.checks.stats), and bad input gets a clear error."""

from __future__ import annotations

import math

import pytest
import torch

from specdec import chain, greedy, rejection
from specdec.checks.stats import compare_frequencies
from specdec.models.toy import ToyLM, greedy_generate
from specdec.sampling import probs_from_logits, sample_from_weights

D = torch.float64


def _pair(V: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2 * torch.randn(V, generator=g, dtype=D), 0), torch.softmax(2 * torch.randn(V, generator=g, dtype=D), 0)


@pytest.mark.parametrize("seed", range(5))
def test_output_paths_add_up_to_p(seed):
    p, q = _pair(7, seed)
    accept, reject = rejection.output_paths(p, q)
    assert torch.allclose(accept + reject, p, atol=1e-15)
    assert math.isclose(float(reject.sum()), 1 - rejection.acceptance_rate(p, q), abs_tol=1e-15)
    assert math.isclose(rejection.acceptance_rate(p, q), 1 - 0.5 * float((p - q).abs().sum()), abs_tol=1e-15)


def test_worked_example():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=D)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=D)
    accept, reject = rejection.output_paths(p, q)
    assert torch.allclose(accept, torch.tensor([0.2, 0.3, 0.1], dtype=D))
    assert torch.allclose(reject, torch.tensor([0.4, 0.0, 0.0], dtype=D))
    wrong = accept + reject.sum() * p
    assert torch.allclose(wrong, torch.tensor([0.44, 0.42, 0.14], dtype=D))


def test_edge_cases():
    p = torch.tensor([0.5, 0.25, 0.25], dtype=D)
    assert torch.equal(rejection.residual_distribution(p, p), p)
    assert rejection.acceptance_rate(p, p) == 1.0
    one_hot = torch.tensor([0.0, 1.0, 0.0], dtype=D)
    assert rejection.acceptance_probability(p, one_hot, 1) == 0.25
    assert torch.allclose(rejection.residual_distribution(p, one_hot), torch.tensor([2 / 3, 0.0, 1 / 3], dtype=D))
    zero_at_y = torch.tensor([0.5, 0.0, 0.5], dtype=D)
    assert rejection.verify_token(zero_at_y, p, 1, 0.0, torch.Generator().manual_seed(0))[0] is False


@pytest.mark.parametrize("seed", range(3))
def test_verify_token_monte_carlo(seed):
    p, q = _pair(5, seed)
    g = torch.Generator().manual_seed(seed)
    n = 20_000
    ys = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    us = torch.rand(n, generator=g, dtype=D).tolist()
    outputs = [rejection.verify_token(p, q, y, u, g)[1] for y, u in zip(ys, us)]
    compare_frequencies(outputs, dict(enumerate(p.tolist())), "verify_token")


def test_vectorised_monte_carlo_matches_p():
    p, q = _pair(6, 11)
    n = 400_000
    empirical = rejection.monte_carlo_output(p, q, n, torch.Generator().manual_seed(0))
    assert ((empirical - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1 / n).all()


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7, 0.0])
@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_round_is_exact_by_enumeration(temperature, gamma):
    target = ToyLM(3, seed=gamma, scale=1.5)
    draft = target.noisy_copy(1.0, seed=10 + gamma)
    context = torch.tensor([1, 2])
    ours = chain.round_sequence_distribution(target, draft, context, gamma, temperature)
    theirs = chain.target_sequence_distribution(target, context, gamma + 1, temperature)
    assert math.isclose(sum(ours.values()), 1.0, abs_tol=1e-12)
    assert chain.total_variation(ours, theirs) < 1e-12


def test_enumeration_catches_the_wrong_rule():
    """The enumeration is not vacuous: resampling from p after a rejection is visibly off."""
    p = torch.softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=D), -1)
    q = torch.softmax(torch.randn(2, 4, generator=torch.Generator().manual_seed(1), dtype=D), -1)
    y = int((q[0] / p[0]).argmax())  # a draft token the target likes less than the draft: rejections happen
    exact = chain.outcome_distribution(p, q, torch.tensor([y, 2]))
    assert math.isclose(sum(exact.values()), 1.0, abs_tol=1e-12)
    first = {x: sum(v for k, v in exact.items() if k[0] == x) for x in range(4)}
    alpha = float(p[0, y] / q[0, y])
    assert alpha < 1
    # for a fixed draft y the first token is y w.p. alpha, else the residual; averaged over y ~ q it is p[0] (notebook 03)
    assert math.isclose(first[y], alpha, rel_tol=1e-12)
    wrong_first = {x: (alpha if x == y else 0.0) + (1 - alpha) * float(p[0, x]) for x in range(4)}
    right_first = {x: (alpha if x == y else 0.0) + (1 - alpha) * float(rejection.residual_distribution(p[0], q[0])[x])
                   for x in range(4)}
    assert max(abs(first[x] - right_first[x]) for x in range(4)) < 1e-12
    assert max(abs(wrong_first[x] - right_first[x]) for x in range(4)) > 0.01


@pytest.mark.parametrize("scenario", range(3))
def test_verify_chain_and_batched_agree_with_exact_outcomes(scenario):
    g = torch.Generator().manual_seed(scenario)
    V, gamma = 4, 3
    p = torch.softmax(torch.randn(gamma + 1, V, generator=g, dtype=D), -1)
    q = torch.softmax(torch.randn(gamma, V, generator=g, dtype=D), -1)
    draft = torch.multinomial(q, 1, generator=g).squeeze(-1)
    exact = chain.outcome_distribution(p, q, draft)
    sequential = [tuple(chain.verify_chain(p, q, draft, g).tolist()) for _ in range(6000)]
    compare_frequencies(sequential, exact, "verify_chain")
    R = 40_000
    tokens, n = chain.verify_chain_batched(p.expand(R, -1, -1).contiguous(), q.expand(R, -1, -1).contiguous(),
                                           draft.expand(R, -1).contiguous(), g)
    compare_frequencies([tuple(t[: int(k)].tolist()) for t, k in zip(tokens, n)], exact, "verify_chain_batched")
    assert ((tokens == greedy.PAD) == (torch.arange(gamma + 1) >= n[:, None])).all()


def test_sample_from_weights_is_proportional_and_skips_zeros():
    w = torch.tensor([[0.0, 2.0, 0.0, 1.0, 1.0, 0.0]]).expand(100_000, -1)
    draws = sample_from_weights(w, torch.Generator().manual_seed(0)).tolist()
    compare_frequencies(draws, {1: 0.5, 3: 0.25, 4: 0.25}, "sample_from_weights")


def test_probs_from_logits():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert torch.equal(probs_from_logits(logits, 0.0), torch.tensor([[0.0, 1.0, 0.0]], dtype=D))
    assert torch.allclose(probs_from_logits(logits, 1.0), torch.softmax(logits.double(), -1))
    assert probs_from_logits(logits, 0.5)[0, 1] > probs_from_logits(logits, 1.0)[0, 1]


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_speculation_equals_greedy(gamma):
    target = ToyLM(10, seed=0)
    draft = target.noisy_copy(1.5, seed=1)
    prompt = torch.tensor([5, 9])
    tokens, per_round = greedy.speculative_greedy_generate(target, draft, prompt, 40, gamma)
    assert torch.equal(tokens, greedy_generate(target, prompt, 40))
    assert all(1 <= k <= gamma + 1 for k in per_round) and sum(per_round) >= 40


def test_greedy_batched_equals_single():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 5, 6, generator=g)
    draft = logits[:, :4].argmax(-1)
    draft[::3, 1] = (draft[::3, 1] + 1) % 6
    tokens, n = greedy.greedy_verify_batched(draft, logits)
    for b in range(32):
        single = greedy.greedy_verify(draft[b], logits[b])
        assert int(n[b]) == len(single) and torch.equal(tokens[b, : len(single)], single)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: rejection.residual_distribution(torch.tensor([0.5, 0.5]), torch.tensor([1.0])), ValueError, "same shape"),
        (lambda: rejection.acceptance_rate(torch.tensor([0.7, 0.7]), torch.tensor([0.5, 0.5])), ValueError, "must sum to 1"),
        (lambda: rejection.acceptance_rate(torch.tensor([1.5, -0.5]), torch.tensor([0.5, 0.5])), ValueError, "negative"),
        (lambda: rejection.acceptance_rate(torch.tensor([float("nan"), 0.5]), torch.tensor([0.5, 0.5])), ValueError, "NaN"),
        (lambda: rejection.acceptance_rate([0.5, 0.5], torch.tensor([0.5, 0.5])), TypeError, "torch.Tensor"),
        (lambda: rejection.acceptance_probability(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), 1),
         ValueError, "q\\[y\\] = 0"),
        (lambda: rejection.verify_token(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]), 0, 1.5), ValueError, "u must be"),
        (lambda: chain.verify_chain(torch.ones(2, 3) / 3, torch.ones(2, 3) / 3, torch.tensor([0, 1])),
         ValueError, "p .*\\(2, 'V'\\)|must be"),
        (lambda: chain.verify_chain(torch.ones(1, 3) / 3, torch.ones(0, 3), torch.tensor([], dtype=torch.long)),
         ValueError, "gamma must be >= 1"),
        (lambda: chain.verify_chain(torch.ones(2, 3) / 3, torch.ones(1, 3) / 3, torch.tensor([3])),
         ValueError, "outside \\[0, 3\\)"),
        (lambda: chain.verify_chain(torch.ones(2, 3) / 3, torch.ones(1, 3) / 3, torch.tensor([0.0])),
         TypeError, "integer tensor"),
        (lambda: greedy.greedy_verify(torch.tensor([1, 2]), torch.randn(2, 5)), ValueError, "gamma \\+ 1 = 3 rows"),
        (lambda: greedy.greedy_verify_batched(torch.tensor([[1, 2]]), torch.randn(2, 3, 5)),
         ValueError, "shape \\(B, gamma \\+ 1, V\\)"),
        (lambda: greedy.round_shapes(2, 3, 4), ValueError, "k \\(accepted drafts\\) must be <= gamma"),
        (lambda: greedy.round_shapes(2, 0, 0), ValueError, "gamma must be >= 1"),
        (lambda: chain.speculative_round(ToyLM(3), ToyLM(3), torch.tensor([0]), 0, 1.0, torch.Generator()),
         ValueError, "gamma must be >= 1"),
        (lambda: probs_from_logits(torch.zeros(3), -1.0), ValueError, "temperature"),
    ],
)
def test_bad_input_gets_a_clear_error(call, error, words):
    with pytest.raises(error, match=words):
        call()
