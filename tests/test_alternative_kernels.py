"""Notebook 08: correct kernels written differently from the reference pass their checks
(in Triton's interpreter on CPU, and through the GPU compile check)."""

from __future__ import annotations

import pytest

from specdec import kernels  # noqa: F401  (first: it selects Triton's interpreter when there is no GPU)
from specdec.checks import kernels as kernel_checks

# isort: split
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def race_kernel(w_ptr, e_ptr, out_ptr, V, BLOCK_V: tl.constexpr):
    # The lowest column of each block's best score found with a min over matching columns, not tl.argmax.
    b = tl.program_id(0)
    best = -float("inf")
    best_col = V  # no column yet
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        inside = cols < V
        w = tl.load(w_ptr + b * V + cols, mask=inside, other=0.0)
        e = tl.load(e_ptr + b * V + cols, mask=inside, other=1.0)
        score = tl.where(inside, w / e, -float("inf"))
        top = tl.max(score, 0)
        first = tl.min(tl.where(inside & (score == top), cols, V), 0)
        take = top > best
        best_col = tl.where(take, first, best_col)
        best = tl.where(take, top, best)
    tl.store(out_ptr + b, tl.minimum(best_col, V - 1).to(tl.int64))


@triton.jit
def logsumexp_kernel(x_ptr, out_ptr, V, BLOCK_V: tl.constexpr):
    # Accumulates the log-sum-exp itself, merging each block's own logsumexp with a log-add-exp.
    b = tl.program_id(0)
    total = -float("inf")
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(x_ptr + b * V + cols, mask=cols < V, other=-float("inf"))
        block_max = tl.max(x, 0)
        safe = tl.where(block_max == -float("inf"), 0.0, block_max)
        block_lse = safe + tl.log(tl.sum(tl.exp(x - safe), 0))  # -inf for a block of -inf
        hi = tl.maximum(total, block_lse)
        lo = tl.minimum(total, block_lse)
        merged = hi + tl.log(1.0 + tl.exp(lo - hi))
        total = tl.where(hi == -float("inf"), -float("inf"), merged)
    tl.store(out_ptr + b, total)


@triton.jit
def tree_attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, N, L, D, scale,
                          BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    # Keeps the output normalised after every block (o, not an unnormalised accumulator).
    h, i = tl.program_id(0), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + (h * N + i) * D + d, mask=d < D, other=0.0) * scale
    m = -float("inf")
    denom = 0.0
    o = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, L + N, BLOCK_K):
        j = start + tl.arange(0, BLOCK_K)
        real = j < L + N
        in_tree = real & (j >= L)
        sees = tl.load(mask_ptr + i * N + (j - L), mask=in_tree, other=0)
        visible = real & ((j < L) | (sees != 0))
        offs = (h * (L + N) + j)[:, None] * D + d[None, :]
        both = real[:, None] & (d[None, :] < D)
        s = tl.sum(tl.load(k_ptr + offs, mask=both, other=0.0) * q[None, :], axis=1)
        s = tl.where(visible, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        w = tl.exp(s - m_new)
        kept = denom * tl.exp(m - m_new)
        denom_new = kept + tl.sum(w, 0)
        vals = tl.load(v_ptr + offs, mask=both, other=0.0)
        o = o * (kept / denom_new) + tl.sum(w[:, None] * vals, axis=0) / denom_new
        denom, m = denom_new, m_new
    tl.store(out_ptr + (h * N + i) * D + d, o, mask=d < D)


@triton.jit
def verify_chain_kernel(p_ptr, q_ptr, draft_ptr, u_ptr, e_ptr, greedy_ptr, tokens_ptr, counts_ptr, V,
                        GAMMA: tl.constexpr, BLOCK_V: tl.constexpr):
    # Greedy acceptance as "no column beats y" (a higher probability, or an equal one at a lower column), and the
    # extra token as the lowest column of the best score, found with a min over matching columns.
    b = tl.program_id(0)
    is_greedy = tl.load(greedy_ptr + b) != 0
    k = GAMMA
    for i in tl.static_range(GAMMA):
        y = tl.load(draft_ptr + b * GAMMA + i)
        p_y = tl.load(p_ptr + (b * (GAMMA + 1) + i) * V + y)
        accepted = tl.load(u_ptr + b * GAMMA + i) * tl.load(q_ptr + (b * GAMMA + i) * V + y) < p_y
        if is_greedy:
            beaten = 0
            for start in range(0, V, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                row = tl.load(p_ptr + (b * (GAMMA + 1) + i) * V + cols, mask=cols < V, other=-1.0)
                beaten += tl.sum(((row > p_y) | ((row == p_y) & (cols < y))).to(tl.int32), 0)
            accepted = beaten == 0
        if k == GAMMA:
            if accepted == 0:
                k = i
    after_rejection = k < GAMMA
    q_k = tl.where(after_rejection, k, 0)
    top, extra = -float("inf"), V
    top_p, extra_p = -float("inf"), V  # the race on p itself, for a residual that is 0 everywhere
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        inside = cols < V
        p_row = tl.load(p_ptr + (b * (GAMMA + 1) + k) * V + cols, mask=inside, other=0.0)
        q_row = tl.where(after_rejection, tl.load(q_ptr + (b * GAMMA + q_k) * V + cols, mask=inside, other=0.0), 0.0)
        noise = tl.load(e_ptr + b * V + cols, mask=inside, other=1.0)
        score = tl.where(is_greedy, p_row, tl.maximum(p_row - q_row, 0.0) / noise)
        score = tl.where(inside, score, -float("inf"))
        block_top = tl.max(score, 0)
        first = tl.min(tl.where(inside & (score == block_top), cols, V), 0)
        extra = tl.where(block_top > top, first, extra)
        top = tl.maximum(top, block_top)
        p_score = tl.where(inside, p_row / noise, -float("inf"))
        block_top_p = tl.max(p_score, 0)
        first_p = tl.min(tl.where(inside & (p_score == block_top_p), cols, V), 0)
        extra_p = tl.where(block_top_p > top_p, first_p, extra_p)
        top_p = tl.maximum(top_p, block_top_p)
    extra = tl.where(is_greedy | (top > 0), extra, extra_p)
    for i in tl.static_range(GAMMA + 1):
        if i < GAMMA:
            token = tl.load(draft_ptr + b * GAMMA + i)
        else:
            token = extra
        token = tl.where(i < k, token, tl.where(i == k, extra, -1))
        tl.store(tokens_ptr + b * (GAMMA + 1) + i, token.to(tl.int64))
    tl.store(counts_ptr + b, (k + 1).to(tl.int64))


ALTERNATIVES = [(race_kernel, kernel_checks.check_race_kernel),
                (logsumexp_kernel, kernel_checks.check_logsumexp_kernel),
                (verify_chain_kernel, kernel_checks.check_verify_chain_kernel),
                (tree_attention_kernel, kernel_checks.check_tree_attention_kernel)]


@pytest.mark.parametrize("kernel, check", ALTERNATIVES, ids=["race", "logsumexp", "verify_chain", "tree_attention"])
def test_an_alternative_kernel_passes(kernel, check):
    check(kernel)
