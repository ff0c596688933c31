"""Known-wrong answers to the exercises of notebook 09 (reading a benchmark)."""

from __future__ import annotations

from specdec.mistakes import Mistake


def _naive(accepted, gamma):
    return sum(accepted) / (gamma * len(accepted))


def _plus_one(accepted, gamma):
    return sum(accepted) / sum(k + 1 for k in accepted)


def _mean_ratio(accepted, gamma):
    return sum(min(1.0, k / max(1, min(k + 1, gamma))) for k in accepted) / len(accepted)


def _rate_is_alpha(rate, gamma):
    return rate


def _bisect(rate_of, rate):
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate_of(mid) < rate else (lo, mid)
    return (lo + hi) / 2


def _bonus_counted(rate, gamma):
    return _bisect(lambda a: sum(a**i for i in range(gamma + 1)) / gamma, rate)


def _all_gamma_accepted(rate, gamma):
    return rate ** (1 / gamma)


def _over_gamma_plus_one(rate, gamma):
    return _bisect(lambda a: sum(a**i for i in range(1, gamma + 1)) / (gamma + 1), rate)


def _c_per_round(rounds, step):
    return sum(r.draft_s for r in rounds) / len(rounds) / step, sum(r.target_s for r in rounds) / len(rounds) / step


def _inverted(rounds, step):
    c = sum(r.draft_s for r in rounds) / sum(r.proposed for r in rounds) / step
    return c, step / (sum(r.target_s for r in rounds) / len(rounds))


def _verify_per_position(rounds, step):
    c = sum(r.draft_s for r in rounds) / sum(r.proposed for r in rounds) / step
    return c, sum(r.target_s / (r.proposed + 1) for r in rounds) / len(rounds) / step


def _no_bonus(a, gamma, c, verify_ratio=1.0):
    tokens = gamma if a == 1 else a * (1 - a**gamma) / (1 - a)
    return tokens / (gamma * c + verify_ratio)


def _plain_cost(a, gamma, c, verify_ratio=1.0):
    tokens = gamma + 1 if a == 1 else (1 - a ** (gamma + 1)) / (1 - a)
    return tokens / (1 + gamma * c)


def _no_special_case(a, gamma, c, verify_ratio=1.0):
    return (1 - a ** (gamma + 1)) / (1 - a) / (gamma * c + verify_ratio)


def _tie_larger(rows, task, proposer):
    mine = [r for r in rows if r["task"] == task and r["proposer"] == proposer]
    return max(mine, key=lambda r: (r["tokens_per_s"], r["gamma"]))["gamma"]


def _any_proposer(rows, task, proposer):
    mine = [r for r in rows if r["task"] == task]
    return max(mine, key=lambda r: (r["tokens_per_s"], -r["gamma"]))["gamma"]


def _any_task(rows, task, proposer):
    mine = [r for r in rows if r["proposer"] == proposer]
    return max(mine, key=lambda r: (r["tokens_per_s"], -r["gamma"]))["gamma"]


MISTAKES = [
    Mistake("acceptance_from_rounds", "divides_by_gamma_per_round", _naive,
            "you returned accepted / proposed, the draft acceptance rate (vLLM's draft_acceptance_rate), not alpha: a "
            "round that rejected at position k + 1 never tested the positions after it, so divide by the positions "
            "tested, min(k + 1, gamma) per round, not gamma per round"),
    Mistake("acceptance_from_rounds", "k_plus_one_always", _plus_one,
            "a round that accepted all gamma drafts tested gamma positions, not gamma + 1: use min(k + 1, gamma)"),
    Mistake("acceptance_from_rounds", "mean_of_ratios", _mean_ratio,
            "pool the counts (total accepted / total tested) instead of averaging per-round ratios"),
    Mistake("alpha_from_rate", "rate_is_alpha", _rate_is_alpha,
            "you returned the rate itself: accepted / proposed counts the drafts after a round's first rejection as "
            "rejected although nobody tested them, so at gamma > 1 it is below alpha; solve "
            "(alpha + ... + alpha^gamma) / gamma = rate for alpha"),
    Mistake("alpha_from_rate", "bonus_counted", _bonus_counted,
            "the rate counts drafts only: a round accepts alpha + ... + alpha^gamma drafts on average (E - 1), the "
            "correction or bonus token is not a draft"),
    Mistake("alpha_from_rate", "all_gamma_accepted", _all_gamma_accepted,
            "the rate is the mean of alpha, alpha^2, ..., alpha^gamma over the gamma positions, not alpha^gamma (the "
            "chance that all gamma drafts pass)"),
    Mistake("alpha_from_rate", "over_gamma_plus_one", _over_gamma_plus_one,
            "divide the accepted drafts by the gamma drafts proposed, not by gamma + 1"),
    Mistake("measured_costs", "c_per_round", _c_per_round,
            "c is per drafted token: divide the draft's total seconds by the total drafts proposed, not by the rounds"),
    Mistake("measured_costs", "verify_ratio_inverted", _inverted,
            "verify_ratio is the verification forward's time over the target step (usually >= 1), not the inverse"),
    Mistake("measured_costs", "verify_per_position", _verify_per_position,
            "verify_ratio compares one whole verification forward with one target step: do not divide by positions"),
    Mistake("predicted_speedup", "no_bonus", _no_bonus,
            "a round always commits one token from the target (correction or bonus): E = (1 - a^(gamma + 1)) / (1 - a)"),
    Mistake("predicted_speedup", "ignores_verify_ratio", _plain_cost,
            "the round costs gamma * c + verify_ratio target steps: use verify_ratio instead of 1"),
    Mistake("predicted_speedup", "no_a_equal_1_case", _no_special_case,
            "at a = 1 the formula divides by zero: every draft is accepted, so E = gamma + 1"),
    Mistake("best_measured_gamma", "ties_to_larger_gamma", _tie_larger,
            "on a tie pick the smaller gamma"),
    Mistake("best_measured_gamma", "ignores_proposer", _any_proposer,
            "keep only the rows of the requested proposer (and task) before taking the best"),
    Mistake("best_measured_gamma", "ignores_task", _any_task,
            "keep only the rows of the requested task (and proposer) before taking the best"),
]
