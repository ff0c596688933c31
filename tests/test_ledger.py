"""The cost ledger's reference functions: the curriculum's figures, properties, bad input."""

import math

import pytest
from hypothesis import given, strategies as st

from specdec import ledger
from specdec.tables import ModelConfig, load_gpus, load_models

MODELS = load_models()
GPUS = load_gpus()


@pytest.mark.parametrize(
    "name, expected",
    [
        ("llama-2-7b", 6_738_415_616),
        ("llama-2-13b", 13_015_864_320),
        ("llama-2-70b", 68_976_648_192),
        ("llama-3-8b", 8_030_261_248),
        ("llama-3-70b", 70_553_706_496),
        ("llama-3.2-1b", 1_235_814_400),
        ("tinyllama-1.1b", 1_100_048_384),
    ],
)
def test_count_params_matches_published_counts(name, expected):
    assert ledger.count_params(MODELS[name]) == expected


def test_llama2_7b_fp16_figures():
    n = ledger.count_params(MODELS["llama-2-7b"])
    assert n * 2 / 1e9 == pytest.approx(13.48, abs=0.005)
    step = ledger.decode_step_floor_s(n, 2, GPUS["H100 SXM"].bandwidth)
    assert step == pytest.approx(4.02e-3, rel=1e-3)
    assert ledger.tokens_per_s_cap(n, 2, GPUS["H100 SXM"].bandwidth) == pytest.approx(248.6, rel=1e-3)
    assert GPUS["H100 SXM"].ridge_point == pytest.approx(295, rel=0.01)
    assert ledger.arithmetic_intensity(1, 2) == 1.0


def test_kv_bytes_per_token():
    assert ledger.kv_bytes_per_token(MODELS["llama-2-7b"]) == 0.5 * 2**20
    assert ledger.kv_bytes_per_token(MODELS["llama-3-8b"]) == 128 * 2**10
    assert ledger.kv_bytes_per_token(MODELS["llama-2-7b"], 1) == 0.25 * 2**20


def test_curriculum_speedup_figures():
    assert ledger.expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616)
    assert ledger.expected_tokens_per_round(1.0, 4) == 5.0
    assert ledger.speedup(0.8, 4, 0.05) == pytest.approx(2.8013, abs=1e-4)
    assert ledger.best_gamma(0.8, 0.05) == 8
    assert ledger.speedup(0.8, 8, 0.05) == pytest.approx(3.092, abs=1e-3)
    c = ledger.count_params(MODELS["llama-3-8b"]) / ledger.count_params(MODELS["llama-3-70b"])
    assert c == pytest.approx(0.114, abs=0.001)
    assert ledger.speedup(0.8, 4, c) == pytest.approx(2.3, abs=0.01)
    assert ledger.acceptance_for_speedup(2.5, 4, c) == pytest.approx(0.84, abs=0.002)


@given(a=st.floats(0.0, 1.0), gamma=st.integers(0, 64))
def test_expected_tokens_is_the_geometric_sum(a, gamma):
    direct = math.fsum(a**i for i in range(gamma + 1))
    assert ledger.expected_tokens_per_round(a, gamma) == pytest.approx(direct, rel=1e-9, abs=1e-12)
    assert 1.0 <= ledger.expected_tokens_per_round(a, gamma) <= gamma + 1 + 1e-9


@given(a=st.floats(0.0, 1.0), c=st.floats(0.0, 1.0), max_gamma=st.integers(1, 40))
def test_best_gamma_is_the_smallest_argmax(a, c, max_gamma):
    values = [ledger.speedup(a, g, c) for g in range(1, max_gamma + 1)]
    assert ledger.best_gamma(a, c, max_gamma) == 1 + values.index(max(values))


def test_roofline_crossover_at_ridge_point():
    h100 = GPUS["H100 SXM"]
    n = 7_000_000_000
    ridge_tokens = h100.ridge_point * 2 / 2  # FP16: 2 bytes per parameter, 2 FLOPs per parameter per token
    below = ledger.roofline_step_time_s(n, 2, int(ridge_tokens) - 1, h100.bandwidth, h100.bf16_flops)
    above = ledger.roofline_step_time_s(n, 2, int(ridge_tokens) + 50, h100.bandwidth, h100.bf16_flops)
    assert below == pytest.approx(n * 2 / h100.bandwidth)
    assert above > below


def test_speedup_at_batch_falls_when_compute_bound():
    h100 = GPUS["H100 SXM"]
    n = ledger.count_params(MODELS["llama-2-7b"])
    at = lambda batch: ledger.speedup_at_batch(0.8, 4, 0.05, batch, n, 2, h100.bandwidth, h100.bf16_flops)  # noqa: E731
    assert at(1) == pytest.approx(ledger.speedup(0.8, 4, 0.05), rel=1e-9)
    assert at(512) < 1.0 < at(16)
    assert ledger.speedup_at_batch(0.8, 0, 0.05, 8, n, 2, h100.bandwidth, h100.bf16_flops) == 1.0


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: ledger.expected_tokens_per_round(1.2, 4), ValueError, "a must be a probability"),
        (lambda: ledger.expected_tokens_per_round(float("nan"), 4), ValueError, "a must be a probability"),
        (lambda: ledger.expected_tokens_per_round(0.5, -1), ValueError, "gamma must be >= 0"),
        (lambda: ledger.expected_tokens_per_round(0.5, 2.5), TypeError, "gamma must be an integer"),
        (lambda: ledger.speedup(0.5, 4, -0.1), ValueError, "c must be a finite number >= 0"),
        (lambda: ledger.best_gamma(0.5, 0.1, 0), ValueError, "max_gamma must be >= 1"),
        (lambda: ledger.decode_step_floor_s(10, 2, 0), ValueError, "bandwidth must be a finite number > 0"),
        (lambda: ledger.count_params({"d_model": 4096}), TypeError, "expects a ModelConfig"),
        (lambda: ledger.acceptance_for_speedup(10, 4, 0.1), ValueError, "out of reach"),
    ],
)
def test_bad_input_gets_a_clear_error(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_model_config_rejects_inconsistent_heads():
    with pytest.raises(ValueError, match="not a multiple of n_kv_heads"):
        ModelConfig("bad", 100, 64, 2, 8, 3, 128)
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        ModelConfig("bad", 100, 65, 2, 8, 8, 128)
