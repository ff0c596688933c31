"""Known-wrong kernels for notebook 08, each the reference kernel with one bug edited in.

A mistake is written as the edit that introduces it (old text -> new text in the reference
kernel's source), so the catalogue shows exactly what differs and cannot drift from the
reference: an edit whose old text no longer occurs exactly once fails at import.
"""

from __future__ import annotations

import inspect
import linecache

from specdec import kernels  # first: it picks Triton's interpreter when there is no GPU
from specdec.mistakes import Mistake

# isort: split
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def _edited(kernel, name: str, *edits: tuple[str, str]):
    """The reference kernel with each (old, new) edit applied, jitted under its own name."""
    source = inspect.getsource(kernel.fn)
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"mistake {name}: {old!r} occurs {source.count(old)} times in {kernel.fn.__name__}")
        source = source.replace(old, new)
    filename = f"<specdec.mistakes.kernels {kernel.fn.__name__} {name}>"  # unique: Triton reads it back
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"triton": triton, "tl": tl}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[kernel.fn.__name__]


def _mistake(kernel, name: str, hint: str, *edits: tuple[str, str]) -> Mistake:
    return Mistake(kernel.fn.__name__, name, _edited(kernel, name, *edits), hint)


_OFF_BY_ONE = ("the block bounds are off by one: columns run from 0 to V - 1, so the mask is cols < V; "
               "cols <= V reads one element past the row (the next row's first entry)")

MISTAKES = [
    # -- race_kernel
    _mistake(kernels.race_kernel, "off_by_one_mask", _OFF_BY_ONE, ("in_row = cols < V", "in_row = cols <= V")),
    _mistake(kernels.race_kernel, "skips_partial_last_block",
             "the loop skips the last, partial block: range(0, V, BLOCK_V) visits it, and the mask cols < V "
             "keeps its loads inside the row",
             ("range(0, V, BLOCK_V)", "range(0, V - BLOCK_V + 1, BLOCK_V)")),
    _mistake(kernels.race_kernel, "column_within_block",
             "tl.argmax gives the position within the block: add the block's start to get the column",
             ("tl.argmax(score, 0) + start", "tl.argmax(score, 0)")),
    _mistake(kernels.race_kernel, "later_block_wins_ties",
             "on equal scores keep the earlier block (compare with >, not >=): torch.argmax returns the lowest "
             "index, and greedy decoding must pick the same token as the target's argmax",
             ("block_best > best", "block_best >= best")),
    _mistake(kernels.race_kernel, "multiplies_by_noise",
             "the race divides by the noise: argmax of w / e samples w / sum(w), argmax of w * e does not",
             ("tl.where(in_row, w / e,", "tl.where(in_row, w * e,")),
    _mistake(kernels.race_kernel, "every_program_reads_row_0",
             "each program must offset its pointers to its own row: w_ptr + b * V + cols",
             ("w_ptr + b * V + cols", "w_ptr + cols"), ("e_ptr + b * V + cols", "e_ptr + cols")),
    # -- logsumexp_kernel
    _mistake(kernels.logsumexp_kernel, "padding_lanes_max_zero",
             "lanes past V must load -inf: loaded as 0 and left out of the sum, they still raise the running max to 0 "
             "when every real logit is negative, and exp(x - 0) underflows to 0 for logits far below it",
             ('mask=cols < V, other=-float("inf"))', "mask=cols < V, other=0.0)"),
             ("tl.sum(tl.exp(x - shift), 0)", "tl.sum(tl.where(cols < V, tl.exp(x - shift), 0.0), 0)")),
    _mistake(kernels.logsumexp_kernel, "running_max_from_zero",
             "start the running max at -inf, not 0: when every logit is far below 0, exp(x - 0) underflows to 0 and "
             "the log of the sum is -inf",
             ("m, s = -float(\"inf\"), 0.0", "m, s = 0.0, 0.0")),
    _mistake(kernels.logsumexp_kernel, "max_not_subtracted",
             "exp overflows float32 above about 88: subtract the running max inside exp and add it back at the end",
             ("s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), 0)", "s = s + tl.sum(tl.exp(x), 0)"),
             ("m + tl.log(s)", "tl.log(s)")),
    _mistake(kernels.logsumexp_kernel, "sum_not_rescaled",
             "normalising with the wrong sum: when a block raises the max, the sum so far is relative to the old "
             "max; multiply it by exp(m_old - m_new) before adding the block",
             ("s = s * tl.exp(m - shift) +", "s = s +")),
    _mistake(kernels.logsumexp_kernel, "padding_loads_zero",
             "lanes past V must load -inf (exp(-inf) = 0); loading 0 adds exp(0 - m) for every padding lane",
             ("mask=cols < V, other=-float(\"inf\"))", "mask=cols < V, other=0.0)")),
    _mistake(kernels.logsumexp_kernel, "off_by_one_mask", _OFF_BY_ONE, ("mask=cols < V", "mask=cols <= V")),
    _mistake(kernels.logsumexp_kernel, "inf_minus_inf",
             "a block of only -inf logits leaves the max at -inf, and exp(-inf - (-inf)) is NaN: shift by 0 while "
             "the max is still -inf",
             ("shift = tl.where(m_new == -float(\"inf\"), 0.0, m_new)", "shift = m_new")),
    # -- verify_chain_kernel
    _mistake(kernels.verify_chain_kernel, "bonus_after_rejection",
             "position gamma holds the bonus only when every draft was accepted; after a rejection it is padding (-1)",
             ("+ GAMMA, tl.where(k == GAMMA, extra, -1))", "+ GAMMA, extra)")),
    _mistake(kernels.verify_chain_kernel, "bonus_from_residual",
             "after a full acceptance the bonus is sampled from p[gamma] itself: there is no draft distribution at "
             "position gamma to subtract",
             ("residual = (k < GAMMA).to(tl.float32)", "residual = 1.0")),
    _mistake(kernels.verify_chain_kernel, "correction_from_p",
             "after a rejection the correction comes from the residual max(p - q, 0), not from p: sampling p again "
             "over-weights the tokens the draft already offered",
             ("mask=in_row, other=0.0) * residual", "mask=in_row, other=0.0) * 0.0")),
    _mistake(kernels.verify_chain_kernel, "accepts_on_equality",
             "accept when u * q < p, strictly: with <= a uniform of exactly 0 accepts a token the target gives "
             "probability 0",
             (") < tl.load(p_row + i * V + y)", ") <= tl.load(p_row + i * V + y)")),
    _mistake(kernels.verify_chain_kernel, "last_rejection",
             "k is the FIRST rejected position: once a draft is rejected, later positions must not move k",
             ("k = tl.where((k == GAMMA) & (ok == 0), i, k)", "k = tl.where(ok == 0, i, k)")),
    _mistake(kernels.verify_chain_kernel, "greedy_rows_sample",
             "greedy rows accept a draft only when it is the argmax of p at its position, not by the u * q < p test",
             ("if greedy:", "if False:")),
    _mistake(kernels.verify_chain_kernel, "count_without_extra",
             "counts[b] includes the extra token (correction or bonus): k + 1",
             ("tl.store(counts_ptr + b, k + 1)", "tl.store(counts_ptr + b, k)")),
    _mistake(kernels.verify_chain_kernel, "p_stride_gamma",
             "p has GAMMA + 1 rows per sequence (q has GAMMA): sequence b's p starts at b * (GAMMA + 1) * V",
             ("p_row = p_ptr + b * (GAMMA + 1) * V", "p_row = p_ptr + b * GAMMA * V")),
    _mistake(kernels.verify_chain_kernel, "greedy_later_tie",
             "on tied probabilities keep the earlier block (>, not >=): the target's argmax is the lowest index",
             ("best_col = tl.where(tl.max(probs, 0) > best", "best_col = tl.where(tl.max(probs, 0) >= best")),
    _mistake(kernels.verify_chain_kernel, "off_by_one_mask", _OFF_BY_ONE, ("in_row = cols < V", "in_row = cols <= V")),
    _mistake(kernels.verify_chain_kernel, "no_zero_residual_fallback",
             "after a rejection whose residual max(p - q, 0) is 0 everywhere (q >= p at every token, by rounding), "
             "the argmax of zeros is token 0 whatever p says: fall back to p (the argmax of p / e)",
             ("extra = tl.where(greedy | (best > 0), extra, extra_p)", "extra = tl.where(greedy, extra, extra)")),
    # -- tree_attention_kernel
    _mistake(kernels.tree_attention_kernel, "mask_after_softmax",
             "mask the scores (to -inf) before exp: zeroing the weights of hidden keys afterwards leaves them in the "
             "normaliser l",
             ("scores = tl.where(visible, tl.sum", "scores = tl.where(in_keys, tl.sum"),
             ("tl.sum(weights[:, None] * values", "tl.sum(tl.where(visible, weights, 0.0)[:, None] * values")),
    _mistake(kernels.tree_attention_kernel, "masked_after_the_max",
             "hide the keys by setting their scores to -inf before the max and exp: if hidden keys raise the running "
             "max, the visible weights exp(score - max) can underflow to 0 (and l to 0: NaN)",
             ("scores = tl.where(visible, tl.sum", "scores = tl.where(in_keys, tl.sum"),
             ("weights = tl.exp(scores - m_new)", "weights = tl.where(visible, tl.exp(scores - m_new), 0.0)")),
    _mistake(kernels.tree_attention_kernel, "running_max_from_zero",
             "start the running max at -inf, not 0: when every score is far below 0, exp(score - 0) underflows, l "
             "stays 0 and acc / l is NaN",
             ("m = -float(\"inf\")  # running max of the scores", "m = 0.0  # running max of the scores")),
    _mistake(kernels.tree_attention_kernel, "max_not_subtracted",
             "exp overflows float32 above about 88: subtract the running max before exp and rescale by exp(m_old - "
             "m_new)",
             ("alpha = tl.exp(m - m_new)", "alpha = 1.0"), ("weights = tl.exp(scores - m_new)", "weights = tl.exp(scores)")),
    _mistake(kernels.tree_attention_kernel, "sum_not_rescaled",
             "normalising with the wrong sum: l must be rescaled by alpha exactly like acc, or the early blocks count "
             "with the wrong weight",
             ("l = l * alpha + tl.sum(weights, 0)", "l = l + tl.sum(weights, 0)")),
    _mistake(kernels.tree_attention_kernel, "off_by_one_keys",
             "the block bounds are off by one: keys run from 0 to L + N - 1, so the mask is j < L + N",
             ("in_keys = j < L + N", "in_keys = j <= L + N")),
    _mistake(kernels.tree_attention_kernel, "mask_transposed",
             "row i of the mask says what node i sees: mask[i, t] is at mask_ptr + i * N + t (the transpose lets a "
             "node see its descendants instead of its ancestors)",
             ("mask_ptr + i * N + (j - L)", "mask_ptr + (j - L) * N + i")),
    _mistake(kernels.tree_attention_kernel, "prefix_hidden",
             "every node sees the whole prefix (keys j < L); the tree mask only covers the tree's own keys",
             ("visible = in_keys & ((j < L) | sees)", "visible = in_keys & sees")),
    _mistake(kernels.tree_attention_kernel, "padding_lanes_score_zero",
             "the lanes past the last key must score -inf, not 0: a 0 raises the running max above every real score "
             "when all of them are negative, and exp(score - max) underflows to 0 (then 0 / 0 = NaN)",
             ('axis=1) * scale, -float("inf"))', 'axis=1) * scale, tl.where(in_keys, -float("inf"), 0.0))'),
             ("weights = tl.exp(scores - m_new)", "weights = tl.where(in_keys, tl.exp(scores - m_new), 0.0)")),
    _mistake(kernels.tree_attention_kernel, "unscaled_scores",
             "scale the scores by 1 / sqrt(d) (the scale argument) before the softmax",
             ("axis=1) * scale, -float", "axis=1), -float")),
]
