"""Hidden-test checks for notebook 04 (verifying a whole chain)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import torch

from specdec import chain
from specdec.checks.core import (
    CheckFailure,
    call,
    compare_cases,
    expect_no_loop_over,
    expect_reproducible,
    single_threaded,
    uniforms_at_zero,
    uniforms_just_below_one,
    upstream_note,
)
from specdec.checks.greedy import CountingLM
from specdec.checks.seeds import salted
from specdec.checks.stats import compare_frequencies
from specdec.greedy import PAD
from specdec.mistakes import for_exercise
from specdec.models.toy import ToyLM

_SEED = 4


def _scenarios() -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(description, p (gamma + 1, V), q (gamma, V), draft (gamma,)) with diffuse p, so that
    argmax bonuses, fallbacks drawn from p and continuing after a rejection all show."""
    g = torch.Generator().manual_seed(_SEED)  # a fixture: its power was measured
    d = torch.float64
    out = []
    for i, (V, gamma) in enumerate([(4, 3), (3, 2), (5, 1)]):
        p = torch.softmax(torch.randn(gamma + 1, V, generator=g, dtype=d), -1)
        q = torch.softmax(torch.randn(gamma, V, generator=g, dtype=d), -1)
        draft = torch.multinomial(q, 1, generator=g).squeeze(-1)
        out.append((f"scenario {i} (V={V}, gamma={gamma})", p, q, draft))
    V, gamma = 4, 3  # the target agrees with the draft: everything is accepted, then a bonus
    q = torch.softmax(torch.randn(gamma, V, generator=g, dtype=d), -1)
    p = torch.cat([q, torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=d)])
    out.append(("p == q at every draft position", p, q, torch.tensor([0, 1, 2])))
    p = torch.softmax(torch.randn(gamma + 1, V, generator=g, dtype=d), -1)
    p[1] = torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=d)  # draft[1] = 1 is always rejected
    out.append(("the target gives draft[1] probability 0", p, q, torch.tensor([0, 1, 2])))
    return out


def _describe(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> str:
    rows = lambda t: "[" + ", ".join("[" + ", ".join(f"{x:.3f}" for x in r) + "]" for r in t.tolist()) + "]"  # noqa: E731
    return f"draft={draft.tolist()}, p={rows(p)}, q={rows(q)}"


@single_threaded
def check_verify_chain(fn: Callable, n: int = 3000) -> None:
    """Seeded Monte Carlo of the committed tuple against its exact distribution, per scenario."""
    for desc, p, q, draft in _scenarios():
        label = f"verify_chain({desc}; {_describe(p, q, draft)})"
        g = torch.Generator().manual_seed(salted(_SEED))
        outputs = []
        for _ in range(n):
            got = call(fn, label, p, q, draft, g)
            if not isinstance(got, torch.Tensor) or got.ndim != 1 or not 1 <= len(got) <= len(draft) + 1:
                raise CheckFailure(f"{label}: return a 1-D tensor of 1 to gamma + 1 committed tokens, got {got!r}")
            if got.dtype != torch.long:
                raise CheckFailure(f"{label}: return a long (int64) tensor of token ids, got {got.dtype}")
            outputs.append(tuple(int(t) for t in got))
        compare_frequencies(outputs, chain.outcome_distribution(p, q, draft), label, hint=_sampler_hint("verify_chain"))
    _check_edges(fn, batched=False)
    desc, p, q, draft = _scenarios()[0]
    label = f"verify_chain({desc}, draft as int32: token ids of any integer dtype; the result is long)"
    got = call(fn, label, p, q, draft.int(), torch.Generator().manual_seed(salted(0)))
    if not isinstance(got, torch.Tensor) or got.dtype != torch.long:
        raise CheckFailure(f"{label}: return a long (int64) tensor whatever the draft's dtype, got "
                           f"{getattr(got, 'dtype', type(got).__name__)}")
    p, q, draft, _ = _batch(1, 4, V=40)
    expect_reproducible(fn, "verify_chain(gamma=4, V=40, generator)",
                        lambda seed: (p[0], q[0], draft[0], torch.Generator().manual_seed(salted(seed))), seeds=range(5))


def _edge_cases() -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, list[int], str]]:
    """(description, p, q, draft, the committed tokens every run must give, uniforms: "zero", "top" or "free"):
    deterministic rounds. With every uniform exactly 0 (a draw U[0, 1) allows), a draft of probability 0 must still be
    rejected (u < p/q is false); with every uniform 1 - 2**-53 (the largest float64 below 1), a ratio of 1 - 2e-10
    must be rejected, which a float32 uniform or ratio does not; a residual of mass 1e-7 or 1e-10 is a distribution
    to sample from, not a zero to replace by p."""
    d = torch.float64
    one_hot0 = torch.tensor([[1.0, 0.0, 0.0]], dtype=d)
    near = torch.tensor([[0.5 + 1e-10, 0.5 - 1e-10, 0.0]], dtype=d)
    return [
        ("every uniform exactly 0; draft [1] has p = 0 (p[0] = [1, 0, 0], q[0] = [0.5, 0.5, 0])",
         torch.cat([one_hot0, one_hot0]), torch.tensor([[0.5, 0.5, 0.0]], dtype=d), torch.tensor([1]), [0], "zero"),
        ("a residual of mass 1e-7: p[0] = [0.5, 0.5, 0], q[0] = [0.5, 0.5 - 1e-7, 1e-7], draft [2] (p = 0)",
         torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=d), torch.tensor([[0.5, 0.5 - 1e-7, 1e-7]], dtype=d),
         torch.tensor([2]), [1], "free"),
        ("every uniform 1 - 2**-53, the largest float64 below 1; p[0] = [0.5 + 1e-10, 0.5 - 1e-10, 0], "
         "q[0] = [0.5, 0.5, 0], draft [1] (p / q = 1 - 2e-10)",
         torch.cat([near, one_hot0]), torch.tensor([[0.5, 0.5, 0.0]], dtype=d), torch.tensor([1]), [0], "top"),
    ]


_EDGE_WHY = {
    "zero": ("A uniform can be exactly 0: accept only when u < p(y) / q(y), strictly (u * q(y) < p(y)), so a token the "
             "target gives probability 0 is never accepted."),
    "top": ("Draw the uniforms in float64 (torch.rand((), generator=generator, dtype=torch.float64)) and compare them "
            "with the float64 ratio: u = 1 - 2**-53 is not below p / q = 1 - 2e-10, so draft 1 is rejected; in float32 "
            "the ratio rounds to 1.0 (or u to 1 - 2**-24) and the draft is accepted. Then the residual max(p - q, 0) "
            "= [1e-10, 0, 0] is all on token 0: normalise it, however small."),
    "free": ("After the rejection the residual max(p - q, 0) has mass 1e-7, all on token 1: normalise it, however "
             "small; fall back to p only when it is exactly 0 everywhere."),
}


def _check_edges(fn: Callable, batched: bool) -> None:
    name = "verify_chain_batched" if batched else "verify_chain"
    for desc, p, q, draft, expected, uniforms in _edge_cases():
        label = f"{name}({desc})"
        g = torch.Generator().manual_seed(salted(_SEED))
        fixed = {"zero": uniforms_at_zero, "top": uniforms_just_below_one}.get(uniforms, contextlib.nullcontext)
        with fixed():
            if batched:
                B = 64
                tokens, n = _unpack(call(fn, label, p.expand(B, -1, -1).contiguous(), q.expand(B, -1, -1).contiguous(),
                                         draft.expand(B, -1).contiguous(), g), label, B, len(draft))
                outputs = {tuple(row[: int(k)].tolist()) for row, k in zip(tokens, n)}
            else:
                outputs = {tuple(call(fn, label, p, q, draft, g).tolist()) for _ in range(64)}
        wrong = sorted(o for o in outputs if list(o) != expected)
        if wrong:
            raise CheckFailure(f"{label}: every run must commit {expected}; got {list(wrong[0])}. {_EDGE_WHY[uniforms]}")


def _sampler_hint(exercise: str) -> str:
    causes = "; ".join(m.hint.split(";")[0].rstrip(".") for m in for_exercise(exercise))
    return f"Common causes: {causes}."


def check_expected_committed_length(fn: Callable) -> None:
    """Empty drafts, certain and impossible acceptance, decreasing and random rates."""
    rng = random.Random(salted(_SEED))
    cases = [[], [1.0] * 5, [0.0, 1.0, 1.0], [0.9, 0.8, 0.7, 0.6], [0.5], [1.0, 0.0, 1.0]]
    cases += [[rng.random() for _ in range(rng.randint(1, 12))] for _ in range(30)]
    described = [(str([round(a, 4) for a in r]), (r,)) for r in cases]
    described.append(("[1e-7] + [1.0] * 200 (every product counts, however small: E = 1 + 2e-5)",
                      ([1e-7] + [1.0] * 200,)))
    described += [(f"the tuple {tuple(r)} (any sequence of floats)", (tuple(r),)) for r in cases[2:5]]
    compare_cases(fn, chain.expected_committed_length, described)


def check_best_gamma_measured(fn: Callable) -> None:
    """Measured-looking costs: flat, growing and step-shaped verification times; ties."""
    rng = random.Random(salted(_SEED))
    cases = [
        ([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], 0.002, [0.020, 0.020, 0.021, 0.021, 0.022, 0.022]),
        ([0.9] * 8, 0.004, [0.02 + 0.004 * g for g in range(1, 9)]),
        ([0.8] * 6, 0.001, [0.01, 0.01, 0.01, 0.03, 0.03, 0.03]),
        ([0.0] * 4, 0.01, [0.05] * 4),
        ([1.0] * 4, 0.0, [0.01] * 4),
        ([1.0, 0.0, 0.0], 0.0, [0.01, 0.01, 0.01]),
        ([0.5, 1e-8], 0.0, [1.0, 1.0]),  # gamma 2 is better by 5e-9 tokens/s: float64 sees it, float32 does not
    ]
    for _ in range(30):
        G = rng.randint(1, 10)
        rates = [rng.uniform(0.3, 1.0) for _ in range(G)]
        verify = sorted(rng.uniform(0.01, 0.05) for _ in range(rng.randint(1, G)))
        cases.append((rates, rng.uniform(0.0, 0.01), verify))
    described = [
        (f"{[round(a, 3) for a in r]}, draft_step_s={t:.4g}, verify_s={[round(v, 4) for v in v_s]}", (r, t, v_s))
        for r, t, v_s in cases
    ]
    compare_cases(fn, chain.best_gamma_measured, described, rel=0.0, integer=True,
                  requires=[("expected_committed_length", check_expected_committed_length)])


@single_threaded
def check_verify_chain_batched(fn: Callable, rows_per_scenario: int = 4000) -> None:
    """All scenarios stacked in one batch (ragged acceptance), then B = 1 and gamma = 1."""
    by_gamma: dict[int, list] = {}
    for scenario in _scenarios():
        by_gamma.setdefault(len(scenario[3]), []).append(scenario)
    for gamma, scenarios in by_gamma.items():
        V = max(s[1].shape[-1] for s in scenarios)
        same_v = [s for s in scenarios if s[1].shape[-1] == V]
        R = rows_per_scenario
        p = torch.cat([s[1].expand(R, -1, -1) for s in same_v])
        q = torch.cat([s[2].expand(R, -1, -1) for s in same_v])
        draft = torch.cat([s[3].expand(R, -1) for s in same_v])
        label = f"verify_chain_batched(B={len(draft)}, gamma={gamma}, V={V})"
        got = call(fn, label, p.contiguous(), q.contiguous(), draft.contiguous(), torch.Generator().manual_seed(salted(_SEED)))
        tokens, n_committed = _unpack(got, label, len(draft), gamma)
        for i, (desc, ps, qs, ds) in enumerate(same_v):
            rows = slice(i * R, (i + 1) * R)
            outputs = [tuple(row[: int(n)].tolist()) for row, n in zip(tokens[rows], n_committed[rows])]
            compare_frequencies(outputs, chain.outcome_distribution(ps, qs, ds),
                                f"verify_chain_batched rows of {desc} ({_describe(ps, qs, ds)})",
                                hint=_sampler_hint("verify_chain_batched"))
    desc, p, q, draft = _scenarios()[0]
    got = call(fn, "verify_chain_batched(B=1)", p[None], q[None], draft[None], torch.Generator().manual_seed(salted(0)))
    _unpack(got, "verify_chain_batched(B=1)", 1, len(draft))
    got = call(fn, "verify_chain_batched(B=1, draft as int32)", p[None], q[None], draft[None].int(),
               torch.Generator().manual_seed(salted(0)))
    _unpack(got, "verify_chain_batched(B=1, draft as int32: the outputs are long all the same)", 1, len(draft))
    _check_edges(fn, batched=True)
    p, q, draft, _ = _batch(16, 4, V=40)
    expect_reproducible(fn, "verify_chain_batched(B=16, gamma=4, V=40, generator)",
                        lambda seed: (p, q, draft, torch.Generator().manual_seed(salted(seed))))
    expect_no_loop_over(fn, "verify_chain_batched", _batch(8, 3), _batch(64, 3), "rows")
    expect_no_loop_over(fn, "verify_chain_batched", _batch(8, 1), _batch(8, 5), "positions")


def _batch(B: int, gamma: int, V: int = 6) -> tuple:
    g = torch.Generator().manual_seed(salted(B * 100 + gamma))
    p = torch.softmax(torch.randn(B, gamma + 1, V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(B, gamma, V, generator=g, dtype=torch.float64), -1)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, gamma)
    return p, q, draft, g


def _unpack(got, label: str, B: int, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise CheckFailure(f"{label}: return (tokens, n_committed) as two tensors")
    tokens, n_committed = got
    if tokens.dtype != torch.long or n_committed.dtype != torch.long:
        raise CheckFailure(f"{label}: tokens and n_committed must be long (int64) tensors, got {tokens.dtype} and "
                           f"{n_committed.dtype}")
    if tuple(tokens.shape) != (B, gamma + 1) or tuple(n_committed.shape) != (B,):
        raise CheckFailure(f"{label}: expected tokens of shape ({B}, {gamma + 1}) and n_committed ({B},), got "
                           f"{tuple(tokens.shape)} and {tuple(n_committed.shape)}")
    if ((n_committed < 1) | (n_committed > gamma + 1)).any():
        raise CheckFailure(f"{label}: n_committed must lie in 1..gamma + 1 = {gamma + 1}, "
                           f"got values {n_committed.unique().tolist()}")
    positions = torch.arange(gamma + 1)
    pad_wrong = ((positions >= n_committed[:, None]) & (tokens != PAD)).any()
    used_wrong = ((positions < n_committed[:, None]) & (tokens < 0)).any()
    if pad_wrong or used_wrong:
        raise CheckFailure(f"{label}: each row must hold n_committed tokens, then PAD = {PAD} in the remaining slots")
    return tokens, n_committed


@single_threaded
def check_speculative_round(fn: Callable, n: int = 2500) -> None:
    """Exact round distributions (by enumeration) at temperatures 0, 0.5, 1 and 1.5; one target call."""
    try:
        _check_round(fn, n)
    except CheckFailure as failure:
        note = upstream_note(fn, [("verify_chain", check_verify_chain)])
        if note:  # the round may be right: point at the function that is wrong
            raise CheckFailure(str(failure).split(" Common causes:")[0] + note) from None
        raise


def _check_round(fn: Callable, n: int) -> None:
    target = ToyLM(3, seed=7, scale=1.5)
    draft = target.noisy_copy(1.0, seed=8)
    context = torch.tensor([0, 2])
    for temperature in (0.0, 0.5, 1.0, 1.5):
        gamma = 2
        label = f"speculative_round(V=3, context={context.tolist()}, gamma={gamma}, temperature={temperature})"
        g = torch.Generator().manual_seed(salted(_SEED))
        outputs = []
        runs = 50 if temperature == 0 else n
        for _ in range(runs):
            counting = CountingLM(target)
            got = call(fn, label, counting, draft, context, gamma, temperature, g)
            if not isinstance(got, torch.Tensor) or got.ndim != 1:
                raise CheckFailure(f"{label}: return the committed tokens as a 1-D tensor, got {got!r}")
            if counting.calls != 1:
                raise CheckFailure(f"{label}: the target was called {counting.calls} times; "
                                   "score all gamma + 1 positions in one target.logits call.")
            if temperature == 0 and len(outputs) == 0:
                exact0 = chain.round_outcome_distribution(target, draft, context, gamma, 0.0)
                if tuple(int(t) for t in got) not in exact0:
                    raise CheckFailure(
                        f"{label}: at temperature 0 the round must commit the target's greedy tokens {list(next(iter(exact0)))}"
                        f" (or a prefix of them), got {got.tolist()}. Call target.logits on a sequence that ends with the last"
                        " committed token and the drafts (the whole proposal), keep its last gamma + 1 rows, and apply the"
                        " same temperature to p.")
            outputs.append(tuple(int(t) for t in got))
        exact = chain.round_outcome_distribution(target, draft, context, gamma, temperature)
        compare_frequencies(outputs, exact, label, hint=_sampler_hint("speculative_round"))
    wide_target = ToyLM(30, seed=7, scale=0.5)
    wide_draft = wide_target.noisy_copy(1.0, seed=8)
    expect_reproducible(fn, "speculative_round(V=30, gamma=3, temperature=1.0, generator)",
                        lambda seed: (wide_target, wide_draft, context, 3, 1.0, torch.Generator().manual_seed(salted(seed))))
