"""Checks for notebook 12 (self-drafting): random heads, trees, sequences, drafters and configs."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from specdec.checks.core import (
    CheckFailure,
    call_recorded,
    describe_types,
    diagnose,
    fmt,
    not_implemented,
    upstream_note,
)
from specdec.checks.seeds import salted
from specdec.drafters.dynamic_tree import expand_dynamic_tree
from specdec.drafters.eagle import EagleDrafter, eagle_draft_step, eagle_inputs
from specdec.drafters.medusa import medusa_candidates, medusa_head_logits
from specdec.drafters.memory import KINDS, DrafterCost, drafter_cost
from specdec.mistakes import for_exercise
from specdec.models.model import Llama, LlamaConfig


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (f"{value.dtype} tensor of shape {tuple(value.shape)}" if value.numel() > 12
                else f"tensor({value.tolist()}, dtype={value.dtype})")
    return fmt(value) if not callable(value) else getattr(value, "__name__", "a function")


def _agree(got: Any, expected: Any, strict: bool = True) -> bool:
    """Equal values; with ``strict`` also the promised types: the same tensor dtype, list or tuple, Python ints."""
    if isinstance(expected, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.shape == expected.shape and (got.dtype == expected.dtype or not strict)
                and bool(torch.allclose(got.double(), expected.double(), rtol=1e-6, atol=1e-8)))
    if isinstance(expected, (tuple, list)):
        return (isinstance(got, (tuple, list)) and (type(got) is type(expected) or not strict)
                and len(got) == len(expected) and all(_agree(g, e, strict) for g, e in zip(got, expected)))
    if strict and isinstance(expected, int) and not isinstance(expected, bool):
        return isinstance(got, int) and not isinstance(got, bool) and got == expected
    return bool(got == expected)


def _compare(fn: Callable, reference: Callable, cases: Iterable[tuple[str, tuple]], requires=(),
             explain: Callable[[tuple, Any, Any], str] | None = None) -> None:
    """fn and reference on every case (description, args), on copies of the args; fail at the first disagreement.
    ``explain(args, expected, got)`` says what differs where no catalogued mistake reproduces the answer."""
    name = reference.__name__
    mistakes, history = for_exercise(name), []
    for description, args in cases:
        label = f"{name}({description})"
        expected = reference(*copy.deepcopy(args))
        got = call_recorded(fn, label, copy.deepcopy(args), mistakes, history, requires, rel=1e-6)
        history.append((args, got))
        if _agree(got, expected, strict=False) and not _agree(got, expected):
            raise CheckFailure(f"{label}: the right values, but {_describe(got)} ({describe_types(got)}) where the "
                               f"statement promises {_describe(expected)} ({describe_types(expected)}): the same "
                               "container, Python ints for ids, the inputs' float dtype for tensors.")
        if not _agree(got, expected):
            note = upstream_note(fn, requires)
            hint = "" if note else diagnose(mistakes, history, rel=1e-6)
            if not hint and not note and explain is not None:
                hint = explain(args, expected, got)
            raise CheckFailure(f"{label}: expected {_describe(expected)}, got {_describe(got)}.{hint}{note}")


# ---- Medusa ---------------------------------------------------------------------------------
def check_medusa_head_logits(fn: Callable) -> None:
    rng, cases = torch.Generator().manual_seed(salted(21)), []
    for shape in [(), (3,), (2, 5), ()] * 6:
        K, d, V = (int(x) for x in torch.randint(1, 5, (1,), generator=rng).tolist()
                                   + torch.randint(2, 9, (2,), generator=rng).tolist())
        hidden = torch.randn(*shape, d, generator=rng, dtype=torch.float64)
        res_weight = torch.randn(K, d, d, generator=rng, dtype=torch.float64)
        res_bias = torch.randn(K, d, generator=rng, dtype=torch.float64)
        out_weight = torch.randn(K, V, d, generator=rng, dtype=torch.float64)
        cases.append((f"hidden of shape {tuple(hidden.shape)}, K={K} heads, d={d}, V={V} (random float64 weights)",
                      (hidden, res_weight, res_bias, out_weight)))
    _compare(fn, medusa_head_logits, cases)


def _random_choices(rng: random.Random, depth: int) -> list[tuple[int, ...]]:
    paths = {(r,) for r in range(rng.randrange(1, 4))}
    for _ in range(rng.randrange(0, 10)):
        parent = rng.choice(sorted(paths))
        if len(parent) < depth:
            paths.add(parent + (rng.randrange(0, 3),))
    closed = set()
    for p in paths:
        closed |= {p[:i] for i in range(1, len(p) + 1)}
    return sorted(closed, key=lambda p: (-len(p), p))  # in any order: the function sorts them


def check_medusa_candidates(fn: Callable) -> None:
    rng, g, cases = random.Random(salted(22)), torch.Generator().manual_seed(salted(22)), []
    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 1.0, 2.0, 0.0]])
    cases.append(("root=7, head_logits with ties [[1, 3, 3, 0, 3], [2, 2, 1, 2, 0]], "
                  "choices [(0,), (1,), (2,), (0, 0), (0, 1), (2, 2)]",
                  (7, tied, [(0,), (1,), (2,), (0, 0), (0, 1), (2, 2)])))
    for _ in range(40):
        K, V = rng.randrange(1, 5), rng.randrange(4, 12)
        logits = torch.randn(K, V, generator=g, dtype=torch.float64)
        choices = _random_choices(rng, K)
        root = rng.randrange(V)
        cases.append((f"root={root}, head_logits {K} x {V} (random), choices {choices}", (root, logits, choices)))
    for dtype, V in ((torch.float64, 256), (torch.float32, 256), (torch.float64, 10), (torch.float64, 17)):
        K = 3  # logits on a few levels: exact ties, where an unstable sort or topk no longer keeps the lower id first
        logits = torch.randint(0, 4, (K, V), generator=g).to(dtype)
        choices = sorted({(a,) for a in range(4)} | {(a, b) for a in range(2) for b in range(3)} | {(0, 0, 2), (1, 2, 1)})
        root = rng.randrange(100, 256)
        cases.append((f"root={root}, head_logits {K} x {V} of {dtype} on 4 levels (tied logits), choices {choices}",
                      (root, logits, choices)))
    repeated = torch.randn(2, 9, generator=g, dtype=torch.float64)
    cases.append(("root=4, head_logits 2 x 9 (random), choices [(1,), (0,), (1, 2), (0,), (1,)] with repeats (a node "
                  "per distinct path, as flatten_tree gives)", (4, repeated, [(1,), (0,), (1, 2), (0,), (1,)])))
    _compare(fn, medusa_candidates, cases)


# ---- EAGLE ----------------------------------------------------------------------------------
def check_eagle_inputs(fn: Callable) -> None:
    g, cases = torch.Generator().manual_seed(salted(23)), []
    for T, N in [(5, 6), (5, 5), (3, 7), (1, 2), (6, 4), (8, 9), (3, 1), (3, 0)]:
        features = torch.randn(T, 3, generator=g)
        tokens = torch.randint(0, 50, (N,), generator=g)
        cases.append((f"features of shape ({T}, 3), tokens {tokens.tolist()}", (features, tokens)))
    _compare(fn, eagle_inputs, cases)


def _tiny_eagle(seed: int) -> tuple[Llama, EagleDrafter]:
    torch.manual_seed(salted(seed))
    config = LlamaConfig(vocab_size=24, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64)
    target, drafter = Llama(config).eval(), EagleDrafter(config).eval()
    with torch.no_grad():
        for p in list(target.parameters()) + list(drafter.parameters()):
            p.mul_(10.0)
    return target, drafter


def check_eagle_draft_step(fn: Callable) -> None:
    for seed, prefix in ((0, 0), (1, 3), (2, 7)):
        target, drafter = _tiny_eagle(seed)
        g = torch.Generator().manual_seed(salted(seed))
        cache = drafter.new_cache()
        if prefix:
            with torch.inference_mode():
                drafter(torch.randn(1, prefix, 32, generator=g),
                        target.embed_tokens(torch.randint(0, 24, (1, prefix), generator=g)), target, cache)
        feature, tokens = torch.randn(32, generator=g), torch.randint(0, 24, (3,), generator=g).tolist()
        mine, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
        f_mine, f_ref = feature, feature
        for step, token in enumerate(tokens):
            label = (f"eagle_draft_step(a small random drafter, step {step + 1} of 3 after {prefix} cached entries, "
                     f"token={token})")
            before = mine.length
            try:
                got = fn(drafter, target, f_mine, token, mine)
            except NotImplementedError as err:
                raise not_implemented(fn, label, err) from None
            except Exception as err:
                raise CheckFailure(f"{label} raised {type(err).__name__}: {err}") from None
            expected = eagle_draft_step(drafter, target, f_ref, token, theirs)
            if mine.length != before + 1:
                no_cache = next(m for m in for_exercise("eagle_draft_step") if m.name == "no_cache")
                hint = f" Hint (a known slip gives exactly this output): {no_cache.hint}" if mine.length == before else ""
                raise CheckFailure(f"{label}: the drafter's cache should grow by exactly 1 entry, it went from {before} "
                                   f"to {mine.length}.{hint}")
            if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(x, torch.Tensor) for x in got)):
                raise CheckFailure(f"{label}: return (predicted feature (d,), logits (V,)), got {got!r}")
            for what, g_, e_ in (("the predicted feature", got[0], expected[0]), ("the logits", got[1], expected[1])):
                if g_.shape != e_.shape or not torch.allclose(g_.float(), e_.float(), rtol=1e-4, atol=1e-4):
                    wrong = [m for m in for_exercise("eagle_draft_step")
                             if _reproduces_step(m.fn, drafter, target, f_ref, token, copy.deepcopy(cache), got)]
                    hint = f" Hint (a known slip gives exactly this output): {wrong[0].hint}" if wrong else ""
                    raise CheckFailure(f"{label}: {what} differs from the reference (max difference "
                                       f"{_max_diff(g_, e_)}).{hint}")
            f_mine, f_ref = got[0], expected[0]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    return (f"{(a.float() - b.float()).abs().max().item():.3g}" if a.shape == b.shape
            else f"shapes {tuple(a.shape)} vs {tuple(b.shape)}")


def _reproduces_step(mistake, drafter, target, feature, token, cache, got) -> bool:
    try:
        wrong = mistake(drafter, target, feature, token, cache)
    except Exception:
        return False
    return all(w.shape == g.shape and torch.allclose(w.float(), g.float(), rtol=1e-4, atol=1e-4) for w, g in zip(wrong, got))


# ---- EAGLE-2 --------------------------------------------------------------------------------
class _Drafter:
    """A deterministic synthetic drafter: log-probabilities depend on the path (a hash); no ties."""

    def __init__(self, vocab: int, seed: int, sharp: float) -> None:
        self.vocab, self.seed, self.sharp = vocab, seed, sharp

    def __call__(self, paths):
        rows = []
        for path in paths:
            g = torch.Generator().manual_seed(salted(hash((self.seed,) + tuple(path)) % (2**31)))
            logits = self.sharp * torch.randn(self.vocab, generator=g, dtype=torch.float64)
            rows.append(torch.log_softmax(logits, -1))
        return torch.stack(rows)

    def __deepcopy__(self, memo):
        return self

    __name__ = "a synthetic drafter"


def _near_tie(expand, depth: int, top_k: int, budget: int) -> bool:
    """True if two created nodes' values are within 1e-9 (summation order could decide their rank)."""
    created, frontier = [], [(0.0, ())]
    for _ in range(depth):
        rows = expand([p for _, p in frontier])
        new = []
        for (v, p), row in zip(frontier, rows):
            for t in torch.sort(row, descending=True, stable=True).indices[:top_k].tolist():
                new.append((v + float(row[t]), p + (t,)))
        created += new
        frontier = sorted(new, key=lambda x: -x[0])[:top_k]
    values = sorted(v for v, _ in created)
    return any(b - a < 1e-9 for a, b in zip(values, values[1:]))


class _CrossTiedDrafter:
    """Probabilities that are binary fractions, so nodes under different parents tie exactly: the tie rule
    ("the earlier created node ranks higher") decides both the next frontier and the budget cut."""

    __name__ = ("a drafter whose nodes under different parents tie exactly (probabilities of tokens 0-3 after the "
                "root: [0.25, 0.5, 0.125, 0.125]; after (0,): [0.5, 0.25, 0.125, 0.125]; after (1,): [0.5, 0.125, "
                "0.125, 0.25]; after any other path: [0.5, 0.25, 0.125, 0.125])")

    def __call__(self, paths):
        table = {(): [0.25, 0.5, 0.125, 0.125], (1,): [0.5, 0.125, 0.125, 0.25], (0,): [0.5, 0.25, 0.125, 0.125]}
        return torch.log(torch.tensor([table.get(p, [0.5, 0.25, 0.125, 0.125]) for p in paths], dtype=torch.float64))

    def __deepcopy__(self, memo):
        return self


class _TiedDrafter:
    """Exact ties: the best child of the root and of (0,) has log-probability 0 (a child ties its parent's value),
    and (0,)'s next two children tie at -1 (the lower token id must come first)."""

    __name__ = ("a drafter with exact ties (log-probabilities of tokens 0, 1, 2 after a path of length 0: [0, -30, "
                "-40]; of length 1: [0, -1, -1]; of length 2 or more: [-2, -3, -3])")

    def __call__(self, paths):
        table = {0: [0.0, -30.0, -40.0], 1: [0.0, -1.0, -1.0], 2: [-2.0, -3.0, -3.0]}
        return torch.tensor([table[min(len(p), 2)] for p in paths], dtype=torch.float64)

    def __deepcopy__(self, memo):
        return self


def check_expand_dynamic_tree(fn: Callable) -> None:
    rng = random.Random(salted(24))
    tied = _TiedDrafter()
    cases = [(f"{tied.__name__}, depth={d}, top_k=2, budget={b}", (tied, d, 2, b)) for d, b in ((2, 1), (2, 2), (2, 3), (3, 4))]
    cross = _CrossTiedDrafter()
    cases += [(f"{cross.__name__}, depth={d}, top_k=2, budget={b}", (cross, d, 2, b)) for d, b in ((2, 4), (3, 20), (3, 6))]
    while len(cases) < 60:
        V, depth, top_k = rng.randrange(4, 9), rng.randrange(1, 5), rng.randrange(1, 4)
        budget = rng.randrange(1, 12)
        expand = _Drafter(V, rng.randrange(10**6), rng.choice([0.5, 2.0, 4.0]))
        if _near_tie(expand, depth, top_k, budget):
            continue
        cases.append((f"a synthetic drafter over {V} tokens, depth={depth}, top_k={top_k}, budget={budget}",
                      (expand, depth, top_k, budget)))
    _compare(fn, expand_dynamic_tree, cases)


# ---- costs ----------------------------------------------------------------------------------
def check_drafter_cost(fn: Callable) -> None:
    rng, cases = random.Random(salted(25)), []
    configs = [LlamaConfig(vocab_size=256, d_model=512, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=1024),
               LlamaConfig(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=11008),
               LlamaConfig(vocab_size=1000, d_model=64, n_layers=3, n_heads=4, n_kv_heads=4, d_ff=96)]
    drafts = [LlamaConfig(vocab_size=256, d_model=192, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512),
              LlamaConfig(vocab_size=32000, d_model=1024, n_layers=8, n_heads=16, n_kv_heads=4, d_ff=2816),
              LlamaConfig(vocab_size=1000, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=40)]
    for kind in KINDS * 4:
        i = rng.randrange(3)
        B, ctx, gamma, nodes = rng.choice([1, 8, 64]), rng.choice([128, 4096]), rng.randrange(1, 8), rng.randrange(2, 40)
        b, K = rng.choice([2, 1, 4]), rng.choice([4, 5])
        cases.append((f"kind={kind!r}, target {configs[i]}, draft {drafts[i]}, batch_size={B}, context={ctx}, gamma={gamma}, "
                      f"tree_nodes={nodes}, bytes_per_value={b}, num_heads={K}",
                      (kind, configs[i], drafts[i], B, ctx, gamma, nodes, b, K)))
    _compare(fn, drafter_cost, cases, explain=_explain_cost)


def _cost_parts(kind: str, target: LlamaConfig, draft: LlamaConfig | None, num_heads: int) -> dict[str, int]:
    """Named pieces of a drafter's parameter count, to recognise which one an answer got wrong."""
    if kind.startswith("draft"):
        c = draft
        kv_width = c.n_kv_heads * c.head_dim
        return {"the draft's embedding or its LM head (V * d)": c.vocab_size * c.d_model,
                "k and v at the full width d instead of n_kv_heads * head_dim, in every layer":
                    2 * c.n_layers * c.d_model * (c.d_model - kv_width),
                "one decoder layer": 2 * c.d_model ** 2 + 2 * c.d_model * kv_width + 3 * c.d_model * c.d_ff + 2 * c.d_model,
                "an MLP matrix (d * d_ff) in every layer": c.n_layers * c.d_model * c.d_ff,
                "a norm (d) in every layer": c.n_layers * c.d_model, "the final norm (d)": c.d_model}
    d, kv_width = target.d_model, target.n_kv_heads * target.head_dim
    if kind == "medusa":
        return {"a head's projection (V * d)": target.vocab_size * d, "a head's residual block (d * d + d)": d * d + d,
                "a bias (d)": d}
    if kind.startswith("eagle"):
        return {"the fc (2d * d + d)": 2 * d * d + d, "the fc's bias (d)": d, "a norm (d)": d,
                "k and v at the full width d instead of n_kv_heads * head_dim": 2 * d * (d - kv_width),
                "an MLP matrix (d * d_ff)": d * target.d_ff, "the embedding or the LM head (V * d), which are shared "
                "with the target and not counted": target.vocab_size * d}
    return {}


def _number(x: Any) -> str:
    return f"{int(x):,}" if isinstance(x, (int, float)) and float(x).is_integer() else fmt(x)


def _explain_cost(args: tuple, expected: Any, got: Any) -> str:
    """Which fields differ and, where the weights differ by a whole number of one named piece, which piece."""
    if not (isinstance(expected, DrafterCost) and isinstance(got, DrafterCost)):
        return ""
    kind, target, draft, batch_size, _, _, _, bytes_per_value, num_heads = args
    lines = []
    for field in ("weight_bytes", "kv_bytes", "draft_forwards", "verify_tokens"):
        want, have = getattr(expected, field), getattr(got, field)
        if want != have:
            lines.append(f"{field} should be {_number(want)}, yours is {_number(have)}")
    cause = ""
    if expected.weight_bytes != got.weight_bytes and isinstance(got.weight_bytes, (int, float)):
        off = (got.weight_bytes - expected.weight_bytes) / bytes_per_value
        scale = num_heads if kind == "medusa" else 1
        for name, values in _cost_parts(kind, target, draft, num_heads).items():
            for times in (1, 2, scale):
                if values and abs(abs(off) - times * values) < 0.5:
                    more = "too many" if off > 0 else "missing"
                    cause = (f" Your weights have {_number(abs(off))} values {more}: exactly "
                             f"{'' if times == 1 else f'{times} x '}{name}.")
                    break
            if cause:
                break
    elif expected.kv_bytes and got.kv_bytes != expected.kv_bytes and isinstance(got.kv_bytes, (int, float)):
        ratio = got.kv_bytes / expected.kv_bytes
        c = draft if kind.startswith("draft") else target
        causes = [why for factor, why in (
            (2, "count K and V once each: 2 * layers * n_kv_heads * head_dim values per token"),
            (batch_size, "the KV is for the whole batch: batch_size * context tokens"),
            (c.n_heads / c.n_kv_heads, "the cache holds n_kv_heads heads (grouped-query), not n_heads"),
            (bytes_per_value, "bytes are values times bytes_per_value"))
            if factor != 1 and (abs(ratio - factor) < 1e-9 or abs(ratio - 1 / factor) < 1e-9)]
        if causes:  # more than one factor can fit one case: name them all rather than guess
            cause = f" Your kv_bytes is {_number(ratio)} x the right one; check " + ", or ".join(causes) + "."
    return " " + "; ".join(lines) + "." + cause
