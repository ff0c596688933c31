"""Known-wrong answers to the exercises of notebook 14 (the questions after EAGLE-3)."""

from __future__ import annotations

import torch

from specdec.chain import verify_chain
from specdec.frontier import block, long_context, moe
from specdec.frontier.layerskip import embed, exit_logits, run_layers
from specdec.mistakes import Mistake
from specdec.models.model import KVCache


def _union_with_replacement(tokens: int, top_k: int, experts: int) -> float:
    return experts * (1.0 - (1.0 - 1.0 / experts) ** (tokens * top_k))


def _step_reads(model, tokens, bytes_per_param, bandwidth, flops, touched=None, *, union=None, total=False,
                add=False):
    count = union(model, tokens) if union else (
        touched(tokens) if touched else moe.expected_experts_touched(tokens, model.top_k, model.experts))
    read = (model.dense_params + model.layers * count * model.expert_params) * bytes_per_param / bandwidth
    compute = 2 * (model.total_params if total else model.active_params) * tokens / flops
    return read + compute if add else max(read, compute)


def _kv_step(model, rows, tokens_per_row, context, bytes_per_param, bandwidth, flops, *, kv=True, per_token=False,
             window=True, attention=True, per_row=False):
    cached = context if model.window is None or not window else min(context, model.window)
    kv_read = rows * cached * model.kv_bytes * (tokens_per_row if per_token else 1) if kv else 0.0
    read = model.params * bytes_per_param + kv_read
    compute = rows * (1 if per_row else tokens_per_row) * (2 * model.params + model.attention_flops * cached * attention)
    return max(read / bandwidth, compute / flops)


def _last_paying(alpha, gamma, context, target, draft, bytes_per_param, bandwidth, flops, max_rows=4096):
    first = long_context.crossover_batch(alpha, gamma, context, target, draft, bytes_per_param, bandwidth, flops,
                                         max_rows)
    return None if first is None else (first // 2 or None)


def _linear_scan(alpha, gamma, context, target, draft, bytes_per_param, bandwidth, flops, max_rows=4096):
    for rows in range(1, max_rows + 1):
        if long_context.speedup_at(alpha, gamma, rows, context, target, draft, bytes_per_param, bandwidth, flops) <= 1:
            return rows
    return None


def _max_rows_if_never(alpha, gamma, context, target, draft, bytes_per_param, bandwidth, flops, max_rows=4096):
    first = long_context.crossover_batch(alpha, gamma, context, target, draft, bytes_per_param, bandwidth, flops,
                                         max_rows)
    return max_rows if first is None else first


def _weights(p, q, draft, *, h_is_w=False, last_keeps=False, uncapped=False, excess_of_p=False):
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma, w, h, weight = draft.shape[0], [], [], 1.0
    for i in range(gamma):
        x = int(draft[i])
        weight = weight * float(p[i, x]) / float(q[i, x])
        weight = weight if uncapped else min(weight, 1.0)
        w.append(weight)
        if i == gamma - 1:
            h.append(1.0 if last_keeps else weight)
        elif h_is_w:
            h.append(weight)
        else:
            mass = (p[i + 1] if excess_of_p else weight * p[i + 1]) - q[i + 1]
            excess = float(mass.clamp_min(0).sum())
            h.append(1.0 if weight >= 1.0 else min(excess / (excess + max(1.0 - weight, 0.0)), 1.0))
    return torch.tensor(w, dtype=torch.float64), torch.tensor(h, dtype=torch.float64)


def _block_sampler(p, q, draft, generator=None, *, first_failure=False, last="residual", at_equal=False):
    """Block verification with one thing changed: stop at the first failed coin, draw the last token from p
    ("p") or from the residual without the prefix's weight ("unweighted"), or keep a position at u_i = h_i."""
    w, h = block.block_weights(p, q, draft)
    gamma = draft.shape[0]
    u = torch.rand(gamma, generator=generator, dtype=torch.float64)
    kept = [i + 1 for i in range(gamma) if (u[i] <= h[i] if at_equal else u[i] < h[i])]
    tau = kept[-1] if kept else 0
    if first_failure:  # token-wise order with block weights
        tau = 0
        while tau < gamma and u[tau] < h[tau]:
            tau += 1
    if last == "p":
        law = p[tau].to(torch.float64)
    elif tau == gamma:
        law = p[gamma].to(torch.float64)
    else:
        law = block.block_residual(p[tau], q[tau], 1.0 if last == "unweighted" or not tau else float(w[tau - 1]))
    return torch.cat([draft[:tau].to(torch.long), torch.multinomial(law, 1, generator=generator)])


@torch.no_grad()
def _layer_skip(model, exit_layer, prompt, max_new_tokens, gamma, *, recompute=False, no_bonus=False,
                past_end=False, no_cut=False):
    n = model.config.n_layers
    cache = KVCache(model.config, max_len=len(prompt) + max_new_tokens + 2 * gamma + 2)
    if len(prompt) > 1:
        run_layers(model, embed(model, prompt[:-1]), range(n), cache, 0)
    length, pending, out = len(prompt) - 1, prompt[-1], []
    stats = {"rounds": 0, "proposed": 0, "accepted": 0}
    while len(out) < max_new_tokens:
        g = gamma if past_end else min(gamma, max_new_tokens - len(out) - 1)
        drafts, early, token = [], [], pending
        for j in range(g):
            hidden = run_layers(model, embed(model, [token]), range(exit_layer), cache, length + j)
            early.append(hidden)
            token = int(exit_logits(model, hidden)[0, -1].argmax())
            drafts.append(token)
        if no_bonus and g:  # the late layers over the drafted positions only: no token of the target's after them
            choice = exit_logits(model, run_layers(model, torch.cat(early, dim=1), range(exit_layer, n), cache,
                                                   length))[0].argmax(-1).tolist()
            k = 0
            while k < g and drafts[k] == choice[k]:
                k += 1
            committed = drafts if k == g else drafts[:k] + [choice[k]]
            out += committed
            length, pending = length + len(committed), committed[-1]  # all accepted: the last draft is pending
            stats["rounds"] += 1
            stats["proposed"] += g
            stats["accepted"] += k
            continue
        if recompute:  # verification from the embeddings: the early layers run again on every position
            hidden = run_layers(model, embed(model, [pending] + drafts), range(n), cache, length)
        else:
            early.append(run_layers(model, embed(model, [token]), range(exit_layer), cache, length + g))
            hidden = run_layers(model, torch.cat(early, dim=1), range(exit_layer, n), cache, length)
        choice = exit_logits(model, hidden)[0].argmax(-1).tolist()
        k = 0
        while k < g and drafts[k] == choice[k]:
            k += 1
        out += drafts[:k] + [choice[k]]
        length = length + (g if no_cut else k) + 1
        pending = choice[k]
        stats["rounds"] += 1
        stats["proposed"] += g
        stats["accepted"] += k
    return out[:max_new_tokens], stats


def _counts_untyped(routing):
    return torch.tensor([len(torch.unique(layer)) for layer in routing])  # float32 when there is no layer


def _union_capped_by_formula(model, tokens, bpp, bw, fl, touched=None):
    independent = moe.expected_experts_touched(tokens, model.top_k, model.experts)
    return _step_reads(model, tokens, bpp, bw, fl, (lambda n: min(touched(n), independent)) if touched else None)


def _no_compute_for_one_token(model, tokens, bpp, bw, fl, touched=None):
    if tokens == 1:
        return _step_reads(model, tokens, bpp, bw, float("inf"), touched)  # the bytes alone
    return moe.moe_step_seconds(model, tokens, bpp, bw, fl, touched)


def _kv_no_compute_for_one_token(model, rows, tokens_per_row, context, bpp, bw, fl):
    if rows * tokens_per_row == 1:
        cached = context if model.window is None else min(context, model.window)
        return (model.params * bpp + cached * model.kv_bytes) / bw
    return long_context.step_seconds(model, rows, tokens_per_row, context, bpp, bw, fl)


def _first_power_of_two(stops, alpha, gamma, context, target, draft, bytes_per_param, bandwidth, flops,
                        max_rows=4096):
    """crossover_batch's search with a stopping rule of the learner's own: ``stops(speedup)``."""
    rows = 1
    while rows <= max_rows:
        if stops(long_context.speedup_at(alpha, gamma, rows, context, target, draft, bytes_per_param, bandwidth, flops)):
            return rows
        rows *= 2
    return None


def _draft_dtype(p, q, draft, generator=None):
    return block.block_verify(p, q, draft, generator).to(draft.dtype)


def _own_seed_without_generator(p, q, draft, generator=None):
    return block.block_verify(p, q, draft, generator if generator is not None else torch.Generator().manual_seed(0))


def _clamps_q_in_place(p, q, draft, generator=None):
    q.clamp_(min=1e-12)  # "avoid dividing by zero", on the caller's tensor
    return block.block_verify(p, q, draft, generator)


def _flops_from_bytes(model, rows, tokens_per_row, context, bpp, bw, fl):
    cached = context if model.window is None else min(context, model.window)
    read = model.params * bpp + rows * cached * model.kv_bytes
    compute = rows * tokens_per_row * (model.params * bpp + model.attention_flops * cached)  # bytes, not 2 FLOPs
    return max(read / bw, compute / fl)


def _capped_at_4096(alpha, gamma, context, target, draft, bytes_per_param, bandwidth, flops, max_rows=4096):
    return long_context.crossover_batch(alpha, gamma, context, target, draft, bytes_per_param, bandwidth, flops,
                                        min(max_rows, 4096))


def _one_shared_uniform(p, q, draft, generator=None):
    w, h = block.block_weights(p, q, draft)
    gamma = draft.shape[0]
    u = torch.rand(1, generator=generator, dtype=torch.float64).expand(gamma)  # one coin for every position
    kept = [i + 1 for i in range(gamma) if u[i] < h[i]]
    tau = kept[-1] if kept else 0
    last = p[gamma].to(torch.float64) if tau == gamma else block.block_residual(p[tau], q[tau],
                                                                                float(w[tau - 1]) if tau else 1.0)
    return torch.cat([draft[:tau].to(torch.long), torch.multinomial(last, 1, generator=generator)])


def _reseeds_without_generator(p, q, draft, generator=None):
    if generator is None:
        generator = torch.Generator().manual_seed(torch.initial_seed())  # the same draws on every call
    return block.block_verify(p, q, draft, generator)


MISTAKES: list[Mistake] = [
    # expected_experts_touched
    Mistake("expected_experts_touched", "per_token_sum", lambda tokens, top_k, experts: float(tokens * top_k),
            "Counts top_k experts for every token: tokens that share an expert read it once. Count the experts that "
            "at least one token routes to: each is missed by all n tokens with probability (1 - k/E)^n."),
    Mistake("expected_experts_touched", "capped_sum", lambda tokens, top_k, experts: float(min(tokens * top_k, experts)),
            "min(n k, E) assumes no two tokens share an expert until every expert is used; under random routing "
            "they share long before that. Use the probability that an expert is missed by every token."),
    Mistake("expected_experts_touched", "with_replacement", _union_with_replacement,
            "Treats the n k picks as independent draws with replacement ((1 - 1/E)^(n k)); a token's top_k experts "
            "are distinct, so one token misses an expert with probability 1 - k/E."),
    Mistake("expected_experts_touched", "top_k_not_experts",
            lambda tokens, top_k, experts: top_k * (1.0 - (1.0 - top_k / experts) ** tokens),
            "Multiplies by top_k: the expectation is over all E experts, each touched with probability "
            "1 - (1 - k/E)^n."),
    # experts_touched
    Mistake("experts_touched", "all_layers_together",
            lambda routing: torch.full((routing.shape[0],), len(torch.unique(routing)), dtype=torch.int64),
            "Counts the distinct ids over all layers at once: expert 3 of layer 0 and expert 3 of layer 1 are "
            "different weights. Count each layer on its own."),
    Mistake("experts_touched", "tokens_times_k",
            lambda routing: torch.full((routing.shape[0],), routing.shape[1] * routing.shape[2], dtype=torch.int64),
            "Counts every (token, expert) pair: an expert two tokens share is read once. Count distinct ids."),
    Mistake("experts_touched", "highest_id_plus_one",
            lambda routing: routing.flatten(1).amax(dim=1).to(torch.int64) + 1,
            "Takes the highest expert id + 1 as the count: that assumes the experts touched are 0..max. Count the "
            "distinct ids."),
    # moe_step_seconds
    Mistake("moe_step_seconds", "reads_every_expert",
            lambda model, tokens, bpp, bw, fl, touched=None: _step_reads(
                model, tokens, bpp, bw, fl, union=lambda m, n: m.experts),
            "Reads all experts whatever the tokens: one token reads only its top_k per layer, which is why a "
            "verify step of several tokens costs more than a decode step on an MoE."),
    Mistake("moe_step_seconds", "experts_per_token",
            lambda model, tokens, bpp, bw, fl, touched=None: _step_reads(
                model, tokens, bpp, bw, fl, union=lambda m, n: min(n * m.top_k, m.experts)),
            "Reads top_k experts per token: tokens that share an expert read it once (use the expected union, or "
            "the measured one when touched is given)."),
    Mistake("moe_step_seconds", "every_expert_once_tokens_reach_experts",
            lambda model, tokens, bpp, bw, fl, touched=None: _step_reads(
                model, tokens, bpp, bw, fl, touched,
                union=None if tokens < model.experts else (lambda m, n: m.experts)),
            "Reads every expert once the step has as many tokens as experts: E (1 - (1 - k/E)^n) comes close to E "
            "but stays below it, and the formula (or touched, when given) is the count at every n."),
    Mistake("moe_step_seconds", "ignores_measured_routing",
            lambda model, tokens, bpp, bw, fl, touched=None: _step_reads(model, tokens, bpp, bw, fl),
            "Ignores touched: when the routing was measured, its union replaces the independent formula."),
    Mistake("moe_step_seconds", "compute_with_total_params",
            lambda model, tokens, bpp, bw, fl, touched=None: _step_reads(model, tokens, bpp, bw, fl, touched,
                                                                         total=True),
            "Counts FLOPs for every parameter: a token multiplies only by the dense weights and its top_k "
            "experts (active_params)."),
    Mistake("moe_step_seconds", "read_plus_compute",
            lambda model, tokens, bpp, bw, fl, touched=None: _step_reads(model, tokens, bpp, bw, fl, touched,
                                                                         add=True),
            "Adds reading and computing: in the roofline they overlap, and the step takes the slower of the two."),
    # step_seconds
    Mistake("step_seconds", "no_kv_term", lambda *a: _kv_step(*a, kv=False),
            "Leaves the KV cache out of the bytes read: at long context each row's cache is most of the step."),
    Mistake("step_seconds", "kv_read_per_token", lambda *a: _kv_step(*a, per_token=True),
            "Reads a row's cache once per new token: the gamma + 1 positions of a row attend to the same cache, "
            "which a kernel reads once. That is why verification stays cheap at long context."),
    Mistake("step_seconds", "window_ignored", lambda *a: _kv_step(*a, window=False),
            "Reads the whole context for a model whose cache keeps only its last window positions."),
    Mistake("step_seconds", "no_attention_flops", lambda *a: _kv_step(*a, attention=False),
            "Counts only the weights' FLOPs: each new token also attends over the cached positions, attention_flops "
            "per position, which is what turns a long-context step compute bound at a large batch."),
    Mistake("step_seconds", "flops_per_row", lambda *a: _kv_step(*a, per_row=True),
            "Counts one token's FLOPs per row: a row reads its cache once, but each of its tokens_per_row tokens "
            "does its own matmuls and attention."),
    # crossover_batch
    Mistake("crossover_batch", "last_paying_batch", _last_paying,
            "Returns the last batch at which speculation still pays; the question is the first at which it no "
            "longer does (speedup <= 1)."),
    Mistake("crossover_batch", "every_batch_size", _linear_scan,
            "Tries every batch size: the statement asks for the first power of two (1, 2, 4, ...) at which "
            "speculation no longer pays."),
    Mistake("crossover_batch", "max_rows_when_it_always_pays", _max_rows_if_never,
            "Returns max_rows when speculation still pays there: return None, so that 'never within the range' "
            "cannot be mistaken for a crossover at max_rows."),
    # layer_skip_generate
    Mistake("layer_skip_generate", "recomputes_early_layers",
            lambda *a: _layer_skip(*a, recompute=True),
            "An early layer processed more positions than it should: the early layers run once per position, while "
            "drafting (one new token per forward, on top of the cache) and, for the last draft only, in "
            "verification; the late layers then take all gamma + 1 hidden states from there. Recomputing the "
            "early layers in verification, or re-feeding the sequence while drafting, runs them twice."),
    Mistake("layer_skip_generate", "no_token_after_the_drafts", lambda *a: _layer_skip(*a, no_bonus=True),
            "Verification stops at the drafted positions: feed the last draft through the early layers too and run "
            "the late layers over gamma + 1 positions, so that a round whose drafts are all accepted still adds the "
            "target's own next token."),
    Mistake("layer_skip_generate", "drafts_past_max_tokens", lambda *a: _layer_skip(*a, past_end=True),
            "The last round drafts gamma tokens even when fewer are left: draft at most max_new_tokens - "
            "len(out) - 1, since the round always adds one token of the target's."),
    Mistake("layer_skip_generate", "keeps_rejected_positions", lambda *a: _layer_skip(*a, no_cut=True),
            "After a rejection the cache still counts the rejected drafts' positions: the next round must start "
            "right after the k accepted drafts and the token the target chose (length + k + 1)."),
    # block_weights
    Mistake("block_weights", "h_equals_w", lambda p, q, d: _weights(p, q, d, h_is_w=True),
            "Keeps prefix i with probability w_i: that is the chance the prefix itself survives, but block "
            "verification also counts the mass the next position can still give back: h_i = excess / "
            "(excess + 1 - w_i)."),
    Mistake("block_weights", "last_always_kept", lambda p, q, d: _weights(p, q, d, last_keeps=True),
            "h_gamma is w_gamma: the whole block is kept with probability w_gamma, not always (no position after "
            "it can give mass back)."),
    Mistake("block_weights", "uncapped_weights", lambda p, q, d: _weights(p, q, d, uncapped=True),
            "The weight is capped at 1 at every step: w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1)."),
    Mistake("block_weights", "excess_of_p_not_wp", lambda p, q, d: _weights(p, q, d, excess_of_p=True),
            "The excess at the next position is of w_i p_{i+1} over q_{i+1}: the prefix's weight scales what "
            "the target can give back there."),
    # block_verify
    Mistake("block_verify", "token_wise", verify_chain,
            "Verifies token by token (stop at the first failed coin): exact, but it is notebook 04's rule, not "
            "block verification, and it accepts fewer tokens."),
    Mistake("block_verify", "stops_at_first_failure", lambda *a: _block_sampler(*a, first_failure=True),
            "Stops at the first position whose coin fails: block verification keeps the largest i with "
            "u_i < h_i, whatever failed before it (the point of deciding jointly)."),
    Mistake("block_verify", "last_token_from_p", lambda *a: _block_sampler(*a, last="p"),
            "Draws the last token from the target's p after a short block: it must come from the residual "
            "max(w_tau p - q, 0), or the output is no longer the target's distribution."),
    Mistake("block_verify", "residual_without_weight", lambda *a: _block_sampler(*a, last="unweighted"),
            "Uses max(p - q, 0) after a kept prefix: the residual is max(w_tau p - q, 0), weighted by what is "
            "left of the prefix."),
    # kinds a wrong-answer trial found (issue 53)
    Mistake("experts_touched", "float_counts_when_empty", _counts_untyped,
            "Builds the counts with torch.tensor(list) and no dtype: with no layer the list is empty and the tensor is "
            "float32. Give it dtype=torch.int64."),
    Mistake("moe_step_seconds", "union_capped_by_the_formula", _union_capped_by_formula,
            "Caps the measured union at the independent-routing formula: the formula is the expectation under "
            "independent uniform routing, not a bound. Correlated tokens touch fewer experts, tokens that avoid each "
            "other's experts touch more (up to min(E, n k)): the measurement replaces the formula."),
    Mistake("moe_step_seconds", "no_compute_for_one_token", _no_compute_for_one_token,
            "Skips the compute term for a single token: a decode step is usually memory bound, but the roofline is "
            "the slower of the two for every token count (on a slow device one token is compute bound)."),
    Mistake("step_seconds", "no_compute_for_one_token", _kv_no_compute_for_one_token,
            "Skips the compute term for a single token: the roofline is the slower of reading and computing for "
            "every step, one token included."),
    Mistake("crossover_batch", "strictly_below_one", lambda *a: _first_power_of_two(lambda x: x < 1, *a),
            "Stops only when the speedup is below 1: 'no longer pays' includes a speedup of exactly 1 (<= 1)."),
    Mistake("block_verify", "keeps_at_equality", lambda *a: _block_sampler(*a, at_equal=True),
            "Keeps position i when u_i <= h_i: with h_i = 0 a uniform of exactly 0 keeps a prefix that may not be "
            "kept. Keep it only when u_i < h_i."),
    Mistake("block_verify", "returns_the_drafts_dtype", _draft_dtype,
            "Returns the committed tokens in the draft's dtype: they are int64 (long) whatever the draft's dtype, as "
            "verify_chain returns them."),
    Mistake("block_verify", "own_seed_without_generator", _own_seed_without_generator,
            "Falls back to a generator of its own with a fixed seed when none is given: generator=None means torch's "
            "global generator, which torch.manual_seed controls."),
    Mistake("block_verify", "clamps_q_in_place", _clamps_q_in_place,
            "Clamps q in place: the caller's tensor changes. Work on a copy (q.clamp(min=...)) if you need one."),
    Mistake("step_seconds", "flops_from_bytes", _flops_from_bytes,
            "Counts params x bytes_per_param as the FLOPs per token: a token does 2 FLOPs per parameter whatever the "
            "weights' width (equal only in bf16)."),
    Mistake("crossover_batch", "rounded_speedup", lambda *a: _first_power_of_two(lambda x: round(x, 2) <= 1, *a),
            "Rounds the speedup before comparing it with 1: a speedup of 1.004 still pays."),
    Mistake("crossover_batch", "capped_at_4096", _capped_at_4096,
            "Searches only up to 4096 whatever max_rows: the search goes up to max_rows."),
    Mistake("block_verify", "one_shared_uniform", _one_shared_uniform,
            "Draws one uniform for every position: each position has its own, u_1..u_gamma independent, or tau's law "
            "is not the one block verification's proof needs."),
    Mistake("block_verify", "reseeds_without_generator", _reseeds_without_generator,
            "Makes a generator from torch.initial_seed() when none is given: every call then starts from the same "
            "seed. generator=None means torch's global generator, which goes on from call to call."),
]
