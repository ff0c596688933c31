"""Fused chain verification in Triton (notebook 08), runnable on any CPU.

Without a CUDA GPU, ``TRITON_INTERPRET=1`` is set before Triton is imported, so the
same ``@triton.jit`` kernels run in Triton's interpreter on CPU tensors (float32 only).

The verifier takes, for B sequences with gamma drafts each over a vocabulary of V:
p (B, gamma + 1, V) target probabilities, q (B, gamma, V) draft probabilities, the drafts
(B, gamma), and the randomness as inputs so results are reproducible: uniforms u
(B, gamma) for the accept tests and Exponential(1) noise e (B, V) for the one extra token
per row. That token is drawn without normalising anything: argmax_x w(x) / e(x) with
independent e(x) ~ Exponential(1) picks x with probability w(x) / sum(w) (the
"exponential race": e(x) / w(x) is Exponential with rate w(x), and the smallest of
independent exponentials is index x with probability rate_x / sum of rates). With
w = max(p - q, 0) that is the residual sample, with w = p[gamma] the bonus. Greedy rows
accept a draft when it is the argmax of p and take the argmax at the first mismatch.
Outputs: tokens (B, gamma + 1) padded with -1, and committed counts (B,).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # must happen before triton.jit decorates anything
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

PAD = -1


def device() -> torch.device:
    """Where the kernels run: the GPU when there is one, else the CPU (Triton's interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def verify_chain_reference(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u: torch.Tensor, e: torch.Tensor,
                           greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch specification of the fused kernel (same inputs, same outputs)."""
    B, gamma = draft.shape
    rows = torch.arange(B, device=p.device)
    p_draft = p[:, :gamma].gather(-1, draft[..., None])[..., 0]  # (B, gamma)
    q_draft = q.gather(-1, draft[..., None])[..., 0]
    accept = torch.where(greedy[:, None], draft == p[:, :gamma].argmax(-1), u * q_draft < p_draft)  # (B, gamma)
    k = accept.long().cumprod(-1).sum(-1)  # (B,): accepted drafts
    p_k = p[rows, k]  # (B, V): the target row where the extra token comes from
    q_k = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[rows, k]  # zero past the last draft: the bonus is p
    weights = (p_k - q_k).clamp_min(0) / e  # (B, V)
    extra = torch.where(greedy, p_k.argmax(-1), weights.argmax(-1))
    positions = torch.arange(gamma + 1, device=p.device)
    tokens = torch.where(positions < k[:, None], torch.cat([draft, draft[:, :1]], 1), PAD)
    tokens[rows, k] = extra
    return tokens, k + 1


@triton.jit
def _verify_chain_kernel(p_ptr, q_ptr, draft_ptr, u_ptr, e_ptr, greedy_ptr, tokens_ptr, counts_ptr, V,
                         GAMMA: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program per sequence: the accept tests left to right, then one blocked pass over V."""
    b = tl.program_id(0)
    greedy = tl.load(greedy_ptr + b) != 0
    p_row = p_ptr + b * (GAMMA + 1) * V
    q_row = q_ptr + b * GAMMA * V
    k = GAMMA  # the first rejected position; GAMMA when every draft is accepted
    for i in tl.static_range(GAMMA):
        y = tl.load(draft_ptr + b * GAMMA + i)
        p_y = tl.load(p_row + i * V + y)
        q_y = tl.load(q_row + i * V + y)
        u = tl.load(u_ptr + b * GAMMA + i)
        ok = u * q_y < p_y
        if greedy:  # accept when y is the argmax of p[i] (the lowest index on ties)
            best, best_idx = -float("inf"), 0
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                vals = tl.load(p_row + i * V + offs, mask=offs < V, other=-float("inf"))
                m = tl.max(vals, 0)
                idx = tl.argmax(vals, 0) + start
                best_idx = tl.where(m > best, idx, best_idx)
                best = tl.maximum(best, m)
            ok = best_idx == y
        k = tl.where((k == GAMMA) & (ok == 0), i, k)
    # the extra token: argmax over V of p (greedy), max(p - q, 0) / e (rejection) or p / e (bonus)
    not_bonus = (k < GAMMA).to(tl.float32)  # q is zero past the last draft: the bonus samples p itself
    k_q = tl.minimum(k, GAMMA - 1)
    best, best_idx = -float("inf"), 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        in_v = offs < V
        p_k = tl.load(p_row + k * V + offs, mask=in_v, other=0.0)
        q_k = tl.load(q_row + k_q * V + offs, mask=in_v, other=0.0) * not_bonus
        e = tl.load(e_ptr + b * V + offs, mask=in_v, other=1.0)
        score = tl.where(greedy, p_k, tl.maximum(p_k - q_k, 0.0) / e)
        score = tl.where(in_v, score, -float("inf"))
        m = tl.max(score, 0)
        idx = tl.argmax(score, 0) + start
        best_idx = tl.where(m > best, idx, best_idx)
        best = tl.maximum(best, m)
    for i in tl.static_range(GAMMA + 1):
        y = tl.load(draft_ptr + b * GAMMA + i, mask=i < GAMMA, other=0)
        out = tl.where(i < k, y, tl.where(i == k, best_idx, -1))
        tl.store(tokens_ptr + b * (GAMMA + 1) + i, out)
    tl.store(counts_ptr + b, k + 1)


def verify_chain_fused(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u: torch.Tensor, e: torch.Tensor,
                       greedy: torch.Tensor, block_v: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the fused verifier: (tokens (B, gamma + 1) padded with -1, counts (B,))."""
    B, gamma = draft.shape
    V = p.shape[-1]
    if p.shape != (B, gamma + 1, V) or q.shape != (B, gamma, V) or u.shape != (B, gamma) or e.shape != (B, V):
        raise ValueError(f"shapes: p {tuple(p.shape)}, q {tuple(q.shape)}, draft {tuple(draft.shape)}, u {tuple(u.shape)}, "
                         f"e {tuple(e.shape)}; expected p (B, gamma + 1, V), q (B, gamma, V), u (B, gamma), e (B, V)")
    if p.dtype != torch.float32 or q.dtype != torch.float32:
        raise ValueError("p and q must be float32 (the interpreter has no bf16; fp16 would lose small probabilities)")
    tokens = torch.empty(B, gamma + 1, dtype=torch.long, device=p.device)
    counts = torch.empty(B, dtype=torch.long, device=p.device)
    _verify_chain_kernel[(B,)](p.contiguous(), q.contiguous(), draft.contiguous(), u.contiguous(), e.contiguous(),
                               greedy.to(torch.int32).contiguous(), tokens, counts, V, GAMMA=gamma,
                               BLOCK_V=min(block_v, triton.next_power_of_2(V)))
    return tokens, counts


def tree_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
    """Attention of N tree nodes over L prefix keys and the N tree keys.

    q (H, N, d); k, v (H, L + N, d): the prefix's keys first, then the tree's; tree_mask
    (N, N) bool, True where node i may see node j. Every node sees the whole prefix.
    Returns (H, N, d).
    """
    N, L = q.shape[1], k.shape[1] - q.shape[1]
    visible = torch.cat([torch.ones(N, L, dtype=torch.bool, device=q.device), tree_mask], dim=1)  # (N, L + N)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5  # (H, N, L + N)
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v


@triton.jit
def _tree_attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, N, L, D, scale,
                           BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (head, node): an online softmax over blocks of keys."""
    h, i = tl.program_id(0), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + (h * N + i) * D + d, mask=d < D, other=0.0)  # (BLOCK_D,)
    m = -float("inf")  # running max of the scores
    l = 0.0  # running sum of exp(score - m)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)  # running sum of exp(score - m) * v
    for start in range(0, L + N, BLOCK_K):
        j = start + tl.arange(0, BLOCK_K)
        in_k = j < L + N
        tree_j = tl.maximum(j - L, 0)
        sees = tl.load(mask_ptr + i * N + tree_j, mask=in_k & (j >= L), other=0) != 0
        visible = in_k & ((j < L) | sees)
        kv_offs = (h * (L + N) + j)[:, None] * D + d[None, :]
        kv_mask = in_k[:, None] & (d[None, :] < D)
        keys = tl.load(k_ptr + kv_offs, mask=kv_mask, other=0.0)  # (BLOCK_K, BLOCK_D)
        scores = tl.sum(keys * q[None, :], axis=1) * scale
        scores = tl.where(visible, scores, -float("inf"))
        m_new = tl.maximum(m, tl.max(scores, 0))
        alpha = tl.exp(m - m_new)  # rescales what was summed under the old max
        weights = tl.exp(scores - m_new)
        values = tl.load(v_ptr + kv_offs, mask=kv_mask, other=0.0)
        l = l * alpha + tl.sum(weights, 0)
        acc = acc * alpha + tl.sum(weights[:, None] * values, axis=0)
        m = m_new
    tl.store(out_ptr + (h * N + i) * D + d, acc / l, mask=d < D)


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_mask: torch.Tensor,
                   block_k: int = 64) -> torch.Tensor:
    """Launch the tree-attention kernel; same contract as tree_attention_reference (float32)."""
    H, N, D = q.shape
    if k.shape != v.shape or k.shape[0] != H or k.shape[2] != D or k.shape[1] < N or tree_mask.shape != (N, N):
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, mask "
                         f"{tuple(tree_mask.shape)}; expected q (H, N, d), k and v (H, L + N, d), mask (N, N)")
    if not tree_mask.diagonal().all():
        raise ValueError("every node must see itself (tree_mask diagonal all True)")
    out = torch.empty_like(q)
    _tree_attention_kernel[(H, N)](q.contiguous(), k.contiguous(), v.contiguous(), tree_mask.to(torch.int8).contiguous(),
                                   out, N, k.shape[1] - N, D, D ** -0.5, BLOCK_K=block_k,
                                   BLOCK_D=triton.next_power_of_2(D))
    return out
