"""Hidden-test checks for notebook 01 (the cost ledger).

Each ``check_<exercise>(fn)`` compares the learner's ``fn`` with the reference in
:mod:`specdec.ledger` on the published models, edge cases and seeded random inputs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from specdec import ledger
from specdec.checks.core import compare_cases, expect_value_error
from specdec.checks.seeds import salted
from specdec.tables import ModelConfig, load_gpus, load_models

_SEED = 2024


def _describe(cfg: ModelConfig) -> str:
    return (
        f"{cfg.name}: vocab {cfg.vocab_size}, d_model {cfg.d_model}, {cfg.n_layers} layers, "
        f"{cfg.n_heads} heads, {cfg.n_kv_heads} KV heads, d_ff {cfg.d_ff}, "
        f"{'tied' if cfg.tied_embeddings else 'untied'} embeddings"
    )


def _configs() -> Iterator[ModelConfig]:
    yield from load_models().values()
    rng = random.Random(salted(_SEED))
    for i in range(30):
        n_kv = rng.choice([1, 2, 4, 8])
        n_heads = n_kv * rng.choice([1, 2, 4])
        head_dim = rng.choice([16, 32, 64, 128])
        yield ModelConfig(
            name=f"random-{i}",
            vocab_size=rng.randint(100, 200_000),
            d_model=n_heads * head_dim,
            n_layers=rng.randint(1, 100),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            d_ff=rng.randint(64, 50_000),
            tied_embeddings=rng.random() < 0.5,
        )


def _model_cases() -> list[tuple[str, tuple]]:
    return [(_describe(cfg), (cfg,)) for cfg in _configs()]


def _hardware_cases() -> list[tuple[str, tuple]]:
    """(n_params, bytes_per_param, bandwidth) over the model and GPU tables, plus random ones."""
    cases = []
    for model in load_models().values():
        n = ledger.count_params(model)
        for gpu in load_gpus().values():
            for nbytes in (2, 1, 0.5):
                cases.append((f"n_params={n}, bytes_per_param={nbytes}, bandwidth={gpu.bandwidth:g}", (n, nbytes, gpu.bandwidth)))
    rng = random.Random(salted(_SEED))
    for _ in range(20):
        n, nbytes, bw = rng.randint(1, 10**12), rng.choice([4, 2, 1, 0.5]), rng.uniform(1e9, 1e13)
        cases.append((f"n_params={n}, bytes_per_param={nbytes}, bandwidth={bw:g}", (n, nbytes, bw)))
    for bw in (5e5, 2.5e4):  # a slow link (bytes/s, as always): nothing special about a small number
        cases.append((f"n_params=1000000, bytes_per_param=2, bandwidth={bw:g}", (1_000_000, 2, bw)))
    return cases


def _rate_gamma_pairs() -> list[tuple[float, int]]:
    pairs = [(0.8, 4), (0.5, 3), (0.9, 8)]  # telling cases first: they separate the catalogued mistakes
    pairs += [(a, g) for a in (0.0, 0.3, 0.5, 0.8, 0.9, 0.99, 0.9999, 0.99999, 1.0) for g in (0, 1, 2, 4, 8, 16, 40)]
    pairs += [(1, 4), (0, 3), (1, 0)]  # a given as an int: 0 <= a <= 1 allows it
    rng = random.Random(salted(_SEED))
    pairs += [(rng.random(), rng.randint(0, 40)) for _ in range(40)]
    return pairs


def check_count_params(fn: Callable) -> None:
    """Published models (7B, 13B, 70B, GQA, tied embeddings) and 30 random configs."""
    compare_cases(fn, ledger.count_params, _model_cases(), rel=0.0, integer=True)


def check_decode_floor(step_fn: Callable, cap_fn: Callable) -> None:
    """decode_step_floor_s and tokens_per_s_cap over models x GPUs x precisions."""
    cases = _hardware_cases()
    compare_cases(step_fn, ledger.decode_step_floor_s, cases)
    compare_cases(cap_fn, ledger.tokens_per_s_cap, cases, requires=[("decode_step_floor_s", _check_step)])
    for args in ((0, 2, 3.35e12), (7_000_000_000, -2, 3.35e12), (7_000_000_000, 2, 0.0)):
        expect_value_error(cap_fn, f"tokens_per_s_cap{args}", *args,
                           why="a model, a precision and a bandwidth are positive; decode_step_floor_s checks them")
    expect_value_error(cap_fn, "tokens_per_s_cap(n_params=7e9 + 0.5, 2, 3.35e12)", 7e9 + 0.5, 2, 3.35e12, error=TypeError,
                       why="a parameter count is an int; decode_step_floor_s's check_positive_int refuses a float")


def check_kv_bytes_per_token(fn: Callable) -> None:
    """Every model config at FP16 (default), FP32, FP8 and 4-bit cache entries."""
    models = _model_cases()
    cases = list(models)
    for nbytes in (4, 1, 0.5):
        cases += [(f"{desc}, bytes_per_elem={nbytes}", (*args, nbytes)) for desc, args in models]
    cases += [(f"{desc}, bytes_per_elem=0.3 (any positive size: the bytes need not be whole)", (*args, 0.3))
              for desc, args in models[:3]]
    compare_cases(fn, ledger.kv_bytes_per_token, cases)


def check_expected_tokens_per_round(fn: Callable) -> None:
    """a in [0, 1] including a = 0 and a = 1, gamma from 0 to 40."""
    cases = [(f"a={a!r}, gamma={g}", (a, g)) for a, g in _rate_gamma_pairs()]
    # rel 1e-7: any correct formula passes (the closed form loses digits as a -> 1), while
    # shortcuts such as "a > 0.999 means a = 1" are off by 1e-5 or more.
    compare_cases(fn, ledger.expected_tokens_per_round, cases, rel=1e-7)


def check_speedup(fn: Callable) -> None:
    """Rates, draft lengths and cost ratios including a free draft (c = 0)."""
    costs = (0.0, 0.01, 0.05, 0.114, 0.5, 1.0)
    pairs = _rate_gamma_pairs()
    pairs = pairs[:42] + [(a, g) for a, g in pairs if a in (1, 0.99999)]  # a = 1 exactly, and next to it
    cases = [(f"a={a!r}, gamma={g}, c={c!r}", (a, g, c)) for a, g in pairs for c in costs]
    cases += [(f"a={a!r}, gamma={g}, c={c!r} (a draft slower than the target: allowed, speculation loses)", (a, g, c))
              for a, g in pairs[:6] for c in (1.5, 4.0)]
    compare_cases(fn, ledger.speedup, cases, rel=1e-7,
                  requires=[("expected_tokens_per_round", check_expected_tokens_per_round)])
    for a, gamma in ((1.5, 4), (-0.1, 4), (0.8, -1), (1.5, 0)):
        expect_value_error(fn, f"speedup(a={a}, gamma={gamma}, c=0.05)", a, gamma, 0.05,
                           why="a is a probability (0 <= a <= 1) and gamma >= 0; expected_tokens_per_round checks both")


def check_best_gamma(fn: Callable) -> None:
    """A grid of a and c, small max_gamma, a free draft and exact ties."""
    cases = []
    for a in (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0):
        for c in (0.0, 0.02, 0.05, 0.1, 0.3, 1.0):
            for max_gamma in (1, 5, 32):
                cases.append((f"a={a!r}, c={c!r}, max_gamma={max_gamma}", (a, c, max_gamma)))
    rng = random.Random(salted(41))  # and inputs nobody can list in advance (a grading run salts the seed)
    for _ in range(8):
        a, c, max_gamma = round(rng.uniform(0.05, 0.98), 6), round(rng.uniform(0.001, 0.6), 6), rng.randint(1, 40)
        cases.append((f"a={a!r}, c={c!r}, max_gamma={max_gamma}", (a, c, max_gamma)))
    compare_cases(fn, ledger.best_gamma, cases, rel=0.0, integer=True,
                  requires=[("expected_tokens_per_round", check_expected_tokens_per_round), ("speedup", check_speedup)])


def check_roofline_step_time_s(fn: Callable) -> None:
    """Memory-bound and compute-bound shapes on every GPU in the table, at 4, 2, 1 and 0.5 bytes."""
    cases = []
    for model in ("llama-2-7b", "llama-3-70b"):
        n = ledger.count_params(load_models()[model])
        for gpu in load_gpus().values():
            for nbytes in (2, 1, 0.5, 4):
                for tokens in (8192, 1024, 300, 64, 5, 1):  # compute-bound first: they separate the mistakes
                    args = (n, nbytes, tokens, gpu.bandwidth, gpu.bf16_flops)
                    cases.append((f"{model} ({n} params), bytes_per_param={nbytes}, n_tokens={tokens}, {gpu.name}", args))
    rng = random.Random(salted(42))  # and inputs nobody can list in advance (a grading run salts the seed)
    gpus = list(load_gpus().values())
    for _ in range(8):
        n, nbytes = rng.randint(10**8, 4 * 10**11), rng.choice((0.5, 1, 2, 4))
        tokens, gpu = rng.randint(1, 16384), rng.choice(gpus)
        cases.append((f"{n} params, bytes_per_param={nbytes}, n_tokens={tokens}, {gpu.name}",
                      (n, nbytes, tokens, gpu.bandwidth, gpu.bf16_flops)))
    compare_cases(fn, ledger.roofline_step_time_s, cases)


def _check_step(fn: Callable) -> None:
    compare_cases(fn, ledger.decode_step_floor_s, _hardware_cases())
