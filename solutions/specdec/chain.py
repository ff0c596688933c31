"""Notebook 04, verifying a whole chain of drafts: exact speculative sampling of a round.

Reference solutions of the exercises in ``grader/source/04_chain_verify``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specdec.greedy import PAD, greedy_verify
from specdec.models.devices import on_device
from specdec.models.toy import ToyLM
from specdec.params import SamplingParams
from specdec.rejection import residual_distribution
from specdec.sampling import probs_from_logits, sample_from_weights
from specdec.validate import (
    check_distribution,
    check_nonnegative_real,
    check_positive_int,
    check_positive_real,
    check_probability,
    check_tensor,
    check_token_ids,
)


def check_chain(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, batched: bool) -> None:
    ndim = 3 if batched else 2
    check_tensor(draft, "draft", ndim - 1, floating=False)
    gamma = draft.shape[-1]
    if gamma < 1:
        raise ValueError("gamma must be >= 1: there is nothing to verify")
    check_distribution(p, "p", ndim)
    check_distribution(q, "q", ndim)
    check_token_ids(draft, "draft", p.shape[-1], ndim - 1)
    lead = tuple(draft.shape[:-1])
    if tuple(q.shape) != (*lead, gamma, p.shape[-1]) or tuple(p.shape[:-1]) != (*lead, gamma + 1):
        raise ValueError(
            f"for draft of shape {tuple(draft.shape)}, q must be {(*lead, gamma, 'V')} and p {(*lead, gamma + 1, 'V')}; "
            f"got q {tuple(q.shape)}, p {tuple(p.shape)}"
        )
    q_draft = q.gather(-1, draft.unsqueeze(-1))
    if (q_draft <= 0).any():
        raise ValueError("q gives probability 0 to a draft token: q is not the distribution the draft sampled from")


def verify_chain(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Verify gamma drafts left to right; returns the committed tokens (k + 1,).

    p: (gamma + 1, V) target distributions, p[i] for the token after prefix + draft[:i].
    q: (gamma, V) the draft distributions the drafts were sampled from. draft: (gamma,).
    Accept draft[i] when u < p[i](draft[i]) / q[i](draft[i]); at the first rejection,
    commit a token from the residual of p[i] and q[i] and stop; if every draft passes,
    commit a bonus token sampled from p[gamma].
    """
    check_chain(p, q, draft, batched=False)
    ### BEGIN SOLUTION
    gamma = draft.shape[0]
    committed = []
    for i in range(gamma):
        y = int(draft[i])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if u * float(q[i, y]) < float(p[i, y]):
            committed.append(y)
            continue
        correction = torch.multinomial(residual_distribution(p[i], q[i]), 1, generator=generator)
        return torch.tensor(committed + [int(correction)], dtype=torch.long)
    bonus = torch.multinomial(p[gamma].to(torch.float64), 1, generator=generator)
    return torch.tensor(committed + [int(bonus)], dtype=torch.long)
    ### END SOLUTION


def verify_drafts(drafts: list[int], q: torch.Tensor, logits: torch.Tensor, params: SamplingParams,
                  generator: torch.Generator | None = None) -> list[int]:
    """One round's committed tokens at the request's settings: greedy_verify (notebook 02) at temperature 0,
    verify_chain otherwise. ``drafts``: the gamma proposals; ``q``: (gamma, V), what each was drawn from;
    ``logits``: (gamma + 1, V), the target's at the last committed token and at each draft. Runs where the logits
    are (on a GPU: ``generator`` must be there too), the verifiers' own draws included."""
    if not drafts:  # nothing proposed (a proposer with no match): the round is one plain decoding step
        return [int(torch.multinomial(params.probs(logits[0]), 1, generator=generator))]
    tokens = torch.tensor(drafts, dtype=torch.long, device=logits.device)
    if params.temperature == 0:
        return greedy_verify(tokens, logits).tolist()
    with on_device(logits.device):  # verify_chain (notebook 04) draws its uniforms with no device named
        return verify_chain(params.probs(logits), q.to(logits.device), tokens, generator).tolist()


def expected_committed_length(accept_probs: Sequence[float]) -> float:
    """Expected tokens committed per round when draft i is accepted with probability
    a_i given drafts 1..i-1 were: E = 1 + sum_i prod_{j <= i} a_j."""
    for i, a in enumerate(accept_probs):
        check_probability(a, f"accept_probs[{i}]")
    ### BEGIN SOLUTION
    expected, survive = 1.0, 1.0
    for a in accept_probs:
        survive *= a
        expected += survive
    return expected
    ### END SOLUTION


def best_gamma_measured(accept_probs: Sequence[float], draft_step_s: float, verify_s: Sequence[float]) -> int:
    """The draft length with the highest throughput, from measurements.

    accept_probs[i]: measured acceptance of draft i + 1 (given the earlier ones passed).
    draft_step_s: time of one draft step. verify_s[g - 1]: time of one target forward
    over g + 1 positions, for g = 1..len(verify_s). Throughput at gamma = g is
    E(accept_probs[:g]) / (g * draft_step_s + verify_s[g - 1]). Ties: the smallest g.
    """
    check_nonnegative_real(draft_step_s, "draft_step_s")
    for i, t in enumerate(verify_s):
        check_positive_real(t, f"verify_s[{i}]")
    if not 1 <= len(verify_s) <= len(accept_probs):
        raise ValueError(f"need 1 <= len(verify_s) <= len(accept_probs), got {len(verify_s)} and {len(accept_probs)}")
    ### BEGIN SOLUTION
    def throughput(g: int) -> float:
        return expected_committed_length(accept_probs[:g]) / (g * draft_step_s + verify_s[g - 1])

    return max(range(1, len(verify_s) + 1), key=lambda g: (throughput(g), -g))
    ### END SOLUTION


def verify_chain_batched(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """verify_chain for B sequences at once, with no Python loop over rows or positions.

    p: (B, gamma + 1, V); q: (B, gamma, V); draft: (B, gamma). Returns tokens
    (B, gamma + 1), each row its committed tokens then PAD, and n_committed (B,).
    """
    check_chain(p, q, draft, batched=True)
    ### BEGIN SOLUTION
    draft = draft.long()  # any integer ids in; long token ids out
    B, gamma = draft.shape
    p, q = p.to(torch.float64), q.to(torch.float64)
    p_draft = p[:, :gamma].gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # (B, gamma)
    q_draft = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # (B, gamma)
    u = torch.rand(B, gamma, generator=generator, dtype=torch.float64)
    n_accepted = (u * q_draft < p_draft).long().cumprod(1).sum(1)  # (B,)
    rows = torch.arange(B)
    # The extra token comes from the residual at the first rejection, or from p[gamma] after a
    # full acceptance (there q counts as 0, so the "residual" is p[gamma] itself).
    p_at = p[rows, n_accepted]  # (B, V)
    q_at = q[rows, n_accepted.clamp(max=gamma - 1)] * (n_accepted < gamma)[:, None]  # (B, V)
    excess = (p_at - q_at).clamp_min(0)  # the residual, unnormalised
    weights = torch.where(excess.sum(-1, keepdim=True) > 0, excess, p_at)  # p == q: nothing to correct, use p
    extra = sample_from_weights(weights, generator)  # (B,)
    positions = torch.arange(gamma + 1)
    padded_draft = torch.cat([draft, torch.full_like(draft[:, :1], PAD)], dim=1)  # (B, gamma + 1)
    tokens = torch.where(positions < n_accepted[:, None], padded_draft, torch.full_like(padded_draft, PAD))
    tokens[rows, n_accepted] = extra
    return tokens, n_accepted + 1
    ### END SOLUTION


def speculative_round(
    target: ToyLM, draft: ToyLM, context: torch.Tensor, gamma: int, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    """One full round at a temperature: propose gamma tokens with the draft, score them
    with one target call, verify. Returns the committed tokens (k + 1,).

    The q handed to the verifier must be the distribution each draft token was really
    drawn from, and p must use the same temperature: at temperature 0 both are one-hot
    at the argmax (then this is greedy decoding).
    """
    check_positive_int(gamma, "gamma")
    check_nonnegative_real(temperature, "temperature")
    ### BEGIN SOLUTION
    proposal, q_rows = context.clone(), []
    for _ in range(gamma):
        q_i = probs_from_logits(draft.next_logits(proposal), temperature)  # (V,)
        y = torch.multinomial(q_i, 1, generator=generator)
        proposal = torch.cat([proposal, y])
        q_rows.append(q_i)
    p = probs_from_logits(target.logits(proposal)[-(gamma + 1) :], temperature)  # (gamma + 1, V)
    return verify_chain(p, torch.stack(q_rows), proposal[len(context) :], generator)
    ### END SOLUTION


# --- Course machinery (not exercises) ---


def outcome_distribution(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> dict[tuple[int, ...], float]:
    """Exact distribution of verify_chain's output for a fixed draft: committed tuple -> probability."""
    check_chain(p, q, draft, batched=False)
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma = draft.shape[0]
    out: dict[tuple[int, ...], float] = {}
    survive = 1.0
    for i in range(gamma + 1):
        prefix = tuple(int(t) for t in draft[:i])
        if i == gamma:
            extra = p[gamma]
        else:
            y = int(draft[i])
            alpha = min(1.0, float(p[i, y]) / float(q[i, y]))
            extra = residual_distribution(p[i], q[i]) * (1 - alpha)
        for x, prob in enumerate(extra.tolist()):
            if survive * prob > 0:
                out[(*prefix, x)] = out.get((*prefix, x), 0.0) + survive * prob
        if i < gamma:
            survive *= alpha
    return out


def round_outcome_distribution(
    target: ToyLM, draft: ToyLM, context: torch.Tensor, gamma: int, temperature: float
) -> dict[tuple[int, ...], float]:
    """Exact distribution of one speculative round's committed tokens, enumerating every draft."""
    V = target.vocab_size
    result: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], q_rows: list[torch.Tensor], prob: float) -> None:
        proposal = torch.cat([context, torch.tensor(prefix, dtype=torch.long)])
        if len(prefix) == gamma:
            p = probs_from_logits(target.logits(proposal)[-(gamma + 1) :], temperature)
            for seq, prob_out in outcome_distribution(p, torch.stack(q_rows), torch.tensor(prefix)).items():
                result[seq] = result.get(seq, 0.0) + prob * prob_out
            return
        q_i = probs_from_logits(draft.next_logits(proposal), temperature)
        for y in range(V):
            if q_i[y] > 0:
                walk((*prefix, y), [*q_rows, q_i], prob * float(q_i[y]))

    walk((), [], 1.0)
    return result


def round_sequence_distribution(
    target: ToyLM, draft: ToyLM, context: torch.Tensor, gamma: int, temperature: float
) -> dict[tuple[int, ...], float]:
    """Exact distribution of one round's output extended to gamma + 1 tokens.

    Each committed sequence (k + 1 tokens) is extended by sampling the rest from the
    target one token at a time, so the result can be compared with the target's own
    joint distribution of gamma + 1 tokens (:func:`target_sequence_distribution`).
    """
    result: dict[tuple[int, ...], float] = {}
    for committed, prob in round_outcome_distribution(target, draft, context, gamma, temperature).items():
        start = torch.cat([context, torch.tensor(committed, dtype=torch.long)])
        rest = target_sequence_distribution(target, start, gamma + 1 - len(committed), temperature)
        for tail, prob_tail in rest.items():
            result[committed + tail] = result.get(committed + tail, 0.0) + prob * prob_tail
    return result


def target_sequence_distribution(
    target: ToyLM, context: torch.Tensor, n_tokens: int, temperature: float
) -> dict[tuple[int, ...], float]:
    """Exact joint distribution of the target's next n_tokens, sampled one by one."""
    result: dict[tuple[int, ...], float] = {}

    def walk(seq: tuple[int, ...], prob: float) -> None:
        if len(seq) == n_tokens:
            result[seq] = prob
            return
        p = probs_from_logits(target.next_logits(torch.cat([context, torch.tensor(seq, dtype=torch.long)])), temperature)
        for x in range(target.vocab_size):
            if p[x] > 0:
                walk((*seq, x), prob * float(p[x]))

    walk((), 1.0)
    return result


def total_variation(a: dict, b: dict) -> float:
    """TV distance between two distributions given as dicts."""
    return 0.5 * math.fsum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
