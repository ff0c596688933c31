"""Notebook 14, block verification: decide how much of the drafted block to keep jointly, not token by token.

Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification Accelerates Speculative Decoding"
(ICLR 2025, arXiv 2403.10444). Token-wise verification (notebook 04) stops at the first draft whose coin fails,
even when the tokens after it would have made up for it. Block verification reads the same p and q (on the drafted
path only, so no extra forward) and keeps the longest prefix it may:

    w_0 = 1,  w_i = min(w_{i-1} * p_i(x_i) / q_i(x_i), 1)              the prefix's remaining "weight"
    h_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0) / (that sum + 1 - w_i)   for i < gamma,   h_gamma = w_gamma

with p_i, q_i the target and draft distributions for position i (p_{gamma+1} the bonus position). Draw one uniform
per position; tau = the largest i with u_i < h_i (0 if none). Commit x_1..x_tau and then one token: from
p_{gamma+1} when tau = gamma, else from the residual max(w_tau p_{tau+1} - q_{tau+1}, 0), normalised.

Exact in distribution (as token-wise is), never fewer tokens in expectation, and optimal among verifiers that
see only the drafted path's p and q (the paper's theorems). Its two-token example (p = (1/3, 2/3) and q = (2/3,
1/3) at every position, gamma = 2) gives 10/9 accepted tokens token-wise and 11/9 by block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.chain import check_chain


def block_weights(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefix weights w_1..w_gamma and the keep probabilities h_1..h_gamma of a drafted block, float64.

    p: (gamma + 1, V) target distributions along the draft; q: (gamma, V) the draft's; draft: (gamma,) token ids
    (any integer dtype). Returns (w, h), each (gamma,), float64 whatever the inputs' dtype. Where w_i = 1 (nothing of
    the prefix lost) h_i is 1. p, q and draft are left as they are.
    """
    check_chain(p, q, draft, batched=False)
    ### BEGIN SOLUTION
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma = draft.shape[0]
    w, h, weight = [], [], 1.0
    for i in range(gamma):
        x = int(draft[i])
        weight = min(weight * float(p[i, x]) / float(q[i, x]), 1.0)
        w.append(weight)
        if i == gamma - 1:
            h.append(weight)
        else:
            excess = float((weight * p[i + 1] - q[i + 1]).clamp_min(0).sum())
            h.append(1.0 if weight >= 1.0 else excess / (excess + 1.0 - weight))
    return torch.tensor(w, dtype=torch.float64), torch.tensor(h, dtype=torch.float64)
    ### END SOLUTION


def block_residual(p_next: torch.Tensor, q_next: torch.Tensor, weight: float) -> torch.Tensor:
    """Where the token after a kept prefix of weight ``weight`` comes from: max(weight * p - q, 0), normalised
    (float64). With nothing left (weight * p <= q everywhere) it is never used; p is returned."""
    excess = (weight * p_next.to(torch.float64) - q_next.to(torch.float64)).clamp_min(0)
    total = excess.sum()
    return excess / total if total > 0 else p_next.to(torch.float64)


def block_verify(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Block verification of one round; returns the committed tokens (tau + 1,), as verify_chain does.

    p: (gamma + 1, V); q: (gamma, V); draft: (gamma,) token ids of any integer dtype; the result is int64 (long)
    whatever the draft's dtype, and p, q and draft are left as they are. One uniform per draft position and then one
    token from the residual or the bonus distribution, all drawn from ``generator`` (nothing from the global
    generator), so the same seed gives the same output; with ``generator=None`` every draw comes from torch's global
    generator (what torch.rand(..., generator=None) does), so torch.manual_seed makes it reproducible. Keep position
    i when u_i < h_i, strictly (a uniform can be exactly 0).
    """
    w, h = block_weights(p, q, draft)
    ### BEGIN SOLUTION
    gamma = draft.shape[0]
    u = torch.rand(gamma, generator=generator, dtype=torch.float64)
    kept = [i + 1 for i in range(gamma) if u[i] < h[i]]  # strict: h_i = 0 never keeps, h_i = 1 always does
    tau = kept[-1] if kept else 0
    if tau == gamma:
        last = torch.multinomial(p[gamma].to(torch.float64), 1, generator=generator)
    else:
        weight = float(w[tau - 1]) if tau else 1.0
        last = torch.multinomial(block_residual(p[tau], q[tau], weight), 1, generator=generator)
    return torch.cat([draft[:tau].to(torch.long), last.to(torch.long)])
    ### END SOLUTION


Dist = Callable[[tuple[int, ...]], torch.Tensor]  # a model: prefix -> (V,) next-token distribution


def _along(target: Dist, draft_model: Dist, prefix: tuple[int, ...], drafts: tuple[int, ...]):
    """p (gamma + 1, V) and q (gamma, V) along ``drafts`` after ``prefix``."""
    paths = [prefix + drafts[:i] for i in range(len(drafts) + 1)]
    return torch.stack([target(path) for path in paths]), torch.stack([draft_model(path) for path in paths[:-1]])


def block_outcomes(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> dict[tuple[int, ...], float]:
    """Every output block verification can commit for this drafted block, with its exact probability: tau = t
    when u_t < h_t and u_i >= h_i for every later i, then the last token's law."""
    w, h = block_weights(p, q, draft)
    gamma, drafts = draft.shape[0], tuple(int(x) for x in draft)
    out: dict[tuple[int, ...], float] = {}
    for tau in range(gamma + 1):
        law = (float(h[tau - 1]) if tau else 1.0) * float(torch.prod(1 - h[tau:]))
        last = p[gamma].to(torch.float64) if tau == gamma else block_residual(p[tau], q[tau], float(w[tau - 1]) if tau else 1.0)
        for y in range(p.shape[-1]):
            if law * float(last[y]) > 0:
                out[drafts[:tau] + (y,)] = law * float(last[y])
    return out


def round_outcomes(target: Dist, draft_model: Dist, prefix: tuple[int, ...], gamma: int,
                   verifier: str = "block") -> dict[tuple[int, ...], float]:
    """Every possible output of one round after ``prefix`` and its exact probability: the drafts enumerated (V^gamma
    blocks drawn from ``draft_model``), then the verifier's coins ("block": tau's law from h; "token": notebook
    04's accept-until-the-first-rejection) and its last token. Small V and gamma only."""
    from itertools import product

    V = target(prefix).shape[0]
    out: dict[tuple[int, ...], float] = {}

    def add(tokens: tuple[int, ...], mass: float) -> None:
        if mass > 0:
            out[tokens] = out.get(tokens, 0.0) + mass

    for drafts in product(range(V), repeat=gamma):
        p, q = _along(target, draft_model, prefix, drafts)
        chance = float(torch.prod(q.to(torch.float64)[torch.arange(gamma), list(drafts)]))
        if chance == 0:
            continue
        if verifier == "block":
            for tokens, mass in block_outcomes(p, q, torch.tensor(drafts)).items():
                add(tokens, chance * mass)
        elif verifier == "token":
            reach = chance
            for i in range(gamma):
                keep = min(1.0, float(p[i, drafts[i]]) / float(q[i, drafts[i]]))
                residual = (p[i].to(torch.float64) - q[i].to(torch.float64)).clamp_min(0)
                if residual.sum() > 0:
                    for y in range(V):
                        add(drafts[:i] + (y,), reach * (1 - keep) * float(residual[y] / residual.sum()))
                reach *= keep
            for y in range(V):
                add(drafts + (y,), reach * float(p[gamma, y]))
        else:
            raise ValueError(f'verifier must be "block" or "token", got {verifier!r}')
    return out


def expected_accepted(outcomes: dict[tuple[int, ...], float]) -> float:
    """Mean accepted drafts per round (tokens committed minus the one every round adds)."""
    return sum(mass * (len(tokens) - 1) for tokens, mass in outcomes.items())


def sequence_law(target: Dist, draft_model: Dist, length: int, gamma: int, verifier: str = "block",
                 prefix: tuple[int, ...] = ()) -> dict[tuple[int, ...], float]:
    """The exact law of the first ``length`` tokens that rounds of speculative decoding emit after ``prefix``
    (rounds repeated, each output cut at ``length``): equal to the target's own law when the verifier is exact."""
    if length <= 0:
        return {(): 1.0}
    law: dict[tuple[int, ...], float] = {}
    for tokens, mass in round_outcomes(target, draft_model, prefix, gamma, verifier).items():
        head = tokens[:length]
        rest = sequence_law(target, draft_model, length - len(head), gamma, verifier, prefix + head)
        for tail, m in rest.items():
            law[head + tail] = law.get(head + tail, 0.0) + mass * m
    return law


def constant_model(probs: Sequence[float]) -> Dist:
    """A model whose next-token distribution is ``probs`` after every prefix (float64), as in the paper's example."""
    distribution = torch.tensor(probs, dtype=torch.float64)
    return lambda prefix: distribution


def random_models(vocab: int, seed: int, concentration: float = 0.5) -> tuple[Dist, Dist]:
    """A target and a draft whose next-token distributions depend on the whole prefix, drawn lazily from a seeded
    generator (float64; a small ``concentration`` skews them), for the enumerations above."""
    generator = torch.Generator().manual_seed(seed)

    def model() -> Dist:
        table: dict[tuple[int, ...], torch.Tensor] = {}

        def next_token(prefix: tuple[int, ...]) -> torch.Tensor:
            if prefix not in table:
                weights = torch.rand(vocab, generator=generator, dtype=torch.float64) ** (1 / concentration)
                table[prefix] = weights / weights.sum()
            return table[prefix]
        return next_token

    return model(), model()


def target_law(target: Dist, length: int, prefix: tuple[int, ...] = ()) -> dict[tuple[int, ...], float]:
    """The target's own law of its next ``length`` tokens after ``prefix``."""
    if length <= 0:
        return {(): 1.0}
    p = target(prefix).to(torch.float64)
    return {(y,) + tail: float(p[y]) * m for y in range(p.shape[0]) if p[y] > 0
            for tail, m in target_law(target, length - 1, prefix + (y,)).items()}
