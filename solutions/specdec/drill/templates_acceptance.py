"""Drill templates of notebook 09: acceptance said three ways (alpha, the draft acceptance rate, tau), the
conversions between them, and the cost model with measured costs."""

from __future__ import annotations

import random

from specdec import metrics
from specdec.analysis import predicted_speedup
from specdec.drill.questions import Choice, Number, choice, number, show
from specdec.ledger import expected_tokens_per_round

NB = "09_benchmark"
ALPHA = "2. alpha, not the acceptance rate"


def _rounds(rng: random.Random, gamma: int, alpha: float, n: int) -> list[int]:
    """Accepted drafts per round under the i.i.d. model (at least one round ends by a rejection)."""
    while True:
        out = []
        for _ in range(n):
            k = 0
            while k < gamma and rng.random() < alpha:
                k += 1
            out.append(k)
        if any(k < gamma for k in out) and sum(out):
            return out


@number("acceptance_alpha_from_rounds", topic="acceptance", notebook=NB, section=ALPHA)
def alpha_from_rounds(rng: random.Random) -> Number:
    gamma = rng.randrange(3, 7)
    accepted = _rounds(rng, gamma, rng.uniform(0.6, 0.9), rng.randrange(8, 13))
    alpha = metrics.alpha_estimate(accepted, [gamma] * len(accepted))
    rejected = sum(k < gamma for k in accepted)
    return Number(
        f"gamma = {gamma}. Drafts accepted in each of {len(accepted)} rounds: {accepted}. Estimate the per-position "
        "acceptance alpha (maximum likelihood under the i.i.d. model).",
        alpha,
        f"A round that accepted k < gamma tested k + 1 positions, a full round gamma. A = {sum(accepted)} accepted "
        f"drafts, R = {rejected} rounds ended by a rejection: alpha = A / (A + R) = {sum(accepted)} / "
        f"{sum(accepted) + rejected} = {show(alpha)}. (accepted / proposed = {sum(accepted) / (gamma * len(accepted)):.3f} "
        "is the draft acceptance rate, not alpha.)")


@number("acceptance_alpha_from_totals", topic="acceptance", notebook=NB, section=ALPHA)
def alpha_from_totals(rng: random.Random) -> Number:
    gamma, rounds = rng.randrange(2, 9), rng.randrange(200, 5000)
    alpha_true = rng.uniform(0.55, 0.92)
    ended = round(rounds * (1 - alpha_true**gamma))
    accepted = round(rounds * (expected_tokens_per_round(alpha_true, gamma) - 1))
    alpha = metrics.alpha_from_counts(accepted, ended)
    return Number(
        f"A run with gamma = {gamma}: {rounds:,} rounds, {accepted:,} drafts accepted, and {ended:,} rounds ended by a "
        "rejection (the others accepted every draft). The maximum-likelihood alpha?",
        alpha,
        f"Each rejecting round tested one position it did not accept: alpha = A / (A + R) = {accepted:,} / "
        f"({accepted:,} + {ended:,}) = {show(alpha)}.")


@number("acceptance_rate_from_alpha", topic="acceptance", notebook=NB, section=ALPHA)
def rate_from_alpha(rng: random.Random) -> Number:
    alpha, gamma = round(rng.uniform(0.5, 0.95), 2), rng.randrange(2, 11)
    rate = metrics.rate_from_alpha(alpha, gamma)
    e = expected_tokens_per_round(alpha, gamma)
    return Number(
        f"alpha = {alpha} per position, gamma = {gamma}, positions accepted independently. What draft acceptance rate "
        "(accepted / proposed, as vLLM's dashboard shows it) do you expect?",
        rate,
        f"A round accepts alpha + ... + alpha^gamma = E - 1 drafts on average: E = {e:.4g}, so the rate is (E - 1) / "
        f"gamma = {e - 1:.4g} / {gamma} = {show(rate)}, below alpha, and falling as gamma grows.")


@number("acceptance_alpha_from_rate", topic="acceptance", notebook=NB, section=ALPHA)
def alpha_from_rate(rng: random.Random) -> Number:
    gamma = rng.randrange(2, 9)
    rate = round(rng.uniform(0.35, 0.85), 3)
    alpha = metrics.alpha_from_rate(rate, gamma)
    return Number(
        f"A dashboard shows a draft acceptance rate of {rate} at gamma = {gamma}. Under the i.i.d. model, what is "
        "alpha, the number E(alpha, gamma) takes?",
        alpha,
        f"rate = (alpha + ... + alpha^{gamma}) / {gamma}, increasing in alpha: solve by bisection, alpha = {show(alpha)} "
        f"(E = {expected_tokens_per_round(alpha, gamma):.4g}; feeding {rate} into E would predict "
        f"{expected_tokens_per_round(rate, gamma):.4g}).")


@number("acceptance_alpha_from_counters", topic="acceptance", notebook=NB, section=ALPHA)
def alpha_from_counters(rng: random.Random) -> Number:
    gamma, rounds = rng.randrange(2, 7), rng.randrange(500, 3000)
    accepted = round(rounds * gamma * rng.uniform(0.35, 0.8))
    tau = 1 + accepted / rounds
    alpha = metrics.alpha_from_tau(tau, gamma)
    return Number(
        f"A server's counters with K = {gamma}: {rounds:,} rounds, {rounds * gamma:,} drafts proposed, {accepted:,} "
        "accepted. Under the i.i.d. model, what is alpha?",
        alpha,
        f"tau = 1 + accepted / rounds = 1 + {accepted:,} / {rounds:,} = {tau:.4g} tokens per round (the draft acceptance "
        f"rate is {accepted / (rounds * gamma):.4g}). Solve E(alpha, {gamma}) = (1 - alpha^{gamma + 1}) / (1 - alpha) = "
        f"{tau:.4g}: alpha = {show(alpha)}.")


@number("acceptance_tau_from_rates", topic="acceptance", notebook="13_production",
        section="4. The knobs: a draft length per batch size")
def tau_from_rates(rng: random.Random) -> Number:
    k = rng.randrange(3, 7)
    rates = sorted((round(rng.uniform(0.2, 0.9), 2) for _ in range(k)), reverse=True)
    tau = 1 + sum(rates)
    return Number(
        f"vLLM's per-position acceptance_rates (accepted at position i over rounds; unconditional) for K = {k}: "
        f"{rates}. What is the mean acceptance length tau (tokens per round, the extra token included)?",
        tau,
        f"rates[i] is already the probability that a round's draft i + 1 survives, so the expected accepted drafts are "
        f"their sum, {sum(rates):.4g} (multiplying them again would double-count the earlier rejections); tau = 1 + "
        f"{sum(rates):.4g} = {show(tau)}.",
        unit="tokens")


@number("acceptance_predicted_speedup", topic="acceptance", notebook=NB, section="4. Prediction against measurement")
def measured_prediction(rng: random.Random) -> Number:
    alpha, gamma = round(rng.uniform(0.6, 0.95), 2), rng.randrange(2, 9)
    c, verify = round(rng.uniform(0.05, 0.3), 2), round(rng.uniform(1.0, 2.0), 2)
    s = predicted_speedup(alpha, gamma, c, verify)
    e = expected_tokens_per_round(alpha, gamma)
    return Number(
        f"Measured: alpha = {alpha}, gamma = {gamma}, a draft forward costs c = {c} target steps, and the verify forward "
        f"over gamma + 1 positions costs v = {verify} target steps. The cost model's speedup?",
        s,
        f"S = E / (gamma c + v) = {e:.4g} / ({gamma} x {c} + {verify}) = {e:.4g} / {gamma * c + verify:.4g} = "
        f"{show(s)}x.",
        unit="x")


@choice("acceptance_which_number", topic="acceptance", notebook=NB, section=ALPHA)
def which_number(rng: random.Random) -> Choice:
    while True:
        gamma, rounds = rng.randrange(3, 7), rng.randrange(400, 2000)
        alpha_true = rng.uniform(0.6, 0.9)
        ended = round(rounds * (1 - alpha_true**gamma))
        accepted = round(rounds * (expected_tokens_per_round(alpha_true, gamma) - 1))
        alpha = metrics.alpha_from_counts(accepted, ended)
        rate, tau = accepted / (rounds * gamma), 1 + accepted / rounds
        shown = {f"{x:.3f}" for x in (alpha, rate, tau, accepted / (accepted + rounds))}
        if len(shown) == 4:
            break
    return Choice(
        f"Counters of a run with gamma = {gamma}: {rounds:,} rounds, {accepted:,} drafts accepted, {ended:,} rounds "
        "ended by a rejection. Which number do you put into E(alpha, gamma) to choose gamma?",
        f"{alpha:.3f}",
        (f"{rate:.3f}", f"{tau:.3f}", f"{accepted / (accepted + rounds):.3f}"),
        f"alpha = A / (A + R) = {accepted:,} / {accepted + ended:,} = {alpha:.3f}. {rate:.3f} is the draft acceptance "
        f"rate (accepted / proposed), which counts untested positions as rejections and biases gamma down; {tau:.3f} "
        f"is tau, tokens per round; A / (A + rounds) treats full rounds as if they had ended by a rejection.")
