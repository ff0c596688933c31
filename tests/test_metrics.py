"""Acceptance in its three forms (specdec.metrics): estimates recover a known alpha, conversions invert."""

from __future__ import annotations

import random

import pytest

from specdec.checks.analysis import simulated_round
from specdec.ledger import expected_tokens_per_round
from specdec.metrics import acceptance_metrics, alpha_estimate, alpha_from_rate, alpha_from_tau, rate_from_alpha


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_alpha_is_recovered_from_simulated_rounds_at_any_gamma(gamma):
    rng = random.Random(gamma)
    accepted = [simulated_round(rng, 0.8, gamma) for _ in range(20_000)]
    m = acceptance_metrics(accepted, [gamma] * len(accepted))
    # alpha's standard error here is below 0.004: 0.01 is more than two and a half of them
    assert abs(m["alpha"] - 0.8) < 0.01, m["alpha"]
    assert m["draft_acceptance_rate"] == sum(accepted) / (gamma * len(accepted))
    assert m["mean_acceptance_length"] == 1 + sum(accepted) / len(accepted)
    assert len(m["per_position"]) == gamma and all(abs(r - 0.8) < 0.03 for r in m["per_position"]), m["per_position"]
    assert abs(m["mean_acceptance_length"] - expected_tokens_per_round(0.8, gamma)) < 0.05
    if gamma > 1:  # the rate is not alpha: it falls with gamma at a fixed alpha
        assert m["draft_acceptance_rate"] < m["alpha"] - 0.1


def test_mixed_gammas_and_per_position_rates_count_only_tested_positions():
    m = acceptance_metrics([2, 0, 1, 3], [2, 3, 4, 4])
    assert m["alpha"] == 6 / (6 + 3)  # rounds 2, 3 and 4 ended by a rejection
    assert m["draft_acceptance_rate"] == 6 / 13 and m["mean_acceptance_length"] == 1 + 6 / 4
    # position 0: tested by all 4 rounds, 3 passed; 1: by rounds 1, 3, 4, 2 passed; 2 and 3: by round 4 only
    assert m["per_position"] == [3 / 4, 2 / 3, 1 / 1, 0 / 1]
    assert acceptance_metrics([0], [1])["per_position"] == [0.0]
    assert acceptance_metrics([1, 0], [1, 2])["per_position"] == [0.5, None]


def test_every_round_accepted_gives_alpha_one():
    assert alpha_estimate([4, 4], [4, 4]) == 1.0


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.757, 0.89, 0.99, 1.0])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_conversions_invert(alpha, gamma):
    assert alpha_from_rate(rate_from_alpha(alpha, gamma), gamma) == pytest.approx(alpha, abs=1e-9)
    assert alpha_from_tau(expected_tokens_per_round(alpha, gamma), gamma) == pytest.approx(alpha, abs=1e-9)


def test_the_dashboard_example():
    assert alpha_from_rate(0.757, 4) == pytest.approx(0.8917, abs=1e-4)
    assert expected_tokens_per_round(alpha_from_rate(0.757, 4), 4) == pytest.approx(1 + 4 * 0.757)


@pytest.mark.parametrize("accepted, gammas, error", [
    ([], [], ValueError), ([1], [1, 2], ValueError), ([3], [2], ValueError), ([-1], [2], ValueError),
    ([1], [0], ValueError), ([1.5], [2], TypeError), ("12", "22", TypeError),
])
def test_bad_rounds_are_named(accepted, gammas, error):
    with pytest.raises(error):
        acceptance_metrics(accepted, gammas)


def test_bad_conversion_inputs_are_named():
    with pytest.raises(ValueError, match="rate"):
        alpha_from_rate(1.2, 4)
    with pytest.raises(ValueError, match="gamma"):
        alpha_from_rate(0.5, 0)
    with pytest.raises(ValueError, match="tau"):
        alpha_from_tau(6.0, 4)
