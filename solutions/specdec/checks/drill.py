"""Hidden-test checks for the interview drills of notebooks 12, 13, 14 and 15 (notebook 10's drill is in
``specdec.checks.pitfalls``).

A numeric question holds its exact answer, a relative tolerance that accepts correct rounding, and its
derivation, which the failure message shows; a choice holds its right letter. A wrong answer that matches
one of ``specdec.mistakes.drill``'s catalogued slips is named as that slip.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.checks.core import CheckFailure, close, fmt
from specdec.drafters.memory import drafter_cost
from specdec.frontier.moe import expected_experts_touched
from specdec.ledger import expected_tokens_per_round
from specdec.metrics import alpha_from_rate
from specdec.mistakes.drill import for_question
from specdec.models.model import LlamaConfig
from specdec.production.knobs import k_schedule
from specdec.questions2026.ledger import best_gamma_by_position
from specdec.tree import flatten_tree

#: The grouped-query target of notebook 12's memory questions (weights and KV in 2 bytes per value).
GQA_TARGET = LlamaConfig(vocab_size=128_256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14_336,
                         max_seq_len=8192)
#: Notebook 13's profile at batch 32: seconds per step by K, and the per-position acceptance rates.
PROFILE_ITL = {32: {0: 0.020, 1: 0.023, 2: 0.026, 3: 0.030, 4: 0.035}}
PROFILE_RATES = (0.8, 0.65, 0.5, 0.35)
#: Notebook 13's CUDA-graph capture sizes (tokens per forward).
CAPTURE_SIZES = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: Notebook 13's suffix walk: child count / parent count at each step down the most frequent path.
SUFFIX_RATIOS = (1.0, 0.95, 0.9, 1.0, 0.85, 0.9, 0.8, 0.9, 0.7)


@dataclass(frozen=True)
class Number:
    notebook: str
    answer: float
    rel: float  # relative tolerance: 0 for counts, which must be exact
    why: str  # the derivation, shown when the answer is wrong


@dataclass(frozen=True)
class Choice:
    notebook: str
    answer: str  # the right letter; the catalogue says why each other letter is wrong


def _medusa_tree_positions() -> int:
    paths = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(2)]
    paths += [(a, b, c) for a in range(3) for b in range(2) for c in range(2)]
    return len(flatten_tree(paths))


def _suffix_drafts(match: int = 5, factor: float = 1.5, max_drafts: int = 16, min_prob: float = 0.1) -> int:
    drafts, prob = 0, 1.0
    for ratio in SUFFIX_RATIOS:
        if drafts == min(max_drafts, int(factor * match)) or prob * ratio < min_prob:
            break
        prob *= ratio
        drafts += 1
    return drafts


def _mtp_tau(alphas: tuple[float, ...] = (0.88, 0.8, 0.7)) -> float:
    tau, survive = 1.0, 1.0
    for a in alphas:
        survive *= a
        tau += survive
    return tau


def _parallel_gamma() -> int:
    """Notebook 15's drill: the best gamma for a parallel drafter (one pass of 0.1 step, verify 1 + 0.05 gamma)."""
    return best_gamma_by_position((0.9, 0.75, 0.6, 0.45, 0.3, 0.2), lambda g: 0.1, lambda g: 1 + 0.05 * g)[0]


def _numbers() -> dict[str, Number]:
    eagle = drafter_cost("eagle", GQA_TARGET, None, 32, 8192, 4, 5)
    medusa = drafter_cost("medusa", GQA_TARGET, None, 1, 1, 4, 5, num_heads=5)
    tokens = 19 * (1 + 3)
    return {
        # -- notebook 12 --------------------------------------------------------------------------------------
        "EAGLE_KV_MIB": Number("12_self_drafting", eagle.kv_bytes / 2**20, 0.005,
                               "The drafter is one decoder layer: per token it caches K and V, 2 x n_kv_heads x "
                               "head_dim = 2 x 8 x 128 = 2,048 values = 4,096 bytes; 32 x 8,192 = 262,144 tokens "
                               "give 1 GiB = 1,024 MiB."),
        "MEDUSA_PARAMS": Number("12_self_drafting", medusa.weight_bytes / 2, 0.005,
                                "Each head: a residual block d x d + d and its own vocabulary projection V x d = "
                                "16,781,312 + 525,336,576 = 542,117,888; five heads: 2,710,589,440 (about 2.7B)."),
        "MEDUSA_TREE_POSITIONS": Number("12_self_drafting", _medusa_tree_positions(), 0.0,
                                        "Levels multiply: 3 nodes at depth 1, 3 x 2 = 6 at depth 2, 3 x 2 x 2 = 12 "
                                        "at depth 3; 21 nodes, plus the root the target also scores: 22."),
        "EAGLE2_NODES_CREATED": Number("12_self_drafting", 8 + (6 - 1) * 8 * 8, 0.0,
                                       "Step 1 expands the root into top_k = 8 children; each of the 5 later steps "
                                       "expands the 8 best new nodes into 8 children each, 64 per step: 8 + 5 x 64 "
                                       "= 328, of which the rerank keeps the budget (60)."),
        "TAU_FROM_RATES": Number("12_self_drafting", 1 + 0.8 + 0.6 + 0.45 + 0.3, 0.005,
                                 "Acceptance by position i is P(at least i drafts accepted), so their sum is the "
                                 "expected number accepted: 2.15; tau adds the target's own token: 3.15."),
        "MTP_TAU": Number("12_self_drafting", _mtp_tau(), 0.005,
                          "Conditional rates multiply: draft 1 survives with 0.88, draft 2 with 0.88 x 0.8 = 0.704, "
                          "draft 3 with 0.704 x 0.7 = 0.4928; tau = 1 + 0.88 + 0.704 + 0.4928 = 3.0768."),
        # -- notebook 13 --------------------------------------------------------------------------------------
        "PUBLISHED_BLOCKS": Number("13_production", 51 // 8, 0.0,
                                   "After the round 52 tokens are committed and the cache holds verified K and V "
                                   "for 51 of them (positions 0..50); 51 // 8 = 6 full blocks (positions 0..47). "
                                   "Block 6 holds 3 verified positions and 5 rejected drafts, block 7 one "
                                   "rejected draft: neither is published."),
        "PREFILL_TOKENS": Number("13_production", 230 - 16 * (199 // 16), 0.0,
                                 "Turn 1 ended with 200 tokens, K and V for 199 of them: 199 // 16 = 12 blocks "
                                 "published (192 tokens). Turn 2's 230 tokens hit those 12 blocks (at least the "
                                 "last token is left anyway), so the prefill computes 230 - 192 = 38 tokens."),
        "ALPHA_FROM_COUNTERS": Number("13_production", alpha_from_rate(3000 / 4800, 4), 0.005,
                                      "The draft acceptance rate is 3,000 / 4,800 = 0.625, so tau = 1 + 4 x 0.625 = "
                                      "3.5 = 1 + 3,000 / 1,200. Under the i.i.d. model E(alpha, 4) = (1 - "
                                      "alpha^5) / (1 - alpha) = 3.5 gives alpha = 0.8206."),
        "K_AT_BATCH": Number("13_production", k_schedule(PROFILE_ITL, PROFILE_RATES)[32], 0.0,
                             "tau(K) = 1 + rates[0] + ... + rates[K-1] (unconditional rates: add them), goodput = "
                             "tau / itl: K = 0: 1 / 20 = 0.050, K = 1: 1.8 / 23 = 0.078, K = 2: 2.45 / 26 = 0.094, "
                             "K = 3: 2.95 / 30 = 0.098, K = 4: 3.3 / 35 = 0.094 tokens per ms: K = 3."),
        "PADDED_TOKENS": Number("13_production", min(s for s in CAPTURE_SIZES if s >= tokens) - tokens, 0.0,
                                "Each request carries 1 + K = 4 tokens: 19 x 4 = 76; the next captured size is "
                                "96, so 96 - 76 = 20 padded tokens run through the graph for nothing."),
        "SUFFIX_DRAFTS": Number("13_production", _suffix_drafts(), 0.0,
                                "The cap is min(max_drafts, int(factor x match length)) = min(16, int(1.5 x 5)) = "
                                "7; the estimate after 7 steps is 0.52, still above min_prob = 0.1, so the cap "
                                "stops the walk at 7 drafts."),
        # -- notebook 14 --------------------------------------------------------------------------------------
        "EXPERTS_UNION": Number("14_frontier", expected_experts_touched(6, 8, 64), 0.005,
                                "gamma = 5 drafts plus the last committed token: 6 tokens route, each to 8 of 64. "
                                "An expert is missed by all 6 with probability (1 - 8/64)^6 = 0.449, so the union "
                                "is 64 x (1 - 0.449) = 35.27 experts per layer."),
        "VERIFY_GB": Number("14_frontier", (2.5e9 + 48 * expected_experts_touched(5, 8, 64) * 20e6) * 2 / 1e9, 0.005,
                            "5 tokens touch 64 x (1 - (7/8)^5) = 31.17 experts per layer; 48 x 31.17 x 20M = 29.9B "
                            "expert parameters plus 2.5B dense, 2 bytes each: 64.85 GB (a decode step reads 20.4)."),
        "KV_SHARE": Number("14_frontier", 16 * 32768 * 131072 / (16 * 32768 * 131072 + 8.03e9 * 2), 0.005,
                           "Each row reads its own cache: 16 x 32,768 x 131,072 bytes = 68.7 GB; the weights are read "
                           "once: 16.06 GB. The share is 68.7 / (68.7 + 16.06) = 0.811."),
        "TP_DRAFT_MS": Number("14_frontier", 0.3 / 8 + 24 * 2 * 0.020, 0.005,
                              "Compute splits 8 ways: 0.3 / 8 = 0.0375 ms; the all-reduces do not: 24 layers x 2 x "
                              "20 us = 0.96 ms. 0.9975 ms per token, three times the draft's time on one GPU."),
        "LAYERSKIP_SPEEDUP": Number("14_frontier", expected_tokens_per_round(0.6, 4) / (4 * 8 / 32 + 1), 0.005,
                                    "A round: 4 drafts at 8/32 of a step each = 1 step, then verification: 8 layers "
                                    "on one position and 24 on five, 32 layers read once = 1 step. E(0.6, 4) = (1 - "
                                    "0.6^5) / 0.4 = 2.306 tokens per 2 steps: 1.153x."),
        "BLOCK_ACCEPTED": Number("14_frontier", 7 / 8, 0.005,
                                 "E[accepted | block] = 2 h_2 + h_1 (1 - h_2), the blocks drawn from q: [0, 0] (9/16) "
                                 "has w = (1/3, 1/9), h = (0, 1/9), E = 2/9; [0, 1] (3/16) h = (0, 1), E = 2; [1, 0] "
                                 "(3/16) h = (1, 1/3), E = 4/3; [1, 1] (1/16) E = 2. In all 9/16 x 2/9 + 3/16 x 2 + "
                                 "3/16 x 4/3 + 1/16 x 2 = 7/8, against 3/4 token-wise."),
        # -- notebook 15 --------------------------------------------------------------------------------------
        "PARALLEL_GAMMA": Number("15_parallel_state_drift", _parallel_gamma(), 0.0,
                                 "Speedup(g) = E_g / (0.1 + 1 + 0.05 g) with E_g = 1 + 0.9 + 0.9 x 0.75 + ...: "
                                 "1.652, 2.146, 2.384, 2.433, 2.383, 2.306 for gamma 1..6. Gamma 4: the fifth draft "
                                 "adds 0.9 x 0.75 x 0.6 x 0.45 x 0.3 = 0.055 tokens but 0.05 steps of verification."),
        "STATE_GB": Number("15_parallel_state_drift", 64 * 36 * 4 * 32 * 128 * 128 * 2 / 1e9, 0.005,
                           "One state per fed position: gamma + 1 = 4 per row and layer, each 32 x 128 x 128 values "
                           "of 2 bytes (1.05 MB). 64 rows x 36 layers x 4 x 1.05 MB = 9.66 GB."),
        "TAU_AFTER_SHIFT": Number("15_parallel_state_drift", (1 - 0.6 ** 5) / 0.4, 0.005,
                                  "E(alpha, gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha) = (1 - 0.6^5) / 0.4 = "
                                  "2.306 tokens per round, down from 3.362 at alpha 0.8."),
        "COD_TOKENS": Number("15_parallel_state_drift", 512 + sum(int(512 * max(0.7 ** i, 0.2)) for i in range(1, 8)),
                             0.005, "512 real tokens plus 358 + 250 + 175 + 122 + 102 + 102 + 102 masks (the share "
                             "stops falling at 0.2) = 1,723 tokens, against 512 x 8 = 4,096 with every chain kept."),
    }


CHOICES: dict[str, Choice] = {
    "NO_KV": Choice("12_self_drafting", "c"),
    "TYPICAL": Choice("12_self_drafting", "d"),
    "EAGLE_SHIFT": Choice("12_self_drafting", "b"),
    "LOOKAHEAD_BLOCK": Choice("13_production", "a"),
    "TEMP0_TOKENS": Choice("13_production", "c"),
    "BATCH_128": Choice("13_production", "d"),
    "ROLLOUT_TAIL": Choice("14_frontier", "c"),
    "DISAGG_STATE": Choice("14_frontier", "b"),
    "RELAXED_QUALITY": Choice("14_frontier", "c"),
    "MASK_SEES": Choice("15_parallel_state_drift", "b"),
    "WHICH_STATE": Choice("15_parallel_state_drift", "b"),
    "STALE_DRAFTER": Choice("15_parallel_state_drift", "c"),
}


def numbers(notebook: str | None = None) -> dict[str, Number]:
    """The numeric drill questions (of one notebook, by slug, or of all)."""
    return {k: v for k, v in _numbers().items() if notebook in (None, v.notebook)}


def choices(notebook: str | None = None) -> dict[str, Choice]:
    """The multiple-choice drill questions (of one notebook, by slug, or of all)."""
    return {k: v for k, v in CHOICES.items() if notebook in (None, v.notebook)}


def _slip(name: str, got: object, rel: float) -> str:
    for wrong in for_question(name):
        if got == wrong.value or (isinstance(wrong.value, float | int) and close(got, wrong.value, max(rel, 1e-6))):
            return f" It looks like a known slip: {wrong.hint}."
    return ""


def check_number(answers: dict, name: str) -> None:
    """One numeric drill question: ``answers[name]`` within the question's tolerance of the exact answer."""
    if not isinstance(answers, dict):
        raise CheckFailure(f"ANSWERS must be a dict of answers, got {answers!r}")
    question = _numbers()[name]
    got = answers.get(name)
    if isinstance(got, bool) or not isinstance(got, int | float):
        raise CheckFailure(f"{name} must be a number, got {got!r}")
    if not close(got, question.answer, rel=question.rel, abs_tol=1e-12):
        tolerance = "the exact value is needed" if question.rel == 0 else f"answers within {question.rel:.1%} count"
        raise CheckFailure(f"{name} = {fmt(got)} is not it ({tolerance}).{_slip(name, got, question.rel)} "
                           f"{question.why}")


def check_choice(answers: dict, name: str) -> None:
    """One multiple-choice drill question: ``answers[name]`` is the right letter."""
    question = CHOICES[name]
    got = answers.get(name) if isinstance(answers, dict) else None
    if got not in ("a", "b", "c", "d"):
        raise CheckFailure(f"{name} must be 'a', 'b', 'c' or 'd', got {got!r}")
    if got != question.answer:
        hint = "".join(w.hint for w in for_question(name) if w.value == got) or "not the best answer"
        raise CheckFailure(f"{name} = {got!r} is not it: {hint}.")
