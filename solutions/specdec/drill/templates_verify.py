"""Drill templates on verification: greedy (02), one position (03), a chain (04), stops (05), prompt lookup (06)."""

from __future__ import annotations

import random

import torch

from specdec.chain import best_gamma_measured, expected_committed_length
from specdec.drill.draws import fmt_list, two_distributions
from specdec.drill.questions import Number, number, show
from specdec.greedy import greedy_verify
from specdec.lookup import find_match, propose_ngram
from specdec.params import StopCriteria, accept_until_stop
from specdec.rejection import acceptance_probability, acceptance_rate, output_paths, residual_distribution


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# -- 02 greedy verification ----------------------------------------------------------------------------------------


@number("verify_greedy_committed", topic="verify", notebook="02_greedy_verify", section="2. The rule")
def greedy_committed(rng: random.Random) -> Number:
    gamma = rng.randrange(3, 8)
    k = rng.randrange(0, gamma + 1)
    draft = [rng.randrange(1, 30) for _ in range(gamma)]
    target = draft[:k] + [rng.randrange(1, 30) for _ in range(gamma + 1 - k)]
    if k < gamma:
        while target[k] == draft[k]:
            target[k] = rng.randrange(1, 30)
        for i in range(k + 1, gamma):  # agreement after the first mismatch must not count
            if rng.random() < 0.5:
                target[i] = draft[i]
    logits = torch.nn.functional.one_hot(torch.tensor(target), 30).double()
    committed = greedy_verify(torch.tensor(draft), logits).tolist()
    return Number(
        f"Greedy verification. Drafts (gamma = {gamma}): {draft}. The target's argmax at its {gamma + 1} rows (the last "
        f"committed token, then each draft): {target}. How many tokens does the round commit?",
        len(committed),
        f"Row i scores the token after draft[:i], so compare draft[i] with target[i]: the leading run of matches is "
        f"k = {k}{' (later matches after the first mismatch do not count)' if k < gamma - 1 else ''}. Commit "
        f"draft[:k] and then target[k] ({'the bonus' if k == gamma else 'the correction'}): {committed}, "
        f"{show(len(committed))} tokens.",
        unit="tokens", rel=0)


# -- 03 rejection sampling -----------------------------------------------------------------------------------------


@number("rejection_acceptance_rate", topic="rejection", notebook="03_rejection_sampling",
        section="2. Why the output is exactly `p`")
def rejection_rate(rng: random.Random) -> Number:
    p, q = two_distributions(rng)
    beta = acceptance_rate(_t(p), _t(q))
    mins = [min(a, b) for a, b in zip(p, q)]
    return Number(
        f"Target p = {fmt_list(p)}, draft q = {fmt_list(q)}. What is the probability that a draft token y ~ q is "
        "accepted by the rule min(1, p(y)/q(y))?",
        beta,
        f"beta = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)) = {' + '.join(f'{m:g}' for m in mins)} = "
        f"{show(beta)} (= 1 - TV(p, q)).")


@number("rejection_accept_probability", topic="rejection", notebook="03_rejection_sampling", section="1. The set-up")
def accept_probability(rng: random.Random) -> Number:
    while True:
        p, q = two_distributions(rng)
        candidates = [i for i in range(len(p)) if 0 < p[i] < q[i]]
        if candidates:
            break
    y = rng.choice(candidates)
    a = acceptance_probability(_t(p), _t(q), y)
    return Number(
        f"Target p = {fmt_list(p)}, draft q = {fmt_list(q)} (tokens 0..{len(p) - 1}). The draft proposed token {y}. With "
        "what probability is it accepted?",
        a,
        f"min(1, p({y}) / q({y})) = min(1, {p[y]:g} / {q[y]:g}) = {show(a)}: the draft over-proposes token {y}, so only "
        "part of its proposals survive.")


@number("rejection_residual", topic="rejection", notebook="03_rejection_sampling", section="1. The set-up")
def residual(rng: random.Random) -> Number:
    while True:
        p, q = two_distributions(rng)
        above = [i for i in range(len(p)) if p[i] > q[i]]
        if len(above) >= 2:  # a residual on one token would make the answer 1
            break
    r = residual_distribution(_t(p), _t(q)).tolist()
    x = rng.choice(above)
    excess = [max(a - b, 0.0) for a, b in zip(p, q)]
    return Number(
        f"Target p = {fmt_list(p)}, draft q = {fmt_list(q)} (tokens 0..{len(p) - 1}). A draft was rejected: with what "
        f"probability is the correction token {x}?",
        r[x],
        f"The residual is max(p - q, 0) normalised: max(p - q, 0) = {fmt_list([round(e, 10) for e in excess])}, sum "
        f"{sum(excess):.4g} (the rejection probability); r({x}) = {excess[x]:.4g} / {sum(excess):.4g} = {show(r[x])}.")


@number("rejection_wrong_rule", topic="rejection", notebook="03_rejection_sampling",
        section="2. Why the output is exactly `p`")
def wrong_rule(rng: random.Random) -> Number:
    while True:
        p, q = two_distributions(rng)
        accept, _ = output_paths(_t(p), _t(q))
        reject = 1 - float(accept.sum())
        wrong = [float(accept[i]) + reject * p[i] for i in range(len(p))]
        x = max(range(len(p)), key=lambda i: abs(wrong[i] - p[i]))
        if abs(wrong[x] - p[x]) > 0.02:
            break
    return Number(
        f"Target p = {fmt_list(p)}, draft q = {fmt_list(q)}. A buggy sampler accepts with min(1, p/q) but, after a "
        f"rejection, samples the replacement from p itself instead of the residual. With what probability does it "
        f"output token {x}?",
        wrong[x],
        f"Accept path: min(p, q)({x}) = {float(accept[x]):.4g}; rejections happen with probability 1 - sum min(p, q) = "
        f"{reject:.4g} and then give {x} with p({x}) = {p[x]:g}: {float(accept[x]):.4g} + {reject:.4g} x {p[x]:g} = "
        f"{show(wrong[x])}, not p({x}) = {p[x]:g}. "
        + (f"Token {x} is over-proposed (q > p): the accept path already gives it p({x}), and the rejections add more."
           if q[x] > p[x] else
           f"Token {x} is under-proposed (q < p): the residual would give it the missing p - q, but resampling from p "
           "gives back too little."))


# -- 04 a chain ----------------------------------------------------------------------------------------------------


@number("verify_expected_length_by_position", topic="verify", notebook="04_chain_verify",
        section="3. How many tokens per round?")
def expected_length(rng: random.Random) -> Number:
    gamma = rng.randrange(3, 7)
    rates = sorted((round(rng.uniform(0.5, 0.95), 2) for _ in range(gamma)), reverse=True)
    e = expected_committed_length(rates)
    survive, terms = 1.0, []
    for a in rates:
        survive *= a
        terms.append(survive)
    return Number(
        f"Draft i is accepted with probability a_i given drafts 1..i-1 were: a = {rates}. Expected tokens committed per "
        "round?",
        e,
        f"Draft i is committed with probability a_1 ... a_i: {', '.join(f'{t:.4f}' for t in terms)}; "
        f"E = 1 + their sum = {show(e)} (the 1 is the correction or bonus).",
        unit="tokens")


@number("verify_best_gamma_measured", topic="verify", notebook="04_chain_verify",
        section="4. Choosing gamma from measurements")
def best_gamma_from_measurements(rng: random.Random) -> Number:
    while True:
        rates = sorted((round(rng.uniform(0.55, 0.95), 2) for _ in range(6)), reverse=True)
        draft_ms = round(rng.uniform(0.5, 3.0), 1)
        flat = round(rng.uniform(15, 30), 1)
        bend = rng.randrange(2, 6)
        verify_ms = [round(flat * (1 + max(0, g - bend) * rng.uniform(0.08, 0.25)), 1) for g in range(1, 7)]
        verify_ms = [max(verify_ms[: i + 1]) for i in range(6)]  # never cheaper for more positions
        best = best_gamma_measured(rates, draft_ms, verify_ms)
        rate = {g: expected_committed_length(rates[:g]) / (g * draft_ms + verify_ms[g - 1]) for g in range(1, 7)}
        if all(rate[best] > v * 1.01 for g, v in rate.items() if g != best):
            break
    table = ", ".join(f"{g}: {rate[g] * 1e3:.1f}" for g in range(1, 7))
    return Number(
        f"Measured: acceptance of draft i (given the earlier ones) {rates}; one draft step {draft_ms} ms; a target "
        f"forward over gamma + 1 positions takes {verify_ms} ms for gamma = 1..6. Which gamma gives the most tokens per "
        "second?",
        best,
        f"Tokens/s = E(a_1..a_gamma) / (gamma x {draft_ms} ms + verify(gamma)): {table} tokens/s for gamma = 1..6, so "
        f"gamma = {best}.",
        unit="drafts", rel=0)


# -- 05 stops inside accepted drafts -------------------------------------------------------------------------------


@number("verify_stop_inside_round", topic="verify", notebook="05_kv_cache_engine",
        section="6. Stops inside accepted drafts")
def stop_inside_round(rng: random.Random) -> Number:
    gamma = rng.randrange(3, 8)
    committed = [rng.randrange(3, 90) for _ in range(rng.randrange(2, gamma + 2))]
    emitted_before = rng.randrange(5, 60)
    max_tokens = emitted_before + rng.randrange(1, len(committed) + 3)
    eos = 2
    if rng.random() < 0.6:
        committed[rng.randrange(0, len(committed))] = eos
    stop = StopCriteria(max_tokens, stop_token_ids=(eos,))
    emitted, finished = accept_until_stop([5] * emitted_before, committed, stop)
    reasons = []
    if eos in committed:
        reasons.append(f"the stop token {eos} is committed token {committed.index(eos) + 1} of the round")
    last = max_tokens - emitted_before  # the round's token that would be the max_tokens-th new one
    reasons.append(f"the max_tokens-th new token is token {last} of the round" if last <= len(committed)
                   else f"max_tokens needs {last} tokens, more than the round commits")
    return Number(
        f"A request has emitted {emitted_before} new tokens; max_tokens = {max_tokens}, stop token id {eos}. A round "
        f"(gamma = {gamma}) commits {committed}. How many of these tokens are emitted?",
        len(emitted),
        f"Take the committed tokens in order and stop at the first that ends the request: {'; '.join(reasons)}. "
        + (f"The first stop is itself emitted and ends the request: {show(len(emitted))} tokens; nothing after it is "
           "streamed, and the caches roll back to what was emitted." if finished else
           f"Nothing ends the request in this round: all {show(len(emitted))} tokens are emitted."),
        unit="tokens", rel=0)


# -- 06 prompt lookup ----------------------------------------------------------------------------------------------


@number("lookup_match_start", topic="lookup", notebook="06_prompt_lookup", section="1. The latest earlier match")
def match_start(rng: random.Random) -> Number:
    while True:
        tokens = [rng.randrange(1, 6) for _ in range(rng.randrange(10, 17))]
        n_max, gamma = 3, rng.randrange(2, 5)
        used = next(((n, find_match(tokens, n)) for n in range(n_max, 0, -1) if find_match(tokens, n) >= 0), None)
        if used and used[1] > 0:
            break
    n, start = used
    proposal = propose_ngram(tokens, gamma, n_max, 1)
    return Number(
        f"Prompt lookup with n_max = {n_max}, n_min = 1, gamma = {gamma}, taking the latest earlier occurrence. Tokens "
        f"so far (positions 0..{len(tokens) - 1}): {tokens}. At which position does the match it proposes from start?",
        start,
        f"Try n = {n_max} down to 1; the first n whose suffix {tokens[-n:]} occurred earlier (starting before "
        f"{len(tokens) - n}) is n = {n}, latest at position {start}. The proposal is what followed it: {proposal}.",
        unit="", rel=0)


@number("lookup_correction_probability", topic="lookup", notebook="06_prompt_lookup",
        section="4. Verifying a proposal that has no probabilities")
def correction_probability(rng: random.Random) -> Number:
    p, _ = two_distributions(rng)
    y = rng.choice([i for i in range(len(p)) if p[i] < 0.9])
    x = rng.choice([i for i in range(len(p)) if i != y])
    one_hot = [1.0 if i == y else 0.0 for i in range(len(p))]
    r = residual_distribution(_t(p), _t(one_hot)).tolist()
    return Number(
        f"Prompt lookup proposed token {y}; the target's distribution at that position, at the request's temperature, "
        f"is p = {fmt_list(p)} (tokens 0..{len(p) - 1}). The proposal is rejected: with what probability is the "
        f"correction token {x}?",
        r[x],
        f"A lookup proposal is deterministic, so q is one-hot at {y}: accept with p({y}) = {p[y]:g}; the residual "
        f"max(p - onehot, 0) is p with token {y} removed, renormalised: {p[x]:g} / (1 - {p[y]:g}) = {show(r[x])}.")
