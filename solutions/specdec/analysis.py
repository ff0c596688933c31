"""Reading a benchmark (notebook 09): acceptance from per-round counts, measured costs, the
cost model's prediction and a per-round fixed cost fitted beside it, the best draft length from
measurements, and why logit processors (a repetition penalty here) must be applied per draft position."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.recording import RoundStats


def acceptance_from_rounds(accepted: Sequence[int], gamma: int) -> float:
    """Per-position acceptance a from the drafts accepted in each round of a chain.

    A round stops at its first rejection, so a round that accepted k < gamma drafts tested
    k + 1 positions, and one that accepted all gamma tested gamma. a = accepted / tested.
    """
    if gamma < 1 or not accepted or any(not 0 <= k <= gamma for k in accepted):
        raise ValueError(f"need gamma >= 1 and at least one round with 0 <= accepted <= gamma, got gamma={gamma}, "
                         f"accepted={list(accepted)[:10]}")
    ### BEGIN SOLUTION
    tested = sum(min(k + 1, gamma) for k in accepted)
    return sum(accepted) / tested
    ### END SOLUTION


def measured_costs(rounds: Sequence[RoundStats], target_step_s: float) -> tuple[float, float]:
    """(c, verify_ratio) from a speculative run's rounds and the target's one-token step time.

    c: the draft's seconds per proposed token over the target's step; verify_ratio: the
    target's mean seconds per verification forward (gamma + 1 positions) over its step.
    """
    if not rounds or target_step_s <= 0:
        raise ValueError("need at least one round and a positive target step time")
    ### BEGIN SOLUTION
    draft_per_token = sum(r.draft_s for r in rounds) / sum(r.proposed for r in rounds)
    verify = sum(r.target_s for r in rounds) / len(rounds)
    return draft_per_token / target_step_s, verify / target_step_s
    ### END SOLUTION


def predicted_speedup(a: float, gamma: int, c: float, verify_ratio: float = 1.0) -> float:
    """The cost model's speedup: expected tokens per round, E = (1 - a^(gamma + 1)) / (1 - a),
    over the round's cost in target steps, gamma * c (drafting) + verify_ratio (verifying)."""
    ### BEGIN SOLUTION
    tokens = gamma + 1 if a == 1 else (1 - a ** (gamma + 1)) / (1 - a)
    return tokens / (gamma * c + verify_ratio)
    ### END SOLUTION


def fit_round_costs(gammas: Sequence[int], round_s: Sequence[float], verify_s: Sequence[float]) -> tuple[float, float]:
    """(c0_s, per_draft_s): least-squares fit of a round's time beside its verification forward,
    round_s - verify_s = c0_s + gamma * per_draft_s, over runs at several gammas.

    c0_s is what a round pays whatever its gamma (the draft's catch-up forward, sampling the correction or bonus,
    verification and bookkeeping, Python); per_draft_s what each draft adds (a draft forward and sampling it)."""
    if len(gammas) != len(round_s) or len(gammas) != len(verify_s) or len(set(gammas)) < 2:
        raise ValueError("need one round time and one verify time per gamma, at two gammas or more")
    rest = [r - v for r, v in zip(round_s, verify_s)]
    g_mean, r_mean = sum(gammas) / len(gammas), sum(rest) / len(rest)
    slope = (sum((g - g_mean) * (r - r_mean) for g, r in zip(gammas, rest))
             / sum((g - g_mean) ** 2 for g in gammas))
    return r_mean - slope * g_mean, slope


def best_measured_gamma(rows: Sequence[dict], task: str, proposer: str) -> int:
    """The gamma with the highest measured tokens_per_s among rows of this task and proposer
    (the smaller gamma on a tie: it wastes less when acceptance drops)."""
    ### BEGIN SOLUTION
    candidates = [r for r in rows if r["task"] == task and r["proposer"] == proposer]
    if not candidates:
        raise ValueError(f"no measurements for task {task!r} and proposer {proposer!r}")
    return max(candidates, key=lambda r: (r["tokens_per_s"], -r["gamma"]))["gamma"]
    ### END SOLUTION


def repetition_penalty(logits: torch.Tensor, seen: Sequence[int], penalty: float) -> torch.Tensor:
    """(V,) logits with a repetition penalty on every token in ``seen``, in the form of Hugging Face's
    RepetitionPenaltyLogitsProcessor (after CTRL, Keskar et al. 2019): a positive logit is divided
    by ``penalty``, a negative one multiplied."""
    out = logits.clone()
    index = torch.tensor(sorted(set(seen)), dtype=torch.long)
    if index.numel():
        chosen = out[index]
        out[index] = torch.where(chosen > 0, chosen / penalty, chosen * penalty)
    return out


def penalised_verify_probs(logits: torch.Tensor, context: Sequence[int], drafts: Sequence[int], penalty: float,
                           temperature: float, per_position: bool = True) -> torch.Tensor:
    """The target's p for a verify forward's gamma + 1 rows (logits (gamma + 1, V)) under a repetition
    penalty, float64. Row i scores the token after context + drafts[:i], so its penalty must count
    those drafts too (``per_position``); with ``per_position=False`` every row is penalised by the
    committed context alone, as a processor applied once per round would do (wrong from row 1 on)."""
    rows = []
    for i in range(logits.shape[0]):
        seen = list(context) + (list(drafts[:i]) if per_position else [])
        rows.append(torch.softmax(repetition_penalty(logits[i].double(), seen, penalty) / temperature, -1))
    return torch.stack(rows)
