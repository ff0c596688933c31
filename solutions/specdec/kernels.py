"""Triton kernels of notebook 08, runnable on any CPU: the exponential race, an online
logsumexp, the fused chain verifier and tree attention.

Without a CUDA GPU, ``TRITON_INTERPRET=1`` is set before Triton is imported, so the same
``@triton.jit`` kernels run in Triton's interpreter on CPU tensors (float32 only: the
interpreter has no bf16). Each kernel has a PyTorch reference with the same contract and a
launcher that validates its inputs, allocates the outputs and picks the grid; a launcher
takes ``kernel=`` so a notebook can launch the learner's own kernel the same way.

Randomness is an input, so every result is reproducible: uniforms u for the accept tests
and Exponential(1) noise e for the one extra token per row. That token is drawn without
normalising anything: argmax_x w(x) / e(x) picks x with probability w(x) / sum(w) (the
exponential race: e(x) / w(x) is Exponential with rate w(x), and the first of independent
exponential clocks to ring is x with probability rate_x / sum of rates).
"""

from __future__ import annotations

import functools
import os
import sys

import torch

from specdec.models.devices import TRITON_NEEDED, triton_installed

if not triton_installed():
    raise ImportError(TRITON_NEEDED)
if not torch.cuda.is_available():  # must happen before Triton is imported
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise ImportError("Triton was imported before specdec.kernels on a machine without a GPU, so its interpreter "
                          "is off and no kernel can run. Restart the Python kernel and import specdec.kernels first "
                          "(or set TRITON_INTERPRET=1 before importing triton).")
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def _interpret_faster() -> bool:
    """Make Triton's CPU interpreter about twice as fast on these kernels; False (and nothing changed) when its
    internals are not as expected.

    The interpreter runs a kernel's grid one program at a time in Python. Every call of a device function inside
    it (``tl.max``, ``tl.argmax``, ``tl.sum`` are Triton functions of ``triton.language.standard``) first
    re-patches all of ``triton.language`` for interpretation, walking every member of its modules: about 4 ms a
    call, half of the time of a small kernel such as the race (Triton 3.9 on this course's CPU: 200 rows of the
    race in 3.5 s before, 0.9 s after). Within one launch that patching is the same every time (a device
    function's patches are never undone before the launch ends), so each module's is done once per launch.
    Kernels compute exactly what they computed before; only the repeated bookkeeping goes."""
    try:
        from triton.runtime import interpreter
        launch = interpreter.GridExecutor.__call__
        patch_lang = interpreter._patch_lang
        interpreter._LangPatchScope  # noqa: B018 (the scope type the launch restores)
    except (ImportError, AttributeError):
        return False
    if getattr(launch, "_specdec_once", False):
        return True
    patched: set[int] = set()  # the modules whose globals were patched in the running launch

    class _NothingToRestore:
        def restore(self) -> None:
            pass

    def patch_once(fn):
        key = id(fn.__globals__)
        if key in patched:
            return _NothingToRestore()
        patched.add(key)
        return patch_lang(fn)

    @functools.wraps(launch)
    def launch_with_one_patch_per_module(self, *args, **kwargs):
        patched.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.clear()

    launch_with_one_patch_per_module._specdec_once = True
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch_with_one_patch_per_module
    return True


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpret_faster()

PAD = -1  # token id written after a row's last committed token


def device() -> torch.device:
    """Where the kernels run: the GPU when there is one, else the CPU (Triton's interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def exponential_noise(*shape: int, generator: torch.Generator | None = None,
                      device: torch.device | str | None = None) -> torch.Tensor:
    """Exponential(1) noise, float32, never 0 and never infinite: -log(u) with u uniform on (0, 1).

    (-log(1 - u) is exactly 0 when u = 0, and w / 0 is infinite: that token would win whatever its
    weight. -log(u) alone is infinite at u = 0, and w / inf = 0 ties with the zero-weight tokens.
    A float32 uniform is exactly 0 about once in 2**24 draws: once per 128 rows of a 128k vocabulary.)"""
    # drawn where the generator lives (a CPU generator cannot fill a CUDA tensor), then moved
    u = torch.rand(*shape, generator=generator, device=generator.device if generator is not None else device)
    return -u.clamp_min(torch.finfo(u.dtype).tiny).log().to(device)


def _check_float32(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype} (the interpreter has no bf16; fp16 would lose "
                             f"small probabilities)")


def _check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all inputs must be on one device, got {devices}")


def _check_out(out: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {dtype} tensor of shape {shape} on {device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")


# -- 1. the exponential race: a blocked argmax over the vocabulary ------------------------------------------------


def race_reference(w: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """(B,) long: per row, the argmax over V of w / e (the lowest index on ties)."""
    return (w / e).argmax(-1)


@triton.jit
def race_kernel(w_ptr, e_ptr, out_ptr, V, BLOCK_V: tl.constexpr):
    """One program per row b: out[b] = argmax over x < V of w[b, x] / e[b, x].

    w and e are (B, V) contiguous float32; read them in blocks of BLOCK_V columns (V need not be
    a multiple of BLOCK_V), keep the best score and its column across blocks, and on ties keep
    the lowest column, as torch.argmax does. Store the column at out[b] (out is (B,) int64).
    """
    ### BEGIN SOLUTION
    b = tl.program_id(0)
    best, best_col = -float("inf"), 0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        in_row = cols < V
        w = tl.load(w_ptr + b * V + cols, mask=in_row, other=0.0)
        e = tl.load(e_ptr + b * V + cols, mask=in_row, other=1.0)
        score = tl.where(in_row, w / e, -float("inf"))
        block_best = tl.max(score, 0)
        block_col = tl.argmax(score, 0) + start  # the lowest column among equal scores
        best_col = tl.where(block_best > best, block_col, best_col)  # strict: an earlier block wins ties
        best = tl.maximum(best, block_best)
    tl.store(out_ptr + b, best_col)
    ### END SOLUTION


def race(w: torch.Tensor, e: torch.Tensor, block_v: int = 1024, kernel=race_kernel,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the race: (B,) long, the index sampled from w / w.sum(-1) per row (into ``out`` if given)."""
    if w.dim() != 2 or w.shape != e.shape or w.shape[1] < 1:
        raise ValueError(f"w and e must both be (B, V) with V >= 1, got w {tuple(w.shape)}, e {tuple(e.shape)}")
    _check_float32(w=w, e=e)
    _check_same_device(w=w, e=e)
    if not bool((e > 0).all()):
        raise ValueError("the noise e must be > 0 everywhere (e = 0 makes w / e infinite): use exponential_noise")
    if out is None:
        out = torch.full((w.shape[0],), -2, dtype=torch.long, device=w.device)  # -2: a row the kernel never wrote
    _check_out(out, (w.shape[0],), torch.long, w.device)
    kernel[(w.shape[0],)](w.contiguous(), e.contiguous(), out, w.shape[1],
                          BLOCK_V=min(block_v, triton.next_power_of_2(w.shape[1])))
    return out


# -- 2. logsumexp in one pass: the online softmax ----------------------------------------------------------------


@triton.jit
def logsumexp_kernel(x_ptr, out_ptr, V, BLOCK_V: tl.constexpr):
    """One program per row b: out[b] = log(sum over x < V of exp(x_ptr[b, x])), in ONE pass over V.

    x is (B, V) contiguous float32 logits, which may be large (exp overflows float32 above 88)
    and may be -inf (tokens removed by top-k or top-p, possibly a whole block of them; a row
    of only -inf gives -inf). Keep a running max m and a running sum s of exp(x - m); when a
    block raises the max, rescale s to the new max before adding the block.
    """
    ### BEGIN SOLUTION
    b = tl.program_id(0)
    m, s = -float("inf"), 0.0  # running max, running sum of exp(x - m)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(x_ptr + b * V + cols, mask=cols < V, other=-float("inf"))
        m_new = tl.maximum(m, tl.max(x, 0))
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)  # all -inf so far: nothing to rescale, avoid inf - inf
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), 0)
        m = m_new
    tl.store(out_ptr + b, m + tl.log(s))
    ### END SOLUTION


def logsumexp(x: torch.Tensor, block_v: int = 1024, kernel=logsumexp_kernel,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the online logsumexp: (B,) float32, torch.logsumexp(x, -1) (into ``out`` if given)."""
    if x.dim() != 2 or x.shape[1] < 1:
        raise ValueError(f"x must be (B, V) with V >= 1, got {tuple(x.shape)}")
    _check_float32(x=x)
    if out is None:
        out = torch.full((x.shape[0],), float("nan"), device=x.device)  # NaN: a row the kernel never wrote
    _check_out(out, (x.shape[0],), torch.float32, x.device)
    kernel[(x.shape[0],)](x.contiguous(), out, x.shape[1], BLOCK_V=min(block_v, triton.next_power_of_2(x.shape[1])))
    return out


# -- 3. fused chain verification ---------------------------------------------------------------------------------


def verify_chain_reference(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u: torch.Tensor, e: torch.Tensor,
                           greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch specification of the fused verifier: (tokens (B, gamma + 1) padded with -1, counts (B,)).

    p (B, gamma + 1, V) target probabilities, q (B, gamma, V) draft probabilities, draft
    (B, gamma), u (B, gamma) uniforms, e (B, V) Exponential(1) noise, greedy (B,) bool."""
    B, gamma = draft.shape
    rows = torch.arange(B, device=p.device)
    p_draft = p[:, :gamma].gather(-1, draft[..., None])[..., 0]  # (B, gamma)
    q_draft = q.gather(-1, draft[..., None])[..., 0]
    accept = torch.where(greedy[:, None], draft == p[:, :gamma].argmax(-1), u * q_draft < p_draft)  # (B, gamma)
    k = accept.long().cumprod(-1).sum(-1)  # (B,): accepted drafts
    p_k = p[rows, k]  # (B, V): the target row where the extra token comes from
    q_k = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[rows, k]  # zero past the last draft: the bonus is p
    excess = (p_k - q_k).clamp_min(0)  # (B, V)
    weights = torch.where(excess.amax(-1, keepdim=True) > 0, excess, p_k) / e  # a residual of zeros: p itself
    extra = torch.where(greedy, p_k.argmax(-1), weights.argmax(-1))
    positions = torch.arange(gamma + 1, device=p.device)
    tokens = torch.where(positions < k[:, None], torch.cat([draft, draft[:, :1]], 1), PAD)
    tokens[rows, k] = extra
    return tokens, k + 1


@triton.jit
def verify_chain_kernel(p_ptr, q_ptr, draft_ptr, u_ptr, e_ptr, greedy_ptr, tokens_ptr, counts_ptr, V,
                        GAMMA: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program per sequence b: verify its GAMMA drafts and write what it commits.

    Inputs (contiguous): p (B, GAMMA + 1, V) and q (B, GAMMA, V) float32; draft (B, GAMMA) int64;
    u (B, GAMMA) float32; e (B, V) float32 > 0; greedy (B,) int32 (1: a greedy row).
    1. k = the first rejected position (GAMMA when all are accepted). Draft y at position i is
       accepted when u[b, i] * q[b, i, y] < p[b, i, y] (sampling rows), or when y is the argmax
       of p[b, i] with the lowest index on ties (greedy rows).
    2. The extra token, one blocked pass over V: greedy rows take the argmax of p[b, k] (lowest index on ties);
       sampling rows the argmax of max(p[b, k] - q[b, k], 0) / e[b] after a rejection, and of
       p[b, GAMMA] / e[b] (the bonus) when all GAMMA were accepted. A residual that is 0 everywhere (q >= p at
       every token, as rounding can leave it) has nothing to sample: take the argmax of p[b, k] / e[b] instead.
    3. tokens[b] = the k accepted drafts, the extra token, then -1 up to GAMMA + 1 entries;
       counts[b] = k + 1. tokens (B, GAMMA + 1) and counts (B,) are int64.
    """
    ### BEGIN SOLUTION
    b = tl.program_id(0)
    greedy = tl.load(greedy_ptr + b) != 0
    p_row = p_ptr + b * (GAMMA + 1) * V  # p[b]: (GAMMA + 1, V)
    q_row = q_ptr + b * GAMMA * V  # q[b]: (GAMMA, V)
    k = GAMMA
    for i in tl.static_range(GAMMA):
        y = tl.load(draft_ptr + b * GAMMA + i)
        ok = tl.load(u_ptr + b * GAMMA + i) * tl.load(q_row + i * V + y) < tl.load(p_row + i * V + y)
        if greedy:  # y must be the argmax of p[b, i]
            best, best_col = -float("inf"), 0
            for start in range(0, V, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                probs = tl.load(p_row + i * V + cols, mask=cols < V, other=-float("inf"))
                best_col = tl.where(tl.max(probs, 0) > best, tl.argmax(probs, 0) + start, best_col)
                best = tl.maximum(best, tl.max(probs, 0))
            ok = best_col == y
        k = tl.where((k == GAMMA) & (ok == 0), i, k)  # only the first rejection counts
    residual = (k < GAMMA).to(tl.float32)  # 0 for the bonus: sample p[b, GAMMA] itself
    k_q = tl.minimum(k, GAMMA - 1)  # a valid row of q even when k == GAMMA
    best, extra = -float("inf"), 0
    best_p, extra_p = -float("inf"), 0  # the race over p[b, k] / e[b]: the fallback for a residual of zeros
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        in_row = cols < V
        p_k = tl.load(p_row + k * V + cols, mask=in_row, other=0.0)
        q_k = tl.load(q_row + k_q * V + cols, mask=in_row, other=0.0) * residual
        e = tl.load(e_ptr + b * V + cols, mask=in_row, other=1.0)
        score = tl.where(in_row, tl.where(greedy, p_k, tl.maximum(p_k - q_k, 0.0) / e), -float("inf"))
        extra = tl.where(tl.max(score, 0) > best, tl.argmax(score, 0) + start, extra)
        best = tl.maximum(best, tl.max(score, 0))
        score_p = tl.where(in_row, p_k / e, -float("inf"))
        extra_p = tl.where(tl.max(score_p, 0) > best_p, tl.argmax(score_p, 0) + start, extra_p)
        best_p = tl.maximum(best_p, tl.max(score_p, 0))
    extra = tl.where(greedy | (best > 0), extra, extra_p)
    for i in tl.static_range(GAMMA):
        y = tl.load(draft_ptr + b * GAMMA + i)
        tl.store(tokens_ptr + b * (GAMMA + 1) + i, tl.where(i < k, y, tl.where(i == k, extra, -1)))
    tl.store(tokens_ptr + b * (GAMMA + 1) + GAMMA, tl.where(k == GAMMA, extra, -1))
    tl.store(counts_ptr + b, k + 1)
    ### END SOLUTION


def verify_chain_fused(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u: torch.Tensor, e: torch.Tensor,
                       greedy: torch.Tensor, block_v: int = 1024, kernel=verify_chain_kernel,
                       validate: bool = True, out: tuple[torch.Tensor, torch.Tensor] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the fused verifier: (tokens (B, gamma + 1) int64 padded with -1, counts (B,) int64),
    written into ``out`` = (tokens, counts) if given.

    ``validate=False`` skips the checks that read the data (draft ids in range, e > 0), which
    synchronise a GPU; the benchmark uses it."""
    if draft.dim() != 2 or draft.shape[1] < 1:
        raise ValueError(f"draft must be (B, gamma) with gamma >= 1, got {tuple(draft.shape)}")
    B, gamma = draft.shape
    V = p.shape[-1]
    if p.shape != (B, gamma + 1, V) or q.shape != (B, gamma, V) or u.shape != (B, gamma) or e.shape != (B, V) \
            or greedy.shape != (B,):
        raise ValueError(f"shapes: p {tuple(p.shape)}, q {tuple(q.shape)}, draft {tuple(draft.shape)}, u {tuple(u.shape)}, "
                         f"e {tuple(e.shape)}, greedy {tuple(greedy.shape)}; expected p (B, gamma + 1, V), "
                         f"q (B, gamma, V), u (B, gamma), e (B, V), greedy (B,)")
    _check_float32(p=p, q=q, u=u, e=e)
    _check_same_device(p=p, q=q, draft=draft, u=u, e=e, greedy=greedy)
    if draft.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"draft must hold integer token ids, got {draft.dtype}")
    if validate and not bool(((draft >= 0) & (draft < V)).all()):
        raise ValueError(f"draft token ids must lie in [0, {V}), got {draft.min().item()}..{draft.max().item()}")
    if validate and not bool((e > 0).all()):
        raise ValueError("the noise e must be > 0 everywhere (e = 0 makes w / e infinite): use exponential_noise")
    if out is None:  # -2: an entry the kernel never wrote
        out = torch.full((B, gamma + 1), -2, dtype=torch.long, device=p.device), torch.full((B,), -2, device=p.device)
    tokens, counts = out
    _check_out(tokens, (B, gamma + 1), torch.long, p.device)
    _check_out(counts, (B,), torch.long, p.device)
    kernel[(B,)](p.contiguous(), q.contiguous(), draft.long().contiguous(), u.contiguous(), e.contiguous(),
                 greedy.to(torch.int32).contiguous(), tokens, counts, V, GAMMA=gamma,
                 BLOCK_V=min(block_v, triton.next_power_of_2(V)))
    return tokens, counts


# -- 4. tree attention -------------------------------------------------------------------------------------------


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
def tree_attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, N, L, D, scale,
                          BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (head h, node i): out[h, i] = softmax(scale * q[h, i] . k[h, j]) @ v[h, j]
    over the keys j that node i may see, with an online softmax over blocks of BLOCK_K keys.

    q, out (H, N, D); k, v (H, L + N, D): L prefix keys, then the N tree keys; all float32,
    contiguous. mask (N, N) int8: mask[i, t] = 1 when node i sees tree node t. Key j is
    visible when j < L (the prefix) or mask[i, j - L] = 1; every node sees the root (node 0), so
    the first block always holds a visible key. scale = 1 / sqrt(D); BLOCK_D >= D is a power of two.
    """
    ### BEGIN SOLUTION
    h, i = tl.program_id(0), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + (h * N + i) * D + d, mask=d < D, other=0.0)  # (BLOCK_D,)
    m = -float("inf")  # running max of the scores
    l = 0.0  # running sum of exp(score - m)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)  # running sum of exp(score - m) * v
    for start in range(0, L + N, BLOCK_K):
        j = start + tl.arange(0, BLOCK_K)
        in_keys = j < L + N
        sees = tl.load(mask_ptr + i * N + (j - L), mask=in_keys & (j >= L), other=0) != 0
        visible = in_keys & ((j < L) | sees)
        kv_offs = (h * (L + N) + j)[:, None] * D + d[None, :]  # (BLOCK_K, BLOCK_D)
        kv_mask = in_keys[:, None] & (d[None, :] < D)
        keys = tl.load(k_ptr + kv_offs, mask=kv_mask, other=0.0)
        scores = tl.where(visible, tl.sum(keys * q[None, :], axis=1) * scale, -float("inf"))  # mask BEFORE exp
        m_new = tl.maximum(m, tl.max(scores, 0))
        alpha = tl.exp(m - m_new)  # rescales what was summed under the old max
        weights = tl.exp(scores - m_new)
        values = tl.load(v_ptr + kv_offs, mask=kv_mask, other=0.0)
        l = l * alpha + tl.sum(weights, 0)
        acc = acc * alpha + tl.sum(weights[:, None] * values, axis=0)
        m = m_new
    tl.store(out_ptr + (h * N + i) * D + d, acc / l, mask=d < D)
    ### END SOLUTION


#: Warps per tree-attention program on a GPU: a 64 x 128 float32 tile of keys and one of values over 4 warps (128
#: threads) needs more than the 255 registers a thread may have, and spills (Triton 3.7.1: 40 bytes per thread on
#: sm_80); over 8 warps it fits (216 registers on sm_80, 230 on sm_90, no spill). The interpreter ignores it.
TREE_ATTENTION_NUM_WARPS = 8


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_mask: torch.Tensor,
                   block_k: int = 64, kernel=tree_attention_kernel, out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the tree-attention kernel; same contract as tree_attention_reference (float32;
    tree_mask bool or int8 0/1, every node seeing itself and the root). Into ``out`` if given."""
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q must be (H, N, d) and k, v (H, L + N, d), got q {tuple(q.shape)}, k {tuple(k.shape)}")
    H, N, D = q.shape
    if k.shape != v.shape or k.shape[0] != H or k.shape[2] != D or k.shape[1] < N or tree_mask.shape != (N, N):
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, mask "
                         f"{tuple(tree_mask.shape)}; expected q (H, N, d), k and v (H, L + N, d), mask (N, N)")
    _check_float32(q=q, k=k, v=v)
    _check_same_device(q=q, k=k, v=v, tree_mask=tree_mask)
    if tree_mask.dtype not in (torch.bool, torch.int8):
        raise ValueError(f"tree_mask must be bool (or int8 0/1), got {tree_mask.dtype}")
    if not bool(tree_mask.diagonal().all()) or not bool(tree_mask[:, 0].all()):
        raise ValueError("every node must see itself and the root (tree_mask's diagonal and first column all True)")
    if out is None:
        out = torch.full_like(q, float("nan"))  # NaN: an entry the kernel never wrote
    _check_out(out, tuple(q.shape), torch.float32, q.device)
    kernel[(H, N)](q.contiguous(), k.contiguous(), v.contiguous(), tree_mask.to(torch.int8).contiguous(), out,
                   N, k.shape[1] - N, D, D ** -0.5, BLOCK_K=block_k, BLOCK_D=triton.next_power_of_2(D),
                   num_warps=TREE_ATTENTION_NUM_WARPS)
    return out
