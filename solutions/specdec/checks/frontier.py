"""Checks for notebook 14 (the questions after EAGLE-3): expert unions against published MoE shapes and random
ones, measured routing with shared experts, roofline steps with and without a bounded cache, block verification
on random blocks, ties and extremes, its sampler by seeded Monte Carlo against the enumerated law."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from specdec.checks.core import (
    CheckFailure,
    call,
    compare_cases,
    describe_types,
    diagnose,
    expect_no_global_draws,
    expect_reproducible,
    expect_untouched,
    global_rng_state,
    is_int_list,
    snapshot_inputs,
    uniforms_at_zero,
)
from specdec.checks.seeds import salted
from specdec.checks.stats import compare_frequencies
from specdec.frontier import block, long_context, moe
from specdec.frontier.layerskip import layer_skip_generate, positions_per_layer
from specdec.mistakes import for_exercise

_SEED = 14
H100 = (3.35e12, 989e12)  # bytes/s, FLOP/s (data/gpus.json)

# (dense params, params of one routed expert in one layer, experts, top_k, layers): shapes in the style of
# published MoE models (8 experts and top 2 like Mixtral 8x7B, 64 and top 8, 256 and top 8), not their exact configs
MOE_SHAPES = {
    "Mixtral-8x7B-like": moe.MoEModel("Mixtral-8x7B-like", 1.6e9, 3 * 4096 * 14336, 8, 2, 32),
    "64-experts-top-8": moe.MoEModel("64-experts-top-8", 8e9, 3 * 3584 * 2560, 64, 8, 28),
    "256-experts-top-8": moe.MoEModel("256-experts-top-8", 17e9, 3 * 7168 * 2048, 256, 8, 58),
}


def _union_cases() -> list[tuple[str, tuple]]:
    cases = [("tokens=5, top_k=2, experts=8", (5, 2, 8)), ("tokens=1, top_k=2, experts=8", (1, 2, 8)),
             ("tokens=9, top_k=8, experts=64", (9, 8, 64)), ("tokens=0, top_k=2, experts=8", (0, 2, 8)),
             ("tokens=3, top_k=8, experts=8", (3, 8, 8)), ("tokens=0, top_k=8, experts=8", (0, 8, 8)),
             ("tokens=640, top_k=8, experts=256", (640, 8, 256)),
             ("tokens=2, top_k=2, experts=8 (two tokens already share experts)", (2, 2, 8)),
             ("tokens=3, top_k=3, experts=7", (3, 3, 7)), ("tokens=5, top_k=2, experts=60", (5, 2, 60)),
             ("tokens=8, top_k=2, experts=8", (8, 2, 8)), ("tokens=11, top_k=6, experts=100", (11, 6, 100))]
    rng = random.Random(salted(_SEED))
    for _ in range(30):
        experts = rng.choice([4, 8, 16, 60, 64, 128, 256])
        top_k, tokens = rng.randint(1, min(8, experts)), rng.randint(0, 2000)
        cases.append((f"tokens={tokens}, top_k={top_k}, experts={experts}", (tokens, top_k, experts)))
    return cases


def check_expected_experts_touched(fn: Callable) -> None:
    """Small and large token counts, top_k equal to the number of experts, no tokens, random MoE shapes."""
    compare_cases(fn, moe.expected_experts_touched, _union_cases(), rel=1e-9, plain=True)


def _routing(layers: int, tokens: int, top_k: int, experts: int, rng: random.Random, skew: float) -> torch.Tensor:
    """Each token's top_k distinct experts; with ``skew`` the first experts are preferred (routing is rarely even)."""
    weights = [1.0 / (1 + e) ** skew for e in range(experts)]
    rows = [[sorted(range(experts), key=lambda e: -weights[e] * rng.random())[:top_k] for _ in range(tokens)]
            for _ in range(layers)]
    return torch.tensor(rows, dtype=torch.int64)


def check_experts_touched(fn: Callable) -> None:
    """Routing of 1-4 layers whose counts differ, tokens that share experts, one token, and a layer in which every
    token picked the same experts."""
    name = "experts_touched"
    rng = random.Random(salted(_SEED))
    cases = [("two layers, tokens sharing experts", torch.tensor([[[0, 1], [1, 0], [2, 1]], [[3, 4], [5, 6], [7, 0]]])),
             ("one token", torch.tensor([[[5, 2]]])),
             ("every token on experts 0 and 1 in layer 1", torch.tensor([[[0, 3], [1, 2]], [[0, 1], [1, 0]]]))]
    for i in range(6):
        layers, tokens, experts = rng.randint(1, 4), rng.randint(1, 40), rng.choice([8, 16, 64])
        cases.append((f"random routing #{i}: {layers} layers, {tokens} tokens, top 2 of {experts}",
                      _routing(layers, tokens, 2, experts, rng, skew=rng.choice([0.0, 1.5]))))
    cases.append(("random routing #5 as int32 ids", cases[-1][1].to(torch.int32)))
    cases += [("one layer, one token routed to 4 experts (top 4)", torch.tensor([[[0, 1, 2, 3]]])),
              ("3 layers, 6 tokens, top 1", torch.tensor([[[0], [0], [1], [0], [2], [1]], [[3], [3], [3], [3], [3], [3]],
                                                          [[5], [4], [3], [2], [1], [0]]])),
              ("two layers, tokens sharing experts, as a tensor that is not contiguous (a transposed view)",
               cases[0][1].transpose(0, 1).contiguous().transpose(0, 1)),
              ("ids beyond 63 and 255 (a 512-expert layer)", torch.tensor([[[64, 3], [300, 64], [256, 0]],
                                                                           [[511, 255], [255, 511], [0, 1]]])),
              ("ids above 2^24 (they are ids, not floats)", torch.tensor([[[2**24, 2**24 + 1], [2**24 + 1, 7]]])),
              ("two layers and no tokens", torch.zeros(2, 0, 2, dtype=torch.int64)),
              ("no layers", torch.zeros(0, 5, 2, dtype=torch.int64)),
              ("no tokens, int32 ids", torch.zeros(3, 0, 2, dtype=torch.int32))]
    history: list = []
    for description, routing in cases:
        label = f"{name}({description})"
        expected = moe.experts_touched(routing)
        given = routing.clone()
        before = snapshot_inputs((given,))
        got = call(fn, label, given)
        history.append(((routing,), got))
        expect_untouched(label, (given,), before)
        if not (isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got.to(torch.int64), expected)):
            shown = got.tolist() if isinstance(got, torch.Tensor) else got
            raise CheckFailure(f"{label}: expected {expected.tolist()} (distinct experts per layer), got {shown}."
                               f"{diagnose(for_exercise(name), history)}")
        if got.dtype != torch.int64 and routing.numel() == 0:
            raise CheckFailure(f"{label}: returned dtype {got.dtype}; return counts as an int64 tensor, also when there "
                               "is nothing to count (torch.tensor([]) is float32: give it dtype=torch.int64)."
                               f"{diagnose(for_exercise(name), history)}")
        if got.dtype != torch.int64:
            raise CheckFailure(f"{label}: returned dtype {got.dtype} for routing of dtype {routing.dtype}; return counts "
                               "as an int64 tensor whatever the ids' dtype (.to(torch.int64), or dtype=torch.int64).")


def _measured_union(n: int) -> float:
    return 8 - 6 * 0.8 ** (n - 1)  # 2 experts for one token (its top 2), 5.54 for five (6.10 if independent)


def _spread_union(n: int) -> float:
    return float(min(8, 2 * n))  # every token on experts no other token took: 4 for two tokens (3.5 if independent)


def _moe_cases() -> list[tuple[str, tuple]]:
    bw, fl = H100
    cases = []
    for name, shape in MOE_SHAPES.items():
        for tokens in (1, 5, 64, 320, 4096):
            cases.append((f"{name}, tokens={tokens}, bf16, H100", (shape, tokens, 2, bw, fl)))
    for tokens in (1, 5, 64):  # a measured union that grows more slowly than independent routing's
        cases.append((f"Mixtral-8x7B-like, tokens={tokens}, measured union touched(n) = 8 - 6 x 0.8^(n - 1)",
                      (MOE_SHAPES["Mixtral-8x7B-like"], tokens, 2, bw, fl, _measured_union)))
    for tokens in (2, 3):  # anti-correlated routing: more experts than independent routing's formula gives
        cases.append((f"Mixtral-8x7B-like, tokens={tokens}, measured union touched(n) = min(8, 2n) (tokens that avoid "
                      "each other's experts)", (MOE_SHAPES["Mixtral-8x7B-like"], tokens, 2, bw, fl, _spread_union)))
    slow = 2e11  # FLOP/s: a device on which even one token's step is compute bound
    cases += [("64-experts-top-8, tokens=1, bf16, 3.35 TB/s and 0.2 TFLOP/s (compute bound at one token)",
               (MOE_SHAPES["64-experts-top-8"], 1, 2, bw, slow)),
              ("Mixtral-8x7B-like, tokens=4096, measured union 8 - 6 x 0.8^(n - 1), 0.2 TFLOP/s (compute bound)",
               (MOE_SHAPES["Mixtral-8x7B-like"], 4096, 2, bw, slow, _measured_union))]
    rng = random.Random(salted(_SEED))
    for i in range(10):
        experts = rng.choice([8, 32, 64, 128])
        shape = moe.MoEModel(f"random-{i}", rng.uniform(1e8, 2e10), rng.uniform(1e6, 2e8), experts,
                             rng.randint(1, 8), rng.randint(2, 60))
        tokens = rng.randint(1, 3000)
        cases.append((f"{shape}, tokens={tokens}", (shape, tokens, rng.choice([2, 1, 0.5]), *H100)))
    return cases


def check_moe_step_seconds(fn: Callable) -> None:
    """Three published MoE shapes at 1-4096 tokens (memory bound and compute bound), measured unions, random
    shapes."""
    compare_cases(fn, moe.moe_step_seconds, _moe_cases(), rel=1e-9)


LLAMA_8B = long_context.Decoder("Llama-3-8B-like", 8.03e9, 2 * 32 * 8 * 128 * 2, 4 * 32 * 32 * 128)
LLAMA_1B = long_context.Decoder("Llama-3.2-1B-like", 1.24e9, 2 * 16 * 8 * 64 * 2, 4 * 16 * 32 * 64)
#: A pair whose speedup at batch 1 and context 0 is exactly 1 in floating point: E(0.5, 1) = 1.5 and a draft step of
#: half a target step, so 1.5 T / (T / 2 + T) = 1 ("no longer pays" includes the tie).
TIE_TARGET = long_context.Decoder("8e9-parameter target", 8e9, 2 * 32 * 8 * 128 * 2, 4 * 32 * 32 * 128)
TIE_DRAFT = long_context.Decoder("4e9-parameter draft", 4e9, 2 * 16 * 8 * 128 * 2, 4 * 16 * 32 * 128)
LLAMA_1B_WINDOW = long_context.Decoder("Llama-3.2-1B-like, 4096-position window", 1.24e9, 2 * 16 * 8 * 64 * 2,
                                       4 * 16 * 32 * 64, window=4096)


def _kv_cases() -> list[tuple[str, tuple]]:
    bw, fl = H100
    cases = []
    for model in (LLAMA_8B, LLAMA_1B_WINDOW, LLAMA_1B):
        for rows, per_row, context in [(64, 5, 131072), (1, 1, 512), (256, 5, 512), (8, 3, 32768), (1, 9, 0),
                                       (512, 1, 8192)]:
            cases.append((f"{model.name}, rows={rows}, tokens_per_row={per_row}, context={context}, bf16, H100",
                          (model, rows, per_row, context, 2, bw, fl)))
    cases += [(f"{model.name}, rows=1, tokens_per_row=1, context=4096, bf16, 3.35 TB/s and 0.2 TFLOP/s (compute bound "
               "at one token)", (model, 1, 1, 4096, 2, bw, 2e11)) for model in (LLAMA_8B, LLAMA_1B_WINDOW)]
    cases += [(f"{LLAMA_8B.name}, rows=1, tokens_per_row=5, context=512, {name} ({bpp} bytes per parameter), H100 "
               "(memory bound: the weights' bytes are params x bytes_per_param)", (LLAMA_8B, 1, 5, 512, bpp, bw, fl))
              for name, bpp in (("fp8", 1), ("fp32", 4))]
    cases.append((f"{LLAMA_8B.name}, rows=4096, tokens_per_row=5, context=0, bf16, H100 (no cache, compute bound)",
                  (LLAMA_8B, 4096, 5, 0, 2, bw, fl)))
    cases += [(f"{LLAMA_8B.name}, rows=64, tokens_per_row=5, context=2048, {name} ({bpp} bytes per parameter), "
               "3.35 TB/s and 0.2 TFLOP/s (compute bound: the FLOPs do not depend on the bytes)",
               (LLAMA_8B, 64, 5, 2048, bpp, bw, 2e11)) for name, bpp in (("fp8", 1), ("fp32", 4))]
    rng = random.Random(salted(46))  # and inputs nobody can list in advance (a grading run salts the seed)
    for _ in range(6):
        model, rows, per_row, context = (rng.choice((LLAMA_8B, LLAMA_1B_WINDOW, LLAMA_1B)), rng.randint(1, 512),
                                         rng.randint(1, 9), rng.randint(0, 131072))
        cases.append((f"{model.name}, rows={rows}, tokens_per_row={per_row}, context={context}, bf16, H100",
                      (model, rows, per_row, context, 2, bw, fl)))
    return cases


def check_step_seconds(fn: Callable) -> None:
    """A full-cache target and drafts with and without a window, at contexts from 0 to 128k, decode and verify
    steps, memory and compute bound."""
    compare_cases(fn, long_context.step_seconds, _kv_cases(), rel=1e-9)


def check_crossover_batch(fn: Callable) -> None:
    """Contexts from 256 to 128k with a full-cache and a windowed draft, acceptances from 0.1 to 0.95 (at 0.1 it
    never pays, at 0.3 with a windowed draft at long context the speedup is not monotone in the batch), max_rows
    equal to the crossover and not a power of two."""
    bw, fl = H100
    cases = []
    for context in (256, 512, 2048, 8192, 131072):
        for draft in (LLAMA_1B, LLAMA_1B_WINDOW):
            for alpha, gamma in ((0.8, 4), (0.5, 2), (0.95, 6)):
                cases.append((f"alpha={alpha}, gamma={gamma}, context={context}, target {LLAMA_8B.name}, draft "
                              f"{draft.name}, H100", (alpha, gamma, context, LLAMA_8B, draft, 2, bw, fl)))
    cases += [(f"alpha=0.1, gamma=4, context=512, draft {LLAMA_1B.name} (never pays)",
               (0.1, 4, 512, LLAMA_8B, LLAMA_1B, 2, bw, fl)),
              (f"alpha=0.3, gamma=4, context=32768, draft {LLAMA_1B_WINDOW.name} (below 1 at batch 1, above it later)",
               (0.3, 4, 32768, LLAMA_8B, LLAMA_1B_WINDOW, 2, bw, fl)),
              (f"alpha=0.8, gamma=4, context=512, draft {LLAMA_1B.name}, max_rows=512",
               (0.8, 4, 512, LLAMA_8B, LLAMA_1B, 2, bw, fl, 512)),
              (f"alpha=0.8, gamma=4, context=512, draft {LLAMA_1B.name}, max_rows=400",
               (0.8, 4, 512, LLAMA_8B, LLAMA_1B, 2, bw, fl, 400)),
              ("alpha=0.5, gamma=1, context=0, a draft of half the target's weights: the speedup is exactly 1 at "
               "batch 1", (0.5, 1, 0, TIE_TARGET, TIE_DRAFT, 2, bw, fl)),
              (f"alpha=0.16, gamma=1, context=0, draft {LLAMA_1B.name} (a speedup of 1.005: it still pays, barely)",
               (0.16, 1, 0, LLAMA_8B, LLAMA_1B, 2, bw, fl)),
              (f"alpha=0.49, gamma=2, context=1024, draft {LLAMA_1B.name}, max_rows=65536 (beyond 4096)",
               (0.49, 2, 1024, LLAMA_8B, LLAMA_1B, 2, bw, fl, 65536)),
              (f"alpha=0.1, gamma=4, context=524288, draft {LLAMA_1B.name}, max_rows=0 (no batch fits: none is tried, "
               "though batch 1 would not pay)", (0.1, 4, 524288, LLAMA_8B, LLAMA_1B, 2, bw, fl, 0)),
              (f"alpha=0.8, gamma=4, context=512, draft {LLAMA_1B.name}, fp32 weights (4 bytes per parameter)",
               (0.8, 4, 512, LLAMA_8B, LLAMA_1B, 4, bw, fl)),
              (f"alpha=0.8, gamma=4, context=512, draft {LLAMA_1B.name}, an A100 (2.0 TB/s, 312 TFLOP/s)",
               (0.8, 4, 512, LLAMA_8B, LLAMA_1B, 2, 2.0e12, 312e12)),
              (f"alpha=0.8, gamma=4, context=2048, draft {LLAMA_1B.name}, 1 TB/s and H100 FLOP/s",
               (0.8, 4, 2048, LLAMA_8B, LLAMA_1B, 2, 1e12, fl)),
              (f"alpha=1, gamma=4, context=0, draft {LLAMA_1B.name} (every draft accepted, and still a compute-bound "
               "verify step stops paying)", (1.0, 4, 0, LLAMA_8B, LLAMA_1B, 2, bw, fl))]
    rng = random.Random(salted(47))  # and inputs nobody can list in advance (a grading run salts the seed)
    for _ in range(6):
        alpha, gamma, context = round(rng.uniform(0.2, 0.97), 6), rng.randint(1, 8), rng.randint(256, 131072)
        draft = rng.choice((LLAMA_1B, LLAMA_1B_WINDOW))
        cases.append((f"alpha={alpha}, gamma={gamma}, context={context}, target {LLAMA_8B.name}, draft {draft.name}, "
                      "H100", (alpha, gamma, context, LLAMA_8B, draft, 2, bw, fl)))
    history: list = []
    for description, args in cases:
        label = f"crossover_batch({description})"
        expected = long_context.crossover_batch(*args)
        got = call(fn, label, *args)
        history.append((args, got))
        if got is not None and (isinstance(got, bool) or not isinstance(got, int)):
            raise CheckFailure(f"{label}: return a batch size (an int) or None, got {got!r}.")
        if got != expected:
            raise CheckFailure(f"{label}: expected {expected}, got {got!r}.{diagnose(for_exercise('crossover_batch'), history)}")


#: A block whose every h is 0: the first draft halves the prefix's weight and p = q at the second position leaves no
#: excess (h_1 = 0), and the second draft has p = 0 (w_2 = h_2 = 0). Nothing may be kept: with every uniform at 0
#: (a draw U[0, 1) allows), u < h keeps nothing and u <= h keeps both drafts.
_NOTHING_KEPT = (torch.tensor([[1 / 3, 2 / 3, 0.0], [0.5, 0.0, 0.5], [0.2, 0.3, 0.5]], dtype=torch.float64),
                 torch.tensor([[2 / 3, 1 / 3, 0.0], [0.5, 0.25, 0.25]], dtype=torch.float64), torch.tensor([0, 1]))


#: gamma 3 over 4 tokens with h = (0.563, 0.562, 0.474): no output has probability above 0.3, and one uniform shared by
#: every position (instead of one per position) moves tau's law by a total variation of about 0.34.
_MIDDLING = (torch.tensor([[0.345, 0.292, 0.303, 0.06], [0.317, 0.05, 0.536, 0.096], [0.243, 0.077, 0.612, 0.068],
                           [0.213, 0.59, 0.051, 0.146]], dtype=torch.float64),
             torch.tensor([[0.11, 0.355, 0.378, 0.158], [0.034, 0.071, 0.785, 0.109], [0.371, 0.147, 0.091, 0.39]],
                          dtype=torch.float64), torch.tensor([1, 3, 0]))
_MIDDLING = (_MIDDLING[0] / _MIDDLING[0].sum(-1, keepdim=True), _MIDDLING[1] / _MIDDLING[1].sum(-1, keepdim=True),
             _MIDDLING[2])


#: One draft whose h is 0.625: the last token's draw must be a fresh one (reusing u_1 biases it when tau <= 1).
_ONE_DRAFT = (torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64), torch.tensor([[0.8, 0.2]], dtype=torch.float64),
              torch.tensor([0]))


def _random_block(rng: torch.Generator, gamma: int, vocab: int, sharp: float) -> tuple:
    p = torch.softmax(torch.randn(gamma + 1, vocab, generator=rng, dtype=torch.float64) * sharp, -1)
    q = torch.softmax(torch.randn(gamma, vocab, generator=rng, dtype=torch.float64) * sharp, -1)
    draft = torch.stack([torch.multinomial(q[i], 1, generator=rng)[0] for i in range(gamma)])
    return p, q, draft


def _block_cases() -> list[tuple[str, tuple]]:
    third = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    flip = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    same = torch.full((4, 3), 1 / 3, dtype=torch.float64)
    cases = [("the paper's example: p = (1/3, 2/3), q = (2/3, 1/3), draft [0, 0]",
              (third.repeat(3, 1), flip.repeat(2, 1), torch.tensor([0, 0]))),
             ("the paper's example, draft [0, 1]", (third.repeat(3, 1), flip.repeat(2, 1), torch.tensor([0, 1]))),
             ("p equal to q (every weight 1)", (same, same[:3], torch.tensor([2, 0, 1]))),
             ("one draft", (third.repeat(2, 1), flip.repeat(1, 1), torch.tensor([0])))]
    rng = torch.Generator().manual_seed(_SEED)  # a fixture: its power was measured
    for i in range(12):
        gamma, vocab, sharp = [(3, 4, 1.5), (5, 6, 2.5), (2, 3, 0.5), (4, 5, 3.0)][i % 4]
        cases.append((f"random block #{i}: gamma={gamma}, vocab={vocab}", _random_block(rng, gamma, vocab, sharp)))
    return cases


def check_block_weights(fn: Callable) -> None:
    """The paper's example, p = q, one draft, random blocks of 2-5 drafts, sharp and flat, one given in float32
    (the weights still come back in float64)."""
    name = "block_weights"
    history: list = []
    cases = _block_cases()
    p32, q32, d32 = cases[5][1]
    cases.append(("random block #1 given in float32", (p32.float(), q32.float(), d32)))
    cases.append(("a block with zeros in p and q, every h_i = 0", _NOTHING_KEPT))
    cases.append(("a first draft that keeps a weight of 0.999 (h is 1 only where w is exactly 1)",
                  (torch.tensor([[0.4995, 0.5005], [0.3, 0.7], [0.6, 0.4]], dtype=torch.float64),
                   torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64), torch.tensor([0, 1]))))
    rng = torch.Generator().manual_seed(salted(48))  # and blocks nobody can list in advance (a grading run salts it)
    cases += [(f"a drawn block: gamma={gamma}, vocab={vocab}", _random_block(rng, gamma, vocab, sharp))
              for gamma, vocab, sharp in ((3, 5, 1.5), (5, 4, 2.0), (4, 7, 0.8))]
    for description, (p, q, draft) in cases:
        label = f"{name}({description})"
        w, h = block.block_weights(p, q, draft)
        given = (p.clone(), q.clone(), draft.clone())
        before = snapshot_inputs(given)
        got = call(fn, label, *given)
        history.append(((p, q, draft), got))
        expect_untouched(label, given, before)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            raise CheckFailure(f"{label}: return a pair of tensors (w, h), each of shape ({draft.shape[0]},); got {got!r}.")
        for what, want, have in (("w", w, got[0]), ("h", h, got[1])):
            if have.dtype != torch.float64:
                raise CheckFailure(f"{label}: {what} came back in {have.dtype}; compute and return float64 (convert p "
                                   "and q first: float32 ratios lose the digits a long block multiplies).")
            loose = p.dtype == torch.float32  # inputs with 7 digits: sums of them agree to about 1e-7
            if have.shape != want.shape or not torch.allclose(have.to(torch.float64), want, rtol=1e-5 if loose else 1e-9,
                                                              atol=1e-7 if loose else 1e-12):
                if have.shape == want.shape and torch.allclose(have.to(torch.float64), want, rtol=1e-5, atol=1e-7):
                    worst = float(((have.to(torch.float64) - want).abs() / want.abs().clamp_min(1e-300)).max())
                    raise CheckFailure(f"{label}: {what} agrees with {[round(x, 6) for x in want.tolist()]} to 6 digits "
                                       f"but differs by up to {worst:.1e} relatively (1e-9 allowed): compute the "
                                       "ratios and sums in float64 from the start (p.double(), q.double()), not in "
                                       "float32 then converted.")
                raise CheckFailure(f"{label}: {what} should be {[round(x, 6) for x in want.tolist()]}, got "
                                   f"{[round(float(x), 6) for x in have.flatten().tolist()]}."
                                   f"{diagnose(for_exercise(name), history)}")


def _draws(fn: Callable, label: str, p, q, draft, runs: int, seed: int) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(salted(seed))
    state = global_rng_state((p,))
    out = []
    for _ in range(runs):
        given = (p.clone(), q.clone(), draft.clone())
        before = snapshot_inputs(given)
        got = call(fn, label, *given, generator)
        expect_untouched(label, given, before)
        _expect_tokens(label, got)
        out.append(tuple(got.tolist()))
    expect_no_global_draws(label, state)
    return out


def _expect_tokens(label: str, got) -> None:
    if not isinstance(got, torch.Tensor) or got.ndim != 1 or got.dtype != torch.long:
        raise CheckFailure(f"{label}: return the committed tokens as a 1-D long (int64) tensor, whatever the draft's "
                           f"dtype, got {got!r}.")


def _edge_cases(fn: Callable, name: str) -> None:
    """The answers only controlled randomness tells apart: h = 0 with a uniform of exactly 0, an int32 draft, and
    generator=None, which draws from torch's global generator (not a seed of the function's own)."""
    p, q, draft = _NOTHING_KEPT
    label = f"{name}(p, q, draft [0, 1] with every h_i = 0, every uniform exactly 0)"
    assert block.block_weights(p, q, draft)[1].tolist() == [0.0, 0.0]
    with uniforms_at_zero():
        got = call(fn, label, p.clone(), q.clone(), draft.clone(), torch.Generator().manual_seed(salted(5)))
    _expect_tokens(label, got)
    if got.shape[0] != 1:
        raise CheckFailure(f"{label}: kept {got.shape[0] - 1} drafts ({got.tolist()}); with h_i = 0 nothing may be "
                           "kept. Keep position i only when u_i < h_i (strictly): a uniform can be exactly 0.")
    _, (bp, bq, bd) = _block_cases()[5]
    label = f"{name}(random block #1 with an int32 draft)"
    _expect_tokens(label, call(fn, label, bp, bq, bd.to(torch.int32), torch.Generator().manual_seed(salted(6))))
    p, q, draft = _MIDDLING
    label = f"{name}(a block whose h are all near 1/2, generator=None)"
    state = torch.get_rng_state()
    try:
        runs = []
        for global_seed in range(20):
            pair = []
            for _ in range(2):  # the same global seed, then two calls in a row
                torch.manual_seed(salted(100 + global_seed))
                first = call(fn, label, p, q, draft, None)
                second = call(fn, label, p, q, draft, None)
                _expect_tokens(label, first)
                pair.append((tuple(first.tolist()), tuple(second.tolist())))
            if pair[0] != pair[1]:
                raise CheckFailure(f"{label}: with torch's global generator seeded the same, two calls in a row gave "
                                   f"{pair[0]} and then {pair[1]}. generator=None means: draw from the global generator "
                                   "(torch.rand(..., generator=None) does), so torch.manual_seed makes it reproducible.")
            runs.append(pair[0])
    finally:
        torch.set_rng_state(state)
    # no output of this block has probability above 0.3: a correct sampler repeats itself 20 times in a row, or
    # returns one output under 20 seeds, with probability below 1e-10
    if all(a == b for a, b in runs):
        raise CheckFailure(f"{label}: two calls in a row always returned the same tokens ({list(runs[0][0])}, ...): "
                           "each call must go on drawing from the global generator, not start again from a seed.")
    if len({a for a, _ in runs}) == 1:
        raise CheckFailure(f"{label}: returned {list(runs[0][0])} under 20 different global seeds. generator=None means:"
                           " draw from torch's global generator, not from a generator of your own with a fixed seed.")


def check_block_verify(fn: Callable) -> None:
    """Seeded Monte Carlo (2,000 rounds per block) against the enumerated law of block verification's output on the
    paper's example and two random blocks; the same generator seed gives the same output."""
    name = "block_verify"
    cases = _block_cases()
    picked = [cases[0], cases[4], cases[5], ("a block whose h are all near 1/2", _MIDDLING),
              ("one draft kept with probability 0.625, p = (1/2, 1/2) at both positions", _ONE_DRAFT)]
    for description, (p, q, draft) in picked:
        label = f"{name}({description})"
        exact = {tokens: mass for tokens, mass in block.block_outcomes(p, q, draft).items() if mass > 0}
        samples = _draws(fn, label, p, q, draft, 2000, seed=salted(len(label)))
        compare_frequencies(samples, exact, label,
                            hint="Keep the largest i with u_i < h_i (from block_weights), then draw the last token "
                                 "from p's bonus distribution if the whole block is kept, else from the residual "
                                 "max(w_tau p - q, 0).")
    p, q, draft = picked[1][1]
    expect_reproducible(fn, f"{name}(random block)", lambda seed: (p, q, draft, torch.Generator().manual_seed(salted(seed))))
    _edge_cases(fn, name)


def check_layer_skip_generate(fn: Callable) -> None:
    """The shipped target with its first 1, 2 and 3 layers as the draft, code and math prompts, gamma 1-5, a last
    round that must draft fewer: the tokens equal target-only greedy decoding, the rounds and counts equal the
    reference's, and every layer processes as many positions as the reference's (counted by hooks on the layers,
    so the early layers' reuse is measured, not reported)."""
    from specdec.models.checkpoints import load_pair
    from specdec.models.tokenizer import encode

    target, _ = load_pair()
    name = "layer_skip_generate"
    cases = [(2, "def parse(self, line):\n    ", 20, 4), (1, "Tom has 3 apples and buys 4 more. How many", 13, 3),
             (3, "    for key, value in items:\n", 11, 5), (2, "x", 6, 1),
             (3, "Tom has 3 apples and buys 4 more. How many", 24, 4)]  # exit 3: the final norm changes argmaxes
    history: list = []
    for exit_layer, text, max_new, gamma in cases:
        prompt = encode(text)
        label = f"{name}(target, exit_layer={exit_layer}, prompt={text!r}, max_new_tokens={max_new}, gamma={gamma})"
        with positions_per_layer(target) as want_counts:
            want = layer_skip_generate(target, exit_layer, prompt, max_new, gamma)
        with positions_per_layer(target) as got_counts:
            got = call(fn, label, target, exit_layer, list(prompt), max_new, gamma)
        history.append(((target, exit_layer, prompt, max_new, gamma), got))
        hint = diagnose(for_exercise(name), history)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailure(f"{label}: return (tokens, stats), got {got!r}.")
        tokens, stats = got
        if not is_int_list(tokens):
            raise CheckFailure(f"{label}: return the tokens as a list of Python ints, got {describe_types(tokens)} "
                               "(int(...) around each argmax).")
        if tokens != want[0]:
            raise CheckFailure(f"{label}: the tokens should be target-only greedy decoding's {want[0]}, got {tokens}."
                               f"{hint}")
        if stats != want[1]:
            raise CheckFailure(f"{label}: stats should be {want[1]}, got {stats}: the same drafts must be proposed "
                               f"and accepted.{hint}")
        if got_counts != want_counts:
            raise CheckFailure(f"{label}: the layers processed {got_counts} positions (layer 0 first); the reference "
                               f"{want_counts}. Every layer runs once per position: the prefill takes the prompt but "
                               "its last token (the first round's input); drafting runs the early layers on one new "
                               "token at a time over the cache, verification runs them on the last draft only and "
                               "the late layers on the round's gamma + 1 positions."
                               f"{hint if got_counts[exit_layer:] == want_counts[exit_layer:] else ''}")
