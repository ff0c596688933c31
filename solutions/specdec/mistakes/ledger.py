"""Known-wrong answers to the exercises of notebook 01 (the cost ledger)."""

from __future__ import annotations

from specdec import ledger
from specdec.mistakes import Mistake
from specdec.tables import ModelConfig


def _params(cfg: ModelConfig, *, kv_heads: int | None = None, mlp_mats: int = 3, norms: bool = True,
            final_norm: bool = True, lm_head: bool | None = None) -> int:
    d, hd = cfg.d_model, cfg.head_dim
    kv = cfg.n_kv_heads if kv_heads is None else kv_heads
    per_layer = 2 * d * cfg.n_heads * hd + 2 * d * kv * hd + mlp_mats * d * cfg.d_ff + (2 * d if norms else 0)
    head = (not cfg.tied_embeddings) if lm_head is None else lm_head
    return cfg.vocab_size * d * (2 if head else 1) + cfg.n_layers * per_layer + (d if norms and final_norm else 0)


def _expected_linear(a: float, gamma: int) -> float:
    return 1.0 + gamma * a


def _expected_no_bonus(a: float, gamma: int) -> float:
    return float(gamma) if a == 1.0 else (1.0 - a**gamma) / (1.0 - a)


def _expected_accepted_only(a: float, gamma: int) -> float:
    return ledger.expected_tokens_per_round(a, gamma) - 1.0


def _expected_no_special_case(a: float, gamma: int) -> float:
    return (1.0 - a ** (gamma + 1)) / (1.0 - a)


def _best_gamma_by_tokens(a: float, c: float, max_gamma: int = 32) -> int:
    return max(range(1, max_gamma + 1), key=lambda g: (ledger.expected_tokens_per_round(a, g), -g))


def _best_gamma_excludes_max(a: float, c: float, max_gamma: int = 32) -> int:
    return max(range(1, max_gamma), key=lambda g: (ledger.speedup(a, g, c), -g)) if max_gamma > 1 else 1


def _best_gamma_last_tie(a: float, c: float, max_gamma: int = 32) -> int:
    return max(range(1, max_gamma + 1), key=lambda g: (ledger.speedup(a, g, c), g))


MISTAKES: list[Mistake] = [
    # count_params
    Mistake("count_params", "kv_uses_n_heads", lambda cfg: _params(cfg, kv_heads=cfg.n_heads),
            "K and V are sized with n_heads; with grouped-query attention they have n_kv_heads heads each."),
    Mistake("count_params", "no_lm_head", lambda cfg: _params(cfg, lm_head=False),
            "the LM head is left out; an untied model has its own vocab_size x d_model output matrix."),
    Mistake("count_params", "always_untied", lambda cfg: _params(cfg, lm_head=True),
            "the LM head is counted even though it is tied to (shares) the embedding matrix."),
    Mistake("count_params", "two_matrix_mlp", lambda cfg: _params(cfg, mlp_mats=2),
            "the MLP has two matrices; SwiGLU has three (gate, up and down)."),
    Mistake("count_params", "no_norms", lambda cfg: _params(cfg, norms=False),
            "the RMSNorm weights are left out: two d_model vectors per layer plus a final one."),
    Mistake("count_params", "no_final_norm", lambda cfg: _params(cfg, final_norm=False),
            "the final RMSNorm (d_model weights after the last layer) is left out."),
    # decode_step_floor_s / tokens_per_s_cap
    Mistake("decode_step_floor_s", "ignores_bytes", lambda n, b, bw: n / bw,
            "the parameter count is divided by bandwidth; multiply by bytes_per_param first (bandwidth is bytes/s)."),
    Mistake("decode_step_floor_s", "bits_not_bytes", lambda n, b, bw: n * b * 8 / bw,
            "the weights are counted in bits; bandwidth is in bytes per second."),
    Mistake("tokens_per_s_cap", "milliseconds", lambda n, b, bw: 1e-3 / (n * b / bw),
            "the step time is in milliseconds somewhere; keep everything in seconds."),
    Mistake("tokens_per_s_cap", "returns_step_time", lambda n, b, bw: n * b / bw,
            "the step time is returned; tokens per second is its reciprocal."),
    # kv_bytes_per_token
    Mistake("kv_bytes_per_token", "fp16_hard_coded", lambda cfg, b=2: 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2,
            "2 bytes per element is hard-coded; use bytes_per_elem (FP32, FP8 and 4-bit caches exist)."),
    Mistake("kv_bytes_per_token", "k_only", lambda cfg, b=2: cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * b,
            "only K is counted; the cache holds K and V (a factor 2)."),
    Mistake("kv_bytes_per_token", "uses_n_heads", lambda cfg, b=2: 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * b,
            "n_heads is used; the cache stores n_kv_heads heads per layer (grouped-query attention)."),
    Mistake("kv_bytes_per_token", "one_layer", lambda cfg, b=2: 2 * cfg.n_kv_heads * cfg.head_dim * b,
            "one layer is counted; every layer keeps its own K and V."),
    # expected_tokens_per_round
    Mistake("expected_tokens_per_round", "no_bonus", _expected_no_bonus,
            "the exponent is gamma instead of gamma+1: the round always commits one extra token from the target."),
    Mistake("expected_tokens_per_round", "accepted_only", _expected_accepted_only,
            "only accepted drafts are counted; add the target's own token (correction or bonus)."),
    Mistake("expected_tokens_per_round", "linear", _expected_linear,
            "acceptance is treated as independent per position (1 + gamma*a); "
            "draft i counts only if drafts 1..i are all accepted, probability a**i."),
    Mistake("expected_tokens_per_round", "no_a_equals_1", _expected_no_special_case,
            "a = 1 divides by zero; the sum 1 + a + ... + a**gamma is then gamma+1."),
    # speedup
    Mistake("speedup", "free_draft", lambda a, g, c: ledger.expected_tokens_per_round(a, g),
            "the draft's cost is left out; a round costs gamma draft steps plus one target step."),
    Mistake("speedup", "one_draft_step", lambda a, g, c: ledger.expected_tokens_per_round(a, g) / (1 + c),
            "one draft step is charged per round; the draft runs gamma times."),
    Mistake("speedup", "no_target_step", lambda a, g, c: ledger.expected_tokens_per_round(a, g) / (g * c) if c else float("inf"),
            "the target's verification step is left out of the round's cost."),
    # best_gamma
    Mistake("best_gamma", "max_tokens", _best_gamma_by_tokens,
            "gamma is chosen by expected tokens, which always grow with gamma; choose by speedup, which pays for the drafts."),
    Mistake("best_gamma", "excludes_max_gamma", _best_gamma_excludes_max,
            "range(1, max_gamma) leaves out max_gamma itself."),
    Mistake("best_gamma", "largest_on_tie", _best_gamma_last_tie,
            "ties go to the larger gamma; take the smallest (fewer drafts for the same speed)."),
    # roofline_step_time_s
    Mistake("roofline_step_time_s", "sum_not_max", lambda n, b, t, bw, f: n * b / bw + 2 * n * t / f,
            "memory and compute time are added; they overlap, so the step takes the larger of the two."),
    Mistake("roofline_step_time_s", "one_flop_per_param", lambda n, b, t, bw, f: max(n * b / bw, n * t / f),
            "one FLOP per parameter per token; a multiply-add is 2 FLOPs."),
    Mistake("roofline_step_time_s", "fp16_hard_coded", lambda n, b, t, bw, f: max(n * 2 / bw, 2 * n * t / f),
            "2 bytes per parameter is hard-coded in the memory time; use bytes_per_param."),
    Mistake("roofline_step_time_s", "bytes_as_flops", lambda n, b, t, bw, f: max(n * b / bw, n * b * t / f),
            "bytes_per_param is used in the compute time; a parameter costs 2 FLOPs per token whatever its precision."),
    Mistake("roofline_step_time_s", "ignores_tokens", lambda n, b, t, bw, f: max(n * b / bw, 2 * n / f),
            "the compute time ignores n_tokens; every scored position costs 2 FLOPs per parameter."),
]
