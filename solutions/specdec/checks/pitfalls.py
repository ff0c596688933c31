"""Hidden-test checks for notebook 10 (the pitfalls clinic and the interview drill)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec import ledger, pitfalls as ref
from specdec.checks.core import (
    CheckFailure,
    call,
    close,
    diagnose,
    expect_no_loop_over,
    expect_reproducible,
    fmt,
    torch_function_names,
)
from specdec.checks.engine import tiny_pair
from specdec.checks.seeds import salted
from specdec.checks.stats import compare_frequencies
from specdec.mistakes import for_exercise
from specdec.models.model import KVCache
from specdec.params import SamplingParams
from specdec.recording import RecordingModel
from specdec.tables import load_gpus, load_models


def _hint(name: str, args: tuple, got: object) -> str:
    return diagnose(for_exercise(name), [(args, got)])


def _tensor(label: str, got: object, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
        raise CheckFailure(f"{label}: return a tensor of shape {shape}, got {got!r}"[:400])
    if dtype is not None and got.dtype != dtype:
        raise CheckFailure(f"{label}: return {dtype} (the docstring says {'long' if dtype == torch.long else 'float64'}"
                           f"), got {got.dtype}")
    return got


def _one_row(fn: Callable, name: str, args: tuple, with_q: bool) -> None:
    """B = 1: the outputs keep their batch dimension ((1,), not a 0-d tensor from .squeeze())."""
    label = f"{name}(a batch of one row)"
    got = call(fn, label, *args)
    tokens = got[0] if with_q and isinstance(got, tuple) else got
    _tensor(label + (" tokens" if with_q else ""), tokens, (1,), torch.long)


def check_draft_propose(fn: Callable) -> None:
    """Whatever the draft does, its tokens must follow the q it reports (seeded Monte Carlo)."""
    g = torch.Generator().manual_seed(salted(1))
    n = 4000
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4),
                   SamplingParams(temperature=1.3, top_p=0.8), SamplingParams()):
        row = 2 * torch.randn(1, 6, generator=g)
        label = f"draft_propose(logits, {params})"
        got = call(fn, label, row.expand(n, -1), params, torch.Generator().manual_seed(salted(2)))
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailure(f"{label}: return (tokens, q), got {got!r}"[:300])
        tokens = _tensor(label + " tokens", got[0], (n,), torch.long)
        q = _tensor(label + " q", got[1], (n, 6), torch.float64)
        if ((q < 0).any() or not torch.allclose(q.sum(-1), torch.ones(n, dtype=q.dtype))
                or not torch.equal(q, q[:1].expand(n, -1))):
            raise CheckFailure(f"{label}: q must be a probability distribution per row (the same for identical logits), "
                               f"got rows like {[round(x, 4) for x in q[0].tolist()]}")
        compare_frequencies(tokens.tolist(), {i: float(x) for i, x in enumerate(q[0])}, label + ": the tokens against q",
                            "q must be the distribution the tokens were actually drawn from: the verifier's min(1, p/q) "
                            "relies on it." + _hint("draft_propose", (row.expand(n, -1), params, None), got))
    # rows that differ: each row's token must follow that row's q; greedy rows report a one-hot q at their token
    logits = 3 * torch.randn(2, 7, generator=g)
    for params in (SamplingParams(), SamplingParams(temperature=0.8, top_k=3)):
        label = f"draft_propose(two different rows of logits, each repeated 3000 times, {params})"
        batch = logits.repeat_interleave(3000, 0)
        got = call(fn, label, batch, params, torch.Generator().manual_seed(salted(3)))
        tokens, q = _tensor(label + " tokens", got[0], (6000,)), _tensor(label + " q", got[1], (6000, 7)).double()
        want_q = params.probs(logits).double()
        for r in range(2):
            rows = slice(r * 3000, (r + 1) * 3000)
            best = int(want_q[r].argmax())
            if torch.equal(q[rows], torch.eye(7, dtype=q.dtype)[best].expand(3000, -1)) and bool((tokens[rows] == best).all()):
                continue  # the statement's other fix: keep greedy drafting and report the one-hot q it draws from
            if not torch.allclose(q[rows], want_q[r].expand(3000, -1), atol=1e-6):
                raise CheckFailure(f"{label}: row {r * 3000}'s q should be params.probs of its own logits "
                                   f"(or, if you keep greedy drafting, one-hot at its argmax {best}) "
                                   f"{[round(x, 4) for x in want_q[r].tolist()]}, "
                                   f"got {[round(x, 4) for x in q[r * 3000].tolist()]}"
                                   + (": at temperature 0 that is one-hot at the argmax, the distribution a greedy "
                                      "token is really drawn from, not the softmax." if params.temperature == 0 else "."))
            compare_frequencies(tokens[rows].tolist(), {i: float(x) for i, x in enumerate(want_q[r])},
                                f"{label}: the tokens of logits row {r}",
                                "Each row's token must be drawn from that row's q.")
    for params in (SamplingParams(), SamplingParams(1.0)):
        _one_row(fn, f"draft_propose(logits (1, 7), {params})", (logits[:1], params, torch.Generator().manual_seed(salted(4))),
                 with_q=True)
    expect_reproducible(lambda *a: fn(*a)[0], "draft_propose(logits (64, 20), temperature 1): the tokens",
                        lambda seed: (logits.new_zeros(64, 20), SamplingParams(1.0), torch.Generator().manual_seed(salted(seed))))


def check_draft_token_probs(fn: Callable) -> None:
    g = torch.Generator().manual_seed(salted(3))
    for B, gamma, V, expanded in ((1, 3, 5, False), (4, 3, 7, False), (5, 1, 4, False), (6, 3, 7, True)):
        probs = torch.softmax(torch.randn(1 if expanded else B, gamma, V, generator=g, dtype=torch.float64), -1)
        probs = probs.expand(B, -1, -1) if expanded else probs  # the same row for every request: not contiguous
        drafts = torch.randint(0, V, (B, gamma), generator=g)
        label = (f"draft_token_probs(probs {tuple(probs.shape)}{' (one row expanded: not contiguous)' if expanded else ''}"
                 f", drafts {tuple(drafts.shape)})")
        got = _tensor(label, call(fn, label, probs, drafts), (B, gamma))
        want = ref.draft_token_probs(probs, drafts)
        if not torch.allclose(got.double(), want):
            b = int((~torch.isclose(got.double(), want)).any(-1).nonzero()[0, 0])
            raise CheckFailure(f"{label}: row {b}: expected {[round(x, 4) for x in want[b].tolist()]}, got "
                               f"{[round(x, 4) for x in got[b].tolist()]}." + _hint("draft_token_probs", (probs, drafts), got))


def check_accept_drafts(fn: Callable) -> None:
    g = torch.Generator().manual_seed(salted(4))
    p = torch.rand(6, 4, generator=g, dtype=torch.float64)
    q = torch.rand(6, 4, generator=g, dtype=torch.float64)
    u = torch.rand(6, 4, generator=g, dtype=torch.float64)
    p[0, 0], u[0, 0] = 0.0, 0.0  # a token the target never produces, and a uniform of exactly 0
    p[1, 1], u[1, 1] = q[1, 1], 0.999  # p == q: always accepted
    p[2, 2], q[2, 2], u[2, 2] = 0.0, 0.0, 0.0  # p = q = 0 and u = 0: 0 < 0 is false, rejected
    p[3, 0], q[3, 0], u[3, 0] = 0.1 + 1e-12, 1.0, 0.1  # accepted in float64; float32 rounds p down to u: a tie
    label = ("accept_drafts(p_draft, q_draft, u) with u = 0 where p = 0, one entry with p = q = 0 and one with "
             "u * q within 1e-12 of p (float64)")
    got = _tensor(label, call(fn, label, p, q, u), (6, 4))
    want = ref.accept_drafts(p, q, u)
    if got.dtype != torch.bool or not torch.equal(got, want):
        b, i = (got != want).nonzero()[0].tolist() if got.dtype == torch.bool else (0, 0)
        raise CheckFailure(f"{label}: entry ({b}, {i}) with p = {p[b, i]:.4g}, q = {q[b, i]:.4g}, u = {u[b, i]:.4g} "
                           f"should be {bool(want[b, i])} (a bool tensor)." + _hint("accept_drafts", (p, q, u), got))


def check_accepted_counts(fn: Callable) -> None:
    g = torch.Generator().manual_seed(salted(5))
    cases = [torch.tensor([[True, True, False, True], [False, True, True, True], [True, True, True, True]]),
             torch.rand(7, 5, generator=g) < 0.7, torch.ones(1, 1, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool)]
    history = []
    for accept in cases:
        label = f"accepted_counts({accept.long().tolist()})"
        got = call(fn, label, accept)
        history.append(((accept,), got))
        want = ref.accepted_counts(accept)
        if not isinstance(got, torch.Tensor) or not torch.equal(got.long(), want):
            raise CheckFailure(f"{label}: expected {want.tolist()}, got {got!r}."
                               + diagnose(for_exercise("accepted_counts"), history))
        if got.dtype != torch.long:
            raise CheckFailure(f"{label}: return a long (int64) tensor, got {got.dtype}")
    names = torch_function_names(fn, cases[1])
    syncs = names & {"item", "tolist", "__bool__", "__int__", "__index__", "numpy", "cpu", "nonzero", "argwhere",
                     "masked_select", "unique", "unique_consecutive", "bincount", "repeat_interleave"}
    if syncs:
        raise CheckFailure(f"accepted_counts calls {sorted(syncs)}: each copies a value to the host or has an output "
                           f"size that depends on the data, so the host waits for the GPU (a sync per call). Compute "
                           f"the counts with fixed-shape tensor operations (cumprod, sum).")
    expect_no_loop_over(fn, "accepted_counts", (torch.ones(2, 3, dtype=torch.bool),),
                        (torch.ones(6, 7, dtype=torch.bool),), "rows or positions")
    label = "accepted_counts(a (4, 5) tensor on the 'meta' device: shapes only, as a GPU tensor would be elsewhere)"
    got = call(fn, label, torch.ones(4, 5, dtype=torch.bool, device="meta"))
    if not isinstance(got, torch.Tensor) or got.device.type != "meta" or tuple(got.shape) != (4,):
        raise CheckFailure(f"{label}: the counts must stay on the tensors' device with shape (4,), got {got!r}")


def check_residual(fn: Callable) -> None:
    g = torch.Generator().manual_seed(salted(6))
    p = torch.softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), -1)
    q[2] = p[2]  # nothing left over: the residual is all zero
    p = torch.cat([p, torch.tensor([[0.5 + 1e-10, 0.5 - 1e-10, 0, 0, 0], [0.5, 0.5, 0, 0, 0],
                                    [0.25 + 1e-14, 0.25 - 1e-14, 0.5, 0, 0]], dtype=torch.float64)])
    q = torch.cat([q, torch.tensor([[0.5, 0.5, 0, 0, 0], [0.5, 0.5 + 1e-7, 0, 0, 0], [0.25, 0.25, 0.5, 0, 0]],
                                   dtype=torch.float64)])
    # row 4: a residual of mass 1e-10, to normalise (not to replace); row 5: q >= p by rounding, p != q: p itself;
    # row 6: a residual of mass 1e-14, still a distribution
    label = ("residual(p, q) where row 2 has p == q, row 4 a residual of mass 1e-10, row 5 q >= p everywhere "
             "(p != q by rounding) and row 6 a residual of mass 1e-14")
    got = _tensor(label, call(fn, label, p, q), (7, 5))
    want = ref.residual(p, q)
    tight = {"rtol": 1e-9, "atol": 1e-12} if got.dtype == torch.float64 else {}  # float64 in, float64 exactness
    if not torch.allclose(got.double(), want, **tight):
        b = int((~torch.isclose(got.double(), want, equal_nan=False, **tight)).any(-1).nonzero()[0, 0])
        raise CheckFailure(f"{label}: row {b}: expected {want[b].tolist()}, got {got[b].tolist()}."
                           + _hint("residual", (p, q), got))
    p3 = torch.softmax(torch.randn(2, 3, 4, generator=g, dtype=torch.float64), -1)
    q3 = torch.softmax(torch.randn(2, 3, 4, generator=g, dtype=torch.float64), -1)
    q3[1, 2] = p3[1, 2]
    label = "residual(p, q) of shape (B=2, gamma=3, V=4), with p == q at [1, 2]"
    got = _tensor(label, call(fn, label, p3, q3), (2, 3, 4))
    want = ref.residual(p3, q3)
    if not torch.allclose(got.double(), want):
        raise CheckFailure(f"{label}: expected {[[round(x, 3) for x in r] for r in want[0].tolist()]} in batch row 0, "
                           f"got {[[round(x, 3) for x in r] for r in got.double()[0].tolist()]}. The shapes are (..., V): "
                           "normalise over the last dimension (dim=-1), whatever comes before it."
                           + _hint("residual", (p3, q3), got))


def check_correction_token(fn: Callable) -> None:
    g = torch.Generator().manual_seed(salted(7))
    p = torch.softmax(torch.randn(1, 5, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(1, 5, generator=g, dtype=torch.float64), -1)
    n = 5000
    label = "correction_token(p, q) over 5000 rows"
    got = _tensor(label, call(fn, label, p.expand(n, -1), q.expand(n, -1), torch.Generator().manual_seed(salted(8))), (n,),
                  torch.long)
    _one_row(fn, "correction_token", (p, q, torch.Generator().manual_seed(salted(8))), with_q=False)
    want = ref.residual(p, q)[0]
    compare_frequencies(got.tolist(), {i: float(x) for i, x in enumerate(want)}, label,
                        "After a rejection, sample from the residual max(p - q, 0), normalised: the draft's tokens were "
                        "already offered with probability min(p, q).")
    same = torch.cat([p, p])  # a batched verifier computes every row, including one where p == q
    label = "correction_token(p, q) with a row where p == q"
    got = _tensor(label, call(fn, label, same, torch.cat([q, p]), torch.Generator().manual_seed(salted(9))), (2,))
    if not 0 <= int(got[1]) < p.shape[-1] or p[0, int(got[1])] == 0:
        raise CheckFailure(f"{label}: row 1 must still get a token the target allows, got {got.tolist()}")
    rows_p = torch.softmax(2 * torch.randn(3, 5, generator=g, dtype=torch.float64), -1)
    rows_q = torch.softmax(2 * torch.randn(3, 5, generator=g, dtype=torch.float64), -1)
    label = "correction_token(p, q) with three different rows, each repeated 3000 times"
    got = _tensor(label, call(fn, label, rows_p.repeat_interleave(3000, 0), rows_q.repeat_interleave(3000, 0),
                              torch.Generator().manual_seed(salted(10))), (9000,))
    for r in range(3):
        compare_frequencies(got[r * 3000 : (r + 1) * 3000].tolist(),
                            {i: float(x) for i, x in enumerate(ref.residual(rows_p[r], rows_q[r]))},
                            f"{label}: rows of pair {r}", "Each row samples from its own residual.")
    p_zeros = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]], dtype=torch.float64)  # zeros exactly where q is large
    q_large = torch.tensor([[0.45, 0.05, 0.45, 0.0, 0.05]], dtype=torch.float64)
    label = "correction_token(p with zeros where q is large, q) over 5000 rows"
    got = _tensor(label, call(fn, label, p_zeros.expand(5000, -1), q_large.expand(5000, -1),
                              torch.Generator().manual_seed(salted(12))), (5000,))
    compare_frequencies(got.tolist(), {i: float(x) for i, x in enumerate(ref.residual(p_zeros, q_large)[0])}, label,
                        "Sample from max(p - q, 0), normalised: a token the target gives probability 0 never comes out.")
    tiny_p = torch.tensor([[0.5 + 1e-10, 0.5 - 1e-10, 0.0]], dtype=torch.float64)  # residual: 1e-10 on token 0 alone
    tiny_q = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    label = ("correction_token(p = [0.5 + 1e-10, 0.5 - 1e-10, 0], q = [0.5, 0.5, 0], 64 rows: the residual has mass "
             "1e-10, all on token 0)")
    got = _tensor(label, call(fn, label, tiny_p.expand(64, -1), tiny_q.expand(64, -1), torch.Generator().manual_seed(salted(13))),
                  (64,))
    if bool((got != 0).any()):
        raise CheckFailure(f"{label}: every row must give token 0, got {sorted(set(got.tolist()))}. Build the residual in "
                           "the probabilities' own dtype (float64 here): in float32 p and q round to the same values, "
                           "the residual vanishes and the fallback to p draws token 1 half the time.")
    expect_reproducible(fn, "correction_token(p uniform over 40 tokens, q one-hot, 16 rows)",
                        lambda seed: (torch.full((16, 40), 1 / 40, dtype=torch.float64),
                                      torch.nn.functional.one_hot(torch.zeros(16, dtype=torch.long), 40).double(),
                                      torch.Generator().manual_seed(salted(seed))))


def check_bonus_token(fn: Callable) -> None:
    g = torch.Generator().manual_seed(salted(9))
    p = torch.softmax(torch.randn(1, 6, generator=g, dtype=torch.float64), -1)
    n = 5000
    label = "bonus_token(p_last) over 5000 rows"
    got = _tensor(label, call(fn, label, p.expand(n, -1), torch.Generator().manual_seed(salted(10))), (n,), torch.long)
    _one_row(fn, "bonus_token", (p, torch.Generator().manual_seed(salted(10))), with_q=False)
    compare_frequencies(got.tolist(), {i: float(x) for i, x in enumerate(p[0])}, label,
                        "While sampling, the bonus token is a sample from p, not its argmax.")
    rows = torch.softmax(2 * torch.randn(3, 6, generator=g, dtype=torch.float64), -1)
    label = "bonus_token(p_last) with three different rows, each repeated 3000 times"
    got = _tensor(label, call(fn, label, rows.repeat_interleave(3000, 0), torch.Generator().manual_seed(salted(11))), (9000,))
    for r in range(3):
        compare_frequencies(got[r * 3000 : (r + 1) * 3000].tolist(), {i: float(x) for i, x in enumerate(rows[r])},
                            f"{label}: rows of p_last row {r}", "Each row samples from its own p_last.")
    expect_reproducible(fn, "bonus_token(p_last uniform over 40 tokens, 16 rows)",
                        lambda seed: (torch.full((16, 40), 1 / 40, dtype=torch.float64),
                                      torch.Generator().manual_seed(salted(seed))))


def check_verify_logits(fn: Callable) -> None:
    target, _ = tiny_pair()
    g = torch.Generator().manual_seed(salted(11))
    sequence = torch.randint(0, target.config.vocab_size, (20,), generator=g).tolist()
    drafts = torch.randint(0, target.config.vocab_size, (3,), generator=g).tolist()
    cache = KVCache(target.config)
    with torch.inference_mode():
        target(torch.tensor([sequence[:-1]]), cache)
        want = target(torch.tensor([sequence + drafts]))[0, -4:]
    recorder = RecordingModel(target)
    label = "verify_logits(target, cache holding 19 positions, a 20-token sequence, 3 drafts)"
    with torch.inference_mode():
        got = call(fn, label, recorder, cache, sequence, drafts)
    got = _tensor(label, got, (4, target.config.vocab_size))
    if not torch.allclose(got, want, atol=1e-4):
        raise CheckFailure(f"{label}: the logits differ from a full forward's last 4 positions (max difference "
                           f"{(got - want).abs().max():.3g})." + _hint("verify_logits", (target, cache, sequence, drafts), got))
    fed = [len(c.tokens) for c in recorder.calls]
    if fed != [4] or recorder.calls[0].cache_len != 19 or cache.length != 23:
        raise CheckFailure(f"{label}: the target was fed {fed} tokens (cache length {cache.length} afterwards); feed only "
                           f"the last committed token and the 3 drafts (4 tokens) through the cache, which then holds "
                           f"23 positions. Recomputing the whole sequence every round costs O(length) per round instead "
                           f"of O(gamma).")


def _stream_cases():
    """(label, args) of stream_counts: hand-picked rows, then random batches whose rows differ."""
    def batch(rows, gamma, eos, max_tokens):
        tokens = torch.full((len(rows), gamma + 1), -1, dtype=torch.long)
        for b, (committed, _) in enumerate(rows):
            tokens[b, : len(committed)] = torch.tensor(committed)
        n = torch.tensor([len(c) for c, _ in rows])
        generated = torch.tensor([g for _, g in rows])
        return tokens, n, generated, eos, torch.tensor(max_tokens)

    yield "EOS second of four committed, no limit near", batch([([5, 2, 7, 9], 3)], 3, 2, [50])
    yield "EOS last (the target's own token)", batch([([5, 6, 2], 3)], 3, 2, [50])
    yield "max_tokens inside the round", batch([([5, 6, 7, 8], 8)], 3, 2, [10])
    yield "EOS after the max_tokens cut", batch([([5, 6, 7, 2], 8)], 3, 2, [10])
    yield "EOS exactly at the max_tokens-th token", batch([([5, 6, 2, 8], 8)], 3, 2, [11])
    yield "two EOS: the first ends it", batch([([2, 6, 2, 8], 0)], 3, 2, [50])
    yield "rows that differ", batch([([5, 2, 7, 9], 3), ([5, 6, 7, 8], 8), ([4], 0), ([7, 7, 2], 1)], 3, 2,
                                    [50, 10, 30, 2])
    g = torch.Generator().manual_seed(salted(12))
    for i in range(25):
        B, gamma = int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
        rows, limits = [], []
        for _ in range(B):
            n = int(torch.randint(1, gamma + 2, (1,), generator=g))
            rows.append((torch.randint(0, 5, (n,), generator=g).tolist(), int(torch.randint(0, 12, (1,), generator=g))))
            limits.append(rows[-1][1] + int(torch.randint(1, 7, (1,), generator=g)))
        yield f"random batch {i}", batch(rows, gamma, 3, limits)


def check_stream_counts(fn: Callable) -> None:
    """Every case against the reference, row by row; long counts and bool flags; no Python loop
    over rows and no host sync."""
    history = []
    cases = list(_stream_cases())
    for label, args in cases:
        tokens, n, generated, eos, limit = args
        shown = (f"stream_counts({label}: tokens={tokens.tolist()}, n_committed={n.tolist()}, generated="
                 f"{generated.tolist()}, eos_id={eos}, max_tokens={limit.tolist()})")
        got = call(fn, shown, *args)
        history.append((args, got))
        want = ref.stream_counts(*args)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
                and all(tuple(t.shape) == (len(n),) for t in got)):
            raise CheckFailure(f"{shown}: return (stream, finished), two tensors of shape ({len(n)},); got {got!r}"[:500])
        if got[0].dtype != torch.long or got[1].dtype != torch.bool:
            raise CheckFailure(f"{shown}: stream must be a long tensor and finished a bool tensor, got {got[0].dtype} "
                               f"and {got[1].dtype}.")
        for b in range(len(n)):
            if int(got[0][b]) != int(want[0][b]) or bool(got[1][b]) != bool(want[1][b]):
                raise CheckFailure(
                    f"{shown}: row {b}: expected stream {int(want[0][b])}, finished {bool(want[1][b])}; got "
                    f"{int(got[0][b])}, {bool(got[1][b])}. A row streams up to and including its first EOS and never "
                    "past its own max_tokens-th token; it is finished when either happened."
                    + diagnose(for_exercise("stream_counts"), history))
    names = torch_function_names(fn, *cases[6][1])
    syncs = names & {"item", "tolist", "__bool__", "__int__", "__index__", "numpy", "cpu", "nonzero", "argwhere",
                     "masked_select", "unique"}
    if syncs:
        raise CheckFailure(f"stream_counts calls {sorted(syncs)}: each waits for the GPU. Use fixed-shape tensor "
                           "operations (comparisons, argmax, where, minimum).")
    small, large = cases[0][1], cases[6][1]
    expect_no_loop_over(fn, "stream_counts", small, large, "rows")


# -- the interview drill -----------------------------------------------------------------------------------------


def _number(name: str, got: object, want: float, rel: float, why: str) -> None:
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise CheckFailure(f"{name} must be a number, got {got!r}")
    if not close(got, want, rel=rel, abs_tol=1e-12):
        raise CheckFailure(f"{name} = {fmt(got)} is not it (answers within {rel:.1%} of the exact value count). {why}")


def drill_number(name: str) -> tuple[float, float, str]:
    """(exact answer, relative tolerance, explanation) of one numeric drill question of notebook 10."""
    model, gpu = load_models()["llama-2-7b"], load_gpus()["H100 SXM"]
    return {
        "TOKENS_PER_S_CAP": (ledger.tokens_per_s_cap(ledger.count_params(model), 2, gpu.bandwidth), 0.03,
                             "Each decoded token reads every weight once: the floor per token is parameters x 2 "
                             "bytes / bandwidth, and the ceiling is its inverse."),
        "EXPECTED_TOKENS": (ledger.expected_tokens_per_round(0.8, 4), 0.005,
                            "E = (1 - a^(gamma + 1)) / (1 - a): the accepted drafts plus the one token the target "
                            "always adds."),
        "SPEEDUP": (ledger.speedup(0.8, 4, 0.05), 0.005, "S = E / (1 + gamma c), verification costing one step."),
        "DISCARDED": (3, 0.0, "The verify forward wrote gamma + 1 = 6 entries after the 99 cached ones (105); the "
                              "sequence grows to 103 tokens, of which the cache keeps all but the last (102)."),
        "ACCEPTANCE": (0.7, 0.005, "The acceptance rate is the sum over x of min(p(x), q(x))."),
    }[name]


def check_drill_number(answers: dict, name: str) -> None:
    if not isinstance(answers, dict):
        raise CheckFailure(f"ANSWERS must be a dict of answers, got {answers!r}")
    want, rel, why = drill_number(name)
    _number(name, answers.get(name), want, rel, why)


def check_drill_choice(answers: dict, name: str) -> None:
    """LARGE_BATCH or TEMPERATURES: multiple choice, see notebook 10."""
    why = {("LARGE_BATCH", "a"): "acceptance depends on the models and the text, not on the batch size",
           ("LARGE_BATCH", "c"): "rollback is bookkeeping (crop or a counter); nothing is copied",
           ("LARGE_BATCH", "d"): "the draft's cost per token does not grow with the batch faster than the target's",
           ("TEMPERATURES", "b"): "exactness needs q to be what the draft sampled from and p the target's distribution "
                                  "under the request's parameters; the draft's own temperature only changes acceptance",
           ("TEMPERATURES", "c"): "greedy verification of a sampling request is the bug here, not the temperatures",
           ("TEMPERATURES", "d"): "the output distribution does not depend on the draft at all when q is right"}
    right = {"LARGE_BATCH": "b", "TEMPERATURES": "a"}[name]
    got = answers.get(name) if isinstance(answers, dict) else None
    if got not in ("a", "b", "c", "d"):
        raise CheckFailure(f"{name} must be 'a', 'b', 'c' or 'd', got {got!r}")
    if got != right:
        raise CheckFailure(f"{name} = {got!r} is not it: {why[name, got]}.")
