"""Correct answers written differently from the reference must pass their checks.

Each function here is a plausible correct answer a learner might write: a loop where speed is not
graded, another valid way to draw the random numbers (an exponential race or Gumbel-max instead
of torch.multinomial, another order of draws), a different but equivalent comparison. A check
that rejects one of them is too narrow, which is as much a defect as one that accepts a mistake.
"""

from __future__ import annotations

import math

import pytest
import torch

from specdec import engine
from specdec.checks import (
    analysis as analysis_checks,
    chain as chain_checks,
    engine as engine_checks,
    greedy as greedy_checks,
    ledger as ledger_checks,
    lookup as lookup_checks,
    pitfalls as pitfall_checks,
    rejection as rejection_checks,
    tree as tree_checks,
)
from specdec.greedy import PAD
from specdec.models.model import KVCache
from specdec.params import GREEDY


def _race(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Sample index ~ weights / sum(weights) along the last dim by an exponential race (no multinomial)."""
    u = torch.rand(weights.shape, generator=generator, dtype=torch.float64).clamp_min(1e-300)
    return (weights.double() / -u.log()).argmax(-1)


def _gumbel(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel-max sampling: argmax of log p + Gumbel noise."""
    u = torch.rand(probs.shape, generator=generator, dtype=torch.float64).clamp(1e-300, 1 - 1e-16)
    return (probs.double().log() - (-u.log()).log()).argmax(-1)


# -- notebook 01 ---------------------------------------------------------------------------------------------


def expected_tokens_per_round(a: float, gamma: int) -> float:
    if not 0 <= a <= 1 or gamma < 0:  # what the skeleton's check_probability and check_nonnegative_int say
        raise ValueError(f"need 0 <= a <= 1 and gamma >= 0, got a={a}, gamma={gamma}")
    return sum(a**i for i in range(gamma + 1))  # the geometric sum, term by term


def speedup(a: float, gamma: int, c: float) -> float:
    return expected_tokens_per_round(a, gamma) / (1 + gamma * c)


def best_gamma(a: float, c: float, max_gamma: int = 32) -> int:
    best, best_s = 1, -1.0
    for g in range(1, max_gamma + 1):  # strictly greater: the smallest gamma wins a tie
        s = speedup(a, g, c)
        if s > best_s + 1e-15 * max(1.0, s):
            best, best_s = g, s
    return best


# -- notebook 02 ---------------------------------------------------------------------------------------------


def greedy_verify(draft: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    out = []
    for i in range(len(draft) + 1):  # a loop: speed is not graded here
        best = int(target_logits[i].argmax())
        out.append(best)
        if i == len(draft) or int(draft[i]) != best:
            break
    return torch.tensor(out, dtype=torch.long)


def greedy_verify_batched(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    target = target_logits.argmax(-1)
    mismatch = torch.cat([draft != target[:, :-1], torch.ones_like(draft[:, :1], dtype=torch.bool)], 1)
    n_committed = mismatch.long().argmax(1) + 1  # the first mismatch (or the sentinel), counted from 1
    keep = torch.arange(target.shape[1])[None, :] < n_committed[:, None]
    return target.masked_fill(~keep, PAD), n_committed


# -- notebook 03 ---------------------------------------------------------------------------------------------


def verify_token(p, q, y, u, generator=None):
    if float(q[y]) > 0 and u < float(p[y]) / float(q[y]):  # the division form, with q(y) > 0 guarded
        return True, int(y)
    return False, int(_race(residual_distribution(p, q), generator))


def residual_distribution(p, q):
    excess = torch.clamp(p.double() - q.double(), min=0.0)
    total = float(excess.sum())
    return excess / total if total > 0 else p.double().clone()


def acceptance_rate(p, q):
    return 1.0 - 0.5 * float((p.double() - q.double()).abs().sum())  # 1 - TV(p, q)


# -- notebook 04 ---------------------------------------------------------------------------------------------


def verify_chain(p, q, draft, generator=None):
    gamma = len(draft)
    us = torch.rand(gamma, generator=generator, dtype=torch.float64)  # every uniform up front
    out = []
    for i in range(gamma):
        y = int(draft[i])
        if float(us[i]) * float(q[i, y]) < float(p[i, y]):
            out.append(y)
            continue
        out.append(int(_gumbel(residual_distribution(p[i], q[i]), generator)))
        return torch.tensor(out, dtype=torch.long)
    out.append(int(_gumbel(p[gamma].double(), generator)))
    return torch.tensor(out, dtype=torch.long)


def expected_committed_length(accept_probs):
    total, survive = 1.0, 1.0
    for a in accept_probs:
        survive *= a
        total += survive
    return total


def verify_chain_batched(p, q, draft, generator=None):
    draft = draft.long()  # int32 ids are valid input; the tokens come out long
    B, gamma = draft.shape
    u = torch.rand(B, gamma, generator=generator, dtype=torch.float64)
    p_draft = p[:, :gamma].gather(-1, draft[..., None])[..., 0].double()
    q_draft = q.gather(-1, draft[..., None])[..., 0].double()
    rejected = u * q_draft >= p_draft
    k = torch.where(rejected.any(1), rejected.long().argmax(1), torch.full((B,), gamma))
    rows = torch.arange(B)
    q_pad = torch.cat([q.double(), torch.zeros_like(q[:, :1], dtype=torch.float64)], 1)
    excess = (p[rows, k].double() - q_pad[rows, k]).clamp_min(0)
    weights = torch.where(excess.sum(-1, keepdim=True) > 0, excess, p[rows, k].double())
    extra = _race(weights, generator)  # the correction, or the bonus where k == gamma (q is zero there)
    tokens = torch.where(torch.arange(gamma + 1) < k[:, None], torch.cat([draft, draft[:, :1]], 1), PAD)
    tokens[rows, k] = extra
    return tokens.long(), (k + 1).long()


# -- notebook 05 ---------------------------------------------------------------------------------------------


@torch.inference_mode()
def target_only_generate(target, prompt, n_tokens, params=GREEDY, generator=None):
    cache = KVCache(target.config)
    out = []
    last = prompt[-1]
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    while len(out) < n_tokens:
        probs = params.probs(target(torch.tensor([[last]]), cache)[0, -1])
        last = int(torch.multinomial(probs, 1, generator=generator))  # multinomial instead of sample()
        out.append(last)
    return out


@torch.inference_mode()
def propose(draft, cache, pending, gamma, params=GREEDY, generator=None):
    drafts, rows = [], []
    logits = draft(torch.tensor([list(pending)]), cache)[0, -1]
    for i in range(gamma):
        q = params.probs(logits)
        drafts.append(int(torch.multinomial(q, 1, generator=generator)))
        rows.append(q)
        if i < gamma - 1:
            logits = draft(torch.tensor([[drafts[-1]]]), cache)[0, -1]
    return drafts, torch.stack(rows)


def accept_until_stop(output, committed, stop):
    emitted = []
    for token in committed:
        emitted.append(token)
        text = output + emitted
        done = len(text) >= stop.max_tokens or token in stop.stop_token_ids
        for seq in stop.stop_sequences:
            if len(text) >= len(seq) and tuple(text[len(text) - len(seq):]) == tuple(seq):
                done = True
        if done:
            return emitted, True
    return emitted, False


@torch.inference_mode()
def generate_until_stop(target, draft, prompt, stop, gamma, params=GREEDY, generator=None):
    t_cache, d_cache = KVCache(target.config), KVCache(draft.config)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), t_cache)
        draft(torch.tensor([prompt[:-1]]), d_cache)
    output, pending = [], [prompt[-1]]
    while True:
        P = len(prompt) + len(output)
        drafts, q = engine.propose(draft, d_cache, pending, gamma, params, generator)
        logits = target(torch.tensor([[([prompt[-1]] + output)[-1]] + drafts]), t_cache)[0]
        if params.temperature == 0:
            committed = engine.greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = engine.verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        emitted, finished = accept_until_stop(output, committed, stop)
        output = output + emitted
        pending = engine.rollback(t_cache, d_cache, P, drafts, emitted)
        if finished:
            return output, t_cache, d_cache


# -- notebook 06 ---------------------------------------------------------------------------------------------


def find_match(tokens, n):
    tokens = list(tokens)
    if n >= len(tokens):
        return -1
    suffix = tokens[-n:]
    starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == suffix]
    return starts[-1] if starts else -1  # all matches, then the latest


def find_match_vectorised(tokens, n):
    L = tokens.shape[0]
    if n >= L:
        return -1
    hits = torch.ones(L - n, dtype=torch.bool)
    for j in range(n):  # a loop over the n-gram's length, not over positions
        hits &= tokens[j : L - n + j] == tokens[L - n + j]
    where = torch.arange(L - n)[hits]
    return int(where.max()) if where.numel() else -1


# -- notebook 07 ---------------------------------------------------------------------------------------------


def verify_tree_greedy(tokens, parents, logits):
    best = logits.argmax(-1).tolist()
    tokens = tokens.tolist()
    children = {i: [c for c in range(1, len(parents)) if parents[c] == i] for i in range(len(parents))}

    def deepest(node: int) -> list[int]:  # depth-first: the longest agreeing path below node, earliest on ties
        found = [node]
        for c in children[node]:
            if tokens[c] == best[node]:
                below = [node] + deepest(c)
                if len(below) > len(found) or (len(below) == len(found) and below[-1] < found[-1]):
                    found = below
        return found

    path = deepest(0)
    return path, [tokens[i] for i in path[1:]] + [best[path[-1]]]


def verify_tree_sampling(tokens, tree, p, generator=None):
    tokens = tokens.tolist()
    node, path, committed = 0, [0], []
    while True:
        r = p[node].double().clone()
        moved = False
        for child in tree.children(node):
            y = tokens[child]
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u < float(r[y]) / float(r.sum()):  # divide instead of multiplying
                node, moved = child, True
                break
            r[y] = 0.0
        if not moved:
            committed.append(int(_race(r, generator)))
            return path, committed
        path.append(node)
        committed.append(tokens[node])


def compact_cache(cache, start, path):
    for slot, node in enumerate(path):  # one slot at a time; moving forward never overwrites a later source
        cache.k[:, :, :, start + slot] = cache.k[:, :, :, start + node]
        cache.v[:, :, :, start + slot] = cache.v[:, :, :, start + node]
    cache.crop(start + len(path))


# -- notebook 09 ---------------------------------------------------------------------------------------------


def acceptance_from_rounds(accepted, gamma):
    if gamma < 1 or not accepted or any(not 0 <= k <= gamma for k in accepted):
        raise ValueError("need gamma >= 1 and rounds with 0 <= accepted <= gamma")
    tested = sum(k if k == gamma else k + 1 for k in accepted)
    return sum(accepted) / tested


def predicted_speedup(a, gamma, c, verify_ratio=1.0):
    return sum(a**i for i in range(gamma + 1)) / (gamma * c + verify_ratio)


def alpha_from_rate(rate, gamma):
    """Newton's method from alpha = 1 (the rate is increasing and convex in alpha), ints at the ends."""
    if rate in (0, 1):
        return int(rate)
    alpha = 1.0
    for _ in range(100):
        f = sum(alpha**i for i in range(1, gamma + 1)) / gamma - rate
        slope = sum(i * alpha ** (i - 1) for i in range(1, gamma + 1)) / gamma
        alpha -= f / slope
    return alpha


def alpha_from_rate_coarse(rate, gamma):
    """Bisection stopped as soon as the interval is 1e-6 wide: the tolerance the statement asks for."""
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid**i for i in range(1, gamma + 1)) / gamma < rate else (lo, mid)
    return lo


# -- notebook 10 ---------------------------------------------------------------------------------------------


def draft_propose(logits, params, generator=None):
    q = params.probs(logits)
    return _gumbel(q, generator), q  # Gumbel-max draws from q; at temperature 0 q is one-hot: the argmax


def draft_propose_greedy_one_hot(logits, params, generator=None):
    """The statement's other fix: keep greedy drafting, report the one-hot q the token is really drawn from."""
    tokens = params.probs(logits).argmax(-1)
    return tokens, torch.nn.functional.one_hot(tokens, logits.shape[-1]).to(torch.float64)


def correction_token(p, q, generator=None):
    excess = (p - q).clamp_min(0)
    weights = torch.where(excess.sum(-1, keepdim=True) > 0, excess, p)
    return _race(weights, generator)  # the unnormalised residual, as vLLM samples it


def bonus_token(p_last, generator=None):
    return _gumbel(p_last, generator)


def accepted_counts(accept):
    rejected = torch.cat([~accept, torch.ones_like(accept[:, :1])], 1)
    return rejected.long().argmax(1)  # the first rejection's position is the number accepted


def accept_drafts(p_draft, q_draft, u):
    return (q_draft > 0) & (u < p_draft / q_draft.clamp_min(1e-300))


def stream_counts(tokens, n_committed, generated, eos_id, max_tokens):
    valid = torch.arange(tokens.shape[1])[None, :] < n_committed[:, None]
    eos_before = ((tokens == eos_id) & valid).long().cumsum(1)  # EOS seen up to and including each position
    keep = valid & ((eos_before - (tokens == eos_id).long()) == 0)  # positions not after an EOS
    through_eos = keep.sum(1)
    stream = torch.clamp(through_eos, max=max_tokens - generated)
    ended_by_eos = (((tokens == eos_id) & valid).long().cumsum(1) > 0).gather(1, (stream - 1)[:, None])[:, 0]
    return stream, ended_by_eos | (generated + stream == max_tokens)


ALTERNATIVES = [
    (expected_tokens_per_round, ledger_checks.check_expected_tokens_per_round),
    (speedup, ledger_checks.check_speedup),
    (best_gamma, ledger_checks.check_best_gamma),
    (greedy_verify, greedy_checks.check_greedy_verify),
    (greedy_verify_batched, greedy_checks.check_greedy_verify_batched),
    (verify_token, rejection_checks.check_verify_token),
    (residual_distribution, rejection_checks.check_residual_distribution),
    (acceptance_rate, rejection_checks.check_acceptance_rate),
    (verify_chain, chain_checks.check_verify_chain),
    (expected_committed_length, chain_checks.check_expected_committed_length),
    (verify_chain_batched, chain_checks.check_verify_chain_batched),
    (target_only_generate, engine_checks.check_target_only_generate),
    (propose, engine_checks.check_propose),
    (accept_until_stop, engine_checks.check_accept_until_stop),
    (generate_until_stop, engine_checks.check_generate_until_stop),
    (find_match, lookup_checks.check_find_match),
    (find_match_vectorised, lookup_checks.check_find_match_vectorised),
    (verify_tree_greedy, tree_checks.check_verify_tree_greedy),
    (verify_tree_sampling, tree_checks.check_verify_tree_sampling),
    (compact_cache, tree_checks.check_compact_cache),
    (acceptance_from_rounds, analysis_checks.check_acceptance_from_rounds),
    (alpha_from_rate, analysis_checks.check_alpha_from_rate),
    (alpha_from_rate_coarse, analysis_checks.check_alpha_from_rate),
    (predicted_speedup, analysis_checks.check_predicted_speedup),
    (draft_propose, pitfall_checks.check_draft_propose),
    (draft_propose_greedy_one_hot, pitfall_checks.check_draft_propose),
    (correction_token, pitfall_checks.check_correction_token),
    (bonus_token, pitfall_checks.check_bonus_token),
    (accepted_counts, pitfall_checks.check_accepted_counts),
    (accept_drafts, pitfall_checks.check_accept_drafts),
    (stream_counts, pitfall_checks.check_stream_counts),
]


# -- a second batch: the remaining exercises -------------------------------------------------------------------


def count_params(cfg):
    d, hd, layers = cfg.d_model, cfg.head_dim, cfg.n_layers
    q_o = 2 * d * (cfg.n_heads * hd)
    k_v = 2 * d * (cfg.n_kv_heads * hd)
    layer = q_o + k_v + 3 * d * cfg.d_ff + 2 * d
    matrices = 1 if cfg.tied_embeddings else 2
    return layers * layer + d + matrices * cfg.vocab_size * d


def kv_bytes_per_token(cfg, bytes_per_elem=2):
    return cfg.n_layers * (cfg.n_kv_heads * cfg.head_dim) * bytes_per_elem * 2


def roofline_step_time_s(n_params, bytes_per_param, n_tokens, bandwidth, flops):
    memory, compute = n_params * bytes_per_param / bandwidth, n_params * n_tokens * 2 / flops
    return compute if compute > memory else memory


def round_shapes(P, gamma, k):
    from specdec.greedy import RoundShapes

    full = k == gamma
    return RoundShapes(target_input_len=1 + gamma, target_logit_rows=1 + gamma, committed_len=P + k + 1,
                       target_cache_len=P + k, target_discarded=gamma - k,
                       draft_cache_len=P + k - (1 if full else 0), draft_catch_up=int(full))


def speculative_greedy_generate(target, draft, prompt, n_tokens, gamma):
    out, per_round = [], []
    tokens = prompt.tolist()
    while len(out) < n_tokens:
        proposal = list(tokens)
        for _ in range(gamma):
            proposal.append(int(draft.next_logits(torch.tensor(proposal)).argmax()))
        rows = target.logits(torch.tensor(proposal))[-(gamma + 1):]
        committed = greedy_verify(torch.tensor(proposal[len(tokens):]), rows).tolist()
        tokens += committed
        out += committed
        per_round.append(len(committed))
    return torch.tensor(out[:n_tokens]), per_round


def acceptance_probability(p, q, y):
    ratio = float(p[y]) / float(q[y])
    return ratio if ratio < 1 else 1.0


def output_paths(p, q):
    p, q = p.double(), q.double()
    accept_path = torch.minimum(p, q)  # q(x) min(1, p/q), written as the theorem's min(p, q)
    beta = float(accept_path.sum())
    return accept_path, (1 - beta) * residual_distribution(p, q)


def best_gamma_measured(accept_probs, draft_step_s, verify_s):
    best, best_rate = None, -1.0
    for g in range(1, len(verify_s) + 1):
        rate = expected_committed_length(accept_probs[:g]) / (g * draft_step_s + verify_s[g - 1])
        if rate > best_rate:
            best, best_rate = g, rate
    return best


def speculative_round(target, draft, context, gamma, temperature, generator):
    from specdec.sampling import probs_from_logits

    proposal, q_rows, drafts = context.clone(), [], []
    for _ in range(gamma):
        q_i = probs_from_logits(draft.next_logits(proposal), temperature)
        y = int(_race(q_i, generator))
        drafts.append(y)
        q_rows.append(q_i)
        proposal = torch.cat([proposal, torch.tensor([y])])
    p = probs_from_logits(target.logits(proposal)[-(gamma + 1):], temperature)
    return verify_chain(p, torch.stack(q_rows), torch.tensor(drafts), generator)


def rollback(target_cache, draft_cache, P, drafts, committed):
    k = len(committed) - 1
    target_cache.crop(P + k)
    if k == len(drafts):
        return [drafts[-1], committed[-1]]
    draft_cache.crop(P + k)
    return committed[-1:]


@torch.inference_mode()
def speculative_generate(target, draft, prompt, n_tokens, gamma, params=GREEDY, generator=None):
    out, t_cache, d_cache = [], KVCache(target.config), KVCache(draft.config)
    if len(prompt) > 1:
        for model, cache in ((target, t_cache), (draft, d_cache)):
            model(torch.tensor([prompt[:-1]]), cache)
    pending = [prompt[-1]]
    while len(out) < n_tokens:
        P = len(prompt) + len(out)
        drafts, q = propose(draft, d_cache, pending, gamma, params, generator)
        last = (list(prompt) + out)[-1]
        logits = target(torch.tensor([[last] + drafts]), t_cache)[0]
        if params.temperature == 0:
            committed = greedy_verify(torch.tensor(drafts), logits).tolist()
        else:
            committed = verify_chain(params.probs(logits), q, torch.tensor(drafts), generator).tolist()
        out += committed
        pending = rollback(t_cache, d_cache, P, drafts, committed)
    return out[:n_tokens]


def propose_ngram(tokens, gamma, n_max=3, n_min=1):
    for n in reversed(range(n_min, n_max + 1)):
        start = find_match(tokens, n)
        if start != -1:
            return list(tokens)[start + n : start + n + gamma]
    return []


@torch.inference_mode()
def lookup_generate(target, prompt, n_tokens, gamma, params=GREEDY, generator=None, n_max=3, n_min=1):
    cache, tokens = KVCache(target.config), list(prompt)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    while len(tokens) < len(prompt) + n_tokens:
        P = len(tokens)
        proposal = propose_ngram(tokens, gamma, n_max, n_min)
        logits = target(torch.tensor([tokens[-1:] + proposal]), cache)[0]
        probs = params.probs(logits)
        committed = []
        for i, y in enumerate(proposal):  # the exact-match form: sample from p and compare
            x = int(torch.multinomial(probs[i], 1, generator=generator))
            committed.append(x)
            if x != y:
                break
        else:
            committed.append(int(torch.multinomial(probs[len(proposal)], 1, generator=generator)))
        tokens += committed
        cache.crop(P + len(committed) - 1)
    return tokens[len(prompt) : len(prompt) + n_tokens]


def flatten_tree(choices):
    from specdec.tree import Tree, check_choices

    paths = sorted(set(check_choices(choices)), key=lambda c: (len(c), c))
    position = {(): 0}
    for i, path in enumerate(paths, start=1):
        position[path] = i
    return Tree(tuple([-1] + [position[c[:-1]] for c in paths]), tuple([0] + [len(c) for c in paths]),
                tuple([0] + [c[-1] for c in paths]))


def tree_mask(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:  # walk up to the root
            mask[i, j] = True
            j = parents[j]
    return mask


def tree_position_ids(cache_len, depths):
    return torch.tensor([cache_len + d for d in depths], dtype=torch.long)


def measured_costs(rounds, target_step_s):
    if not rounds or target_step_s <= 0:
        raise ValueError("need rounds and a positive step time")
    draft_s = proposed = target_s = 0.0
    for r in rounds:
        draft_s, proposed, target_s = draft_s + r.draft_s, proposed + r.proposed, target_s + r.target_s
    return draft_s / proposed / target_step_s, target_s / len(rounds) / target_step_s


def best_measured_gamma(rows, task, proposer):
    mine = sorted((r for r in rows if r["task"] == task and r["proposer"] == proposer), key=lambda r: r["gamma"])
    if not mine:
        raise ValueError(f"no rows for {task} / {proposer}")
    best = mine[0]
    for r in mine[1:]:
        if r["tokens_per_s"] > best["tokens_per_s"]:
            best = r
    return best["gamma"]


def draft_token_probs(probs, drafts):
    B, gamma = drafts.shape
    return probs[torch.arange(B)[:, None], torch.arange(gamma)[None, :], drafts]


def residual(p, q):
    r = torch.relu(p - q)
    total = r.sum(dim=-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, r / safe, p)


def verify_logits(target, cache, sequence, drafts):
    return target(torch.tensor([[sequence[-1], *drafts]]), cache)[0]


def decode_step_floor_s(n_params, bytes_per_param, bandwidth):
    return (n_params * bytes_per_param) / bandwidth


def tokens_per_s_cap(n_params, bytes_per_param, bandwidth):
    if not isinstance(n_params, int) or isinstance(n_params, bool):
        raise TypeError(f"n_params must be an int, got {n_params!r}")
    if min(n_params, bytes_per_param, bandwidth) <= 0:
        raise ValueError("n_params, bytes_per_param and bandwidth must be positive")
    return bandwidth / (n_params * bytes_per_param)


def expected_tokens_per_round_int_at_one(a, gamma):
    """An int where the signature says float is allowed (PEP 484's numeric tower): gamma + 1 at a = 1."""
    if not 0 <= a <= 1 or gamma < 0:
        raise ValueError(f"need 0 <= a <= 1 and gamma >= 0, got a={a}, gamma={gamma}")
    return gamma + 1 if a == 1 else (1 - a ** (gamma + 1)) / (1 - a)


def acceptance_probability_int_zero(p, q, y):
    """The int 0 where the target gives the draft no probability: a float by PEP 484's numeric tower."""
    if p[y] == 0:
        return 0
    return min(1.0, float(p[y] / q[y]))


def expected_committed_length_int_when_empty(accept_probs):
    """With no drafts the round commits exactly the target's token: the int 1 is a float by PEP 484's numeric tower."""
    if not accept_probs:
        return 1
    return 1 + sum(math.prod(accept_probs[: i + 1]) for i in range(len(accept_probs)))


def bonus_token_inverse_cdf(p_last, generator=None):
    """One float64 uniform per row from the generator, then the first token whose CDF exceeds it."""
    u = torch.rand(p_last.shape[0], 1, generator=generator, dtype=torch.float64)
    cdf = p_last.double().cumsum(-1)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=p_last.shape[-1] - 1)[:, 0]


ALTERNATIVES += [
    (expected_tokens_per_round_int_at_one, ledger_checks.check_expected_tokens_per_round),
    (bonus_token_inverse_cdf, pitfall_checks.check_bonus_token),
    (expected_committed_length_int_when_empty, chain_checks.check_expected_committed_length),
    (acceptance_probability_int_zero, rejection_checks.check_acceptance_probability),
    (decode_step_floor_s, lambda fn: ledger_checks.check_decode_floor(fn, tokens_per_s_cap)),
    (tokens_per_s_cap, lambda fn: ledger_checks.check_decode_floor(decode_step_floor_s, fn)),
    (count_params, ledger_checks.check_count_params),
    (kv_bytes_per_token, ledger_checks.check_kv_bytes_per_token),
    (roofline_step_time_s, ledger_checks.check_roofline_step_time_s),
    (round_shapes, greedy_checks.check_round_shapes),
    (speculative_greedy_generate, greedy_checks.check_speculative_greedy_generate),
    (acceptance_probability, rejection_checks.check_acceptance_probability),
    (output_paths, rejection_checks.check_output_paths),
    (best_gamma_measured, chain_checks.check_best_gamma_measured),
    (speculative_round, chain_checks.check_speculative_round),
    (rollback, engine_checks.check_rollback),
    (speculative_generate, engine_checks.check_speculative_generate),
    (propose_ngram, lookup_checks.check_propose_ngram),
    (lookup_generate, lookup_checks.check_lookup_generate),
    (flatten_tree, tree_checks.check_flatten_tree),
    (tree_mask, tree_checks.check_tree_mask),
    (tree_position_ids, tree_checks.check_tree_position_ids),
    (measured_costs, analysis_checks.check_measured_costs),
    (best_measured_gamma, analysis_checks.check_best_measured_gamma),
    (draft_token_probs, pitfall_checks.check_draft_token_probs),
    (residual, pitfall_checks.check_residual),
    (verify_logits, pitfall_checks.check_verify_logits),
]


@pytest.mark.parametrize("fn, check", ALTERNATIVES, ids=[fn.__name__ for fn, _ in ALTERNATIVES])
def test_an_alternative_correct_answer_passes(fn, check):
    check(fn)


def test_the_alternatives_are_not_the_reference():
    """Guard against an alternative that is a copy of the reference (it would prove nothing)."""
    import inspect

    from specdec import chain, greedy, ledger, lookup, pitfalls, rejection, tree

    modules = [ledger, greedy, rejection, chain, engine, lookup, tree, pitfalls]
    for fn, _ in ALTERNATIVES:
        for module in modules:
            reference = getattr(module, fn.__name__, None)
            if reference is not None and inspect.isfunction(reference):
                assert inspect.getsource(reference).split('"""')[-1] != inspect.getsource(fn).split('"""')[-1]
    assert math.isclose(expected_tokens_per_round(0.8, 4), 3.3616)
