"""Hidden-test checks for notebook 08 (Triton kernels).

Each check launches the learner's kernel through the package's launcher on cases chosen to
break the usual kernel bugs (V not a multiple of the block, V smaller than one block, B = 1,
ties, overflow, -inf, rows of every kind) and compares with the PyTorch reference. Inputs
are views into buffers with a **guard region** after the data, filled with values that
change the answer: a kernel that reads past the end of its tensor (an off-by-one mask)
reads the guard and fails deterministically instead of reading whatever memory follows.
"""

from __future__ import annotations

import contextlib
import inspect
import traceback
from collections.abc import Callable, Iterator

import torch

from specdec import kernels as ref
from specdec.bench import compiled
from specdec.checks.core import CheckFailure
from specdec.checks.seeds import salted
from specdec.course import instruments
from specdec.kernels import device
from specdec.mistakes import for_exercise

GUARD = 1024  # elements after each input: more than the largest block a check launches with


quiet = instruments.quiet  # no warnings on stderr from the interpreter's numpy: a graded cell must stay quiet


def guarded(t: torch.Tensor, fill: float) -> torch.Tensor:
    """A copy of t (on the kernels' device) with GUARD elements equal to fill before and after it in memory."""
    buffer = torch.full((t.numel() + 2 * GUARD,), fill, dtype=t.dtype, device=device())
    view = buffer[GUARD:GUARD + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def guard_intact(view: torch.Tensor, fill: float) -> bool:
    """True when the guard regions around a guarded() tensor still hold fill (nothing stored out of bounds)."""
    buffer = view._base
    return bool((buffer[:GUARD] == fill).all() and (buffer[GUARD + view.numel():] == fill).all())


_OUT_GUARD = -7  # guard value around outputs: a store outside the output changes it


def expect_guards_intact(label: str, outputs: dict[str, torch.Tensor]) -> None:
    for name, view in outputs.items():
        if not guard_intact(view, _OUT_GUARD):
            raise CheckFailure(f"{label}: the kernel stored outside {name} (a store without a mask, or with a wrong "
                               f"one, writes into whatever memory follows; on a GPU it can crash)")


@contextlib.contextmanager
def loads_counted(watched: dict[str, torch.Tensor]) -> Iterator[dict[str, int]]:
    """Counts, per watched tensor, the elements the interpreter loads from it while inside (masked-off lanes do not
    count). Yields the counts; empty when the kernels run compiled on a GPU, where loads cannot be counted."""
    with instruments.loads_counted(watched, on_cpu=device().type == "cpu") as counts:
        yield counts


def expect_one_pass(kernel: Callable, name: str, label: str, run: Callable[[Callable, dict], object],
                    inputs: dict[str, torch.Tensor], programs_per_element: int = 1) -> None:
    """The statement asks for one pass: each program loads each element of each input at most once, so an element is
    loaded at most ``programs_per_element`` times (1 when a row belongs to one program; N for tree attention, whose
    N node programs of a head all read its keys). Only Triton's interpreter can count loads, so a compiled kernel
    gets no verdict here rather than a pass (grading hides CUDA: it judges in the interpreter on every machine)."""
    if device().type != "cpu":
        raise CheckFailure(f"{label}: loads can only be counted in Triton's interpreter, and here the kernels run "
                           f"compiled on {device()}, so the one-pass rule cannot be judged. Grading (make grade, "
                           "cohort grading) hides CUDA and judges it in the interpreter; to judge it here, restart "
                           "the kernel with CUDA_VISIBLE_DEVICES set to an empty string.")
    watched = {key: guarded(t, 0.0) for key, t in inputs.items()}
    with loads_counted(watched) as counts:
        launch(kernel, name, label, lambda k: run(k, watched))
    for key, count in counts.items():
        if count > programs_per_element * watched[key].numel():
            per_program = "" if programs_per_element == 1 else (
                f", {programs_per_element} programs read each element, so at most {programs_per_element} loads")
            raise CheckFailure(f"{label}: the kernel loaded {count} elements of {key}, which has {watched[key].numel()}: "
                               f"{count / watched[key].numel():.2g} loads per element{per_program}. The statement asks "
                               "for one pass: load each block once and update the running state from it (a first pass "
                               "for the maximum and a second for the rest reads everything twice, twice the memory "
                               "traffic).")


def expect_lowest_index_on_ties(kernel: Callable, label: str) -> None:
    """tl.argmax(..., tie_break_left=False) returns the highest tied index on a GPU; the interpreter always returns the
    lowest (numpy's argmax), so only the source shows it."""
    source = getattr(kernel, "src", None)
    if source is None:  # the interpreter's InterpretedFunction wraps the Python function
        try:
            source = inspect.getsource(getattr(kernel, "fn", kernel))
        except (OSError, TypeError):
            source = ""
    if "tie_break_left=False" in source.replace(" ", ""):
        raise CheckFailure(f"{label}: the kernel calls tl.argmax with tie_break_left=False, which gives ties to the "
                           "highest index when compiled on a GPU (the CPU interpreter hides it); the statement gives "
                           "them to the lowest column: keep the default, tie_break_left=True.")


def _is_kernel(fn: object) -> bool:
    return hasattr(fn, "fn") and hasattr(fn, "__getitem__")


def launch(kernel: Callable, name: str, label: str, run: Callable[[Callable], object]) -> object:
    """run(kernel), with its exceptions turned into a failure that names the input."""
    if not _is_kernel(kernel):
        raise CheckFailure(f"{name} must be a Triton kernel: keep the @triton.jit line above def {name}")
    try:
        with quiet():
            return run(kernel)
    except Exception as err:  # the interpreter wraps the kernel's exception; the compiler reports it in its message
        inner = err.__cause__ or err
        if isinstance(inner, NotImplementedError) or "NotImplementedError" in str(err):
            raise CheckFailure(f"{label}: not implemented yet (the skeleton still raises NotImplementedError)") from None
        message = str(inner).strip().splitlines()
        where = _kernel_line(inner, kernel)
        raise CheckFailure(f"{label} raised {type(inner).__name__}{where}: {message[-1] if message else ''}"[:700]) from None


def _kernel_line(err: BaseException, kernel: Callable) -> str:
    """' at line N of <kernel>: <code>' for the innermost frame of the kernel's own code, if any."""
    fn = getattr(kernel, "fn", None)
    code = getattr(fn, "__code__", None)
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if code is not None and frame.filename == code.co_filename and frame.lineno >= code.co_firstlineno:
            return f" at line {frame.lineno - code.co_firstlineno + 1} of {fn.__name__} ({(frame.line or '').strip()})"
    return ""


def hint(exercise: str, run: Callable[[Callable], object], got: object, agree: Callable[[object, object], bool]) -> str:
    """The hint of the first catalogued mistake whose kernel gives the learner's output on this case."""
    for mistake in for_exercise(exercise):
        try:
            with quiet():
                wrong = run(mistake.fn)
        except Exception:
            continue
        if agree(wrong, got):
            return f" Hint (a known slip gives exactly this output): {mistake.hint}"
    return ""


def _same_ints(a: object, b: object) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same_ints(x, y) for x, y in zip(a, b))
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def _close(a: object, b: object, atol: float = 1e-4, rtol: float = 1e-4, equal_nan: bool = False) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and torch.allclose(a.cpu(), b.cpu(), atol=atol, rtol=rtol, equal_nan=equal_nan))


def _same_floats(a: object, b: object) -> bool:
    """Agreement of a mistake with the learner's output (NaN where NaN: the same bug)."""
    return _close(a, b, rtol=1e-5, equal_nan=True)


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(_show(v) for v in value)
    if isinstance(value, torch.Tensor):
        if value.dim() > 1:
            return "[" + ", ".join(_show(row) for row in value) + "]"
        return str([round(x, 5) if isinstance(x, float) else x for x in value.tolist()])
    return repr(value)


def expect_kernel(kernel: Callable, name: str, run: Callable[[Callable], object], expected: object, label: str) -> None:
    """Visible test: run(kernel) gives expected (integer tensors exactly, float ones to 1e-4)."""
    got = launch(kernel, name, label, run)
    exact = isinstance(expected, tuple) or not expected.is_floating_point()
    agree = _same_ints if exact else _same_floats
    if not (agree(got, expected) if exact else _close(got, expected, rtol=1e-5)):
        raise CheckFailure(f"{label}: expected {_show(expected)}, got {_show(got)}." + hint(name, run, got, agree))


# -- race_kernel ----------------------------------------------------------------------------------------------------


def race_cases() -> list[tuple[str, torch.Tensor, torch.Tensor, int]]:
    """(description, w, e, BLOCK_V) for the race kernel."""
    g = torch.Generator().manual_seed(salted(8))
    cases = []

    def noise(B: int, V: int) -> torch.Tensor:
        return ref.exponential_noise(B, V, generator=g)

    w = torch.rand(3, 64, generator=g)
    cases.append(("B = 3, V = 64 a multiple of BLOCK_V = 16", w, noise(3, 64), 16))
    w = torch.rand(4, 100, generator=g)
    w[0, 97] = w[1, 99] = w[2, 96] = 1e3  # the winner sits in the last, partial block
    cases.append(("V = 100, BLOCK_V = 32: the winner in the last partial block", w, torch.ones(4, 100), 32))
    w = torch.rand(2, 70, generator=g) * 0.5
    w[0, 40] = w[0, 65] = w[1, 20] = w[1, 30] = 1.0  # equal maxima: across blocks in row 0, within one in row 1
    cases.append(("ties, noise 1 (greedy argmax): the lowest column must win", w, torch.ones(2, 70), 32))
    w = torch.rand(3, 48, generator=g)
    w[1:, 0] = 1e3  # the first entry of the next row is the largest value anywhere
    cases.append(("V = 48, BLOCK_V = 16: the next row starts with a huge weight", w, torch.ones(3, 48), 16))
    w, e = torch.rand(1, 5, generator=g), noise(1, 5)
    cases.append(("B = 1, V = 5 smaller than one block", w, e, 8))
    w = torch.rand(2, 40, generator=g) * 0.5
    w[0, 3], w[0, 20], w[1, 5], w[1, 6] = 1.0, 1.0004, 1.0, 1.0 + 2.0**-20  # distinct in float32, tied in float16
    cases.append(("near ties in float32 (1.0 and 1.0004; 1.0 and 1.0 + 2**-20), noise 1: score in float32",
                  w, torch.ones(2, 40), 16))
    w, e = torch.rand(3, 33, generator=g), noise(3, 33)
    w[:, ::3] = 0.0
    e[:, 1::4] = float("inf")  # weight 0 and infinite noise: scores 0, never NaN
    cases.append(("V = 33, zero weights and infinite noise", w, e, 16))
    w = torch.rand(8, 1000, generator=g)
    cases.append(("B = 8, V = 1000, BLOCK_V = 128, random", w, noise(8, 1000), 128))
    return cases


def check_race_kernel(kernel: Callable) -> None:
    for desc, w, e, block in race_cases():
        label = f"race_kernel on {desc}"

        outputs: dict[str, torch.Tensor] = {}

        def run(k: Callable, w=w, e=e, block=block) -> torch.Tensor:
            outputs["out"] = guarded(torch.full((w.shape[0],), -2), _OUT_GUARD)
            return ref.race(guarded(w, 1e30), guarded(e, 1.0), block_v=block, kernel=k, out=outputs["out"]).cpu()

        got = launch(kernel, "race_kernel", label, run)
        expect_guards_intact(label, outputs)
        expected = ref.race_reference(w, e)
        if not _same_ints(got, expected):
            row = int((got != expected).nonzero()[0, 0])
            never = " (-2 means the kernel never stored out[b])" if int(got[row]) == -2 else ""
            if int(got[row]) >= w.shape[1]:
                never = f" (column {int(got[row])} >= V = {w.shape[1]}: a masked padding lane won)"
            raise CheckFailure(f"{label}: row {row}: expected column {int(expected[row])} (score "
                               f"{float(w[row, expected[row]] / e[row, expected[row]]):.4g}), got {int(got[row])}{never}."
                               + hint("race_kernel", run, got, _same_ints))
    w, e = race_cases()[-1][1:3]
    expect_one_pass(kernel, "race_kernel", "race_kernel on B = 8, V = 1000, BLOCK_V = 128, loads counted",
                    lambda k, t: ref.race(t["w"], t["e"], block_v=128, kernel=k), {"w": w, "e": e})
    expect_lowest_index_on_ties(kernel, "race_kernel")
    expect_compiles(kernel, "race_kernel")


# -- logsumexp_kernel -------------------------------------------------------------------------------------------


def logsumexp_cases() -> list[tuple[str, torch.Tensor, int]]:
    """(description, x, BLOCK_V) for the logsumexp kernel."""
    g = torch.Generator().manual_seed(salted(9))
    inf = float("inf")
    cases = [("B = 3, V = 64, BLOCK_V = 16", torch.randn(3, 64, generator=g), 16),
             ("V = 100, BLOCK_V = 32 (a partial last block)", torch.randn(4, 100, generator=g), 32)]
    x = torch.linspace(0, 20, 96).repeat(2, 1)
    x[1] = x[1].flip(0)
    cases.append(("logits rising across blocks (row 0) and falling (row 1), BLOCK_V = 32", x, 32))
    cases.append(("large logits (around 500: exp overflows float32)", 500 + 3 * torch.randn(3, 80, generator=g), 32))
    whole = -500 + 3 * torch.randn(2, 96, generator=torch.Generator().manual_seed(salted(19)))
    cases.append(("large negative logits in whole blocks (around -500, V = 96, BLOCK_V = 32: no padding lanes)", whole, 32))
    cases.append(("large negative logits (around -500: every exp(x) underflows to 0 unless the max is subtracted), "
                  "V = 100, BLOCK_V = 32", -500 + 3 * torch.randn(3, 100, generator=g), 32))
    cases.append(("every real logit below 0 and a partial last block (V = 70, BLOCK_V = 32): padding lanes must not "
                  "count", -5 - torch.rand(2, 70, generator=g), 32))
    x = torch.randn(3, 90, generator=g)
    x[0, :40] = -inf  # the first block and a bit of the second removed (top-k)
    x[1, ::2] = -inf
    x[2] = -inf  # every token removed
    cases.append(("-inf logits: a whole first block, every other token, a whole row", x, 32))
    x = torch.zeros(3, 48)
    x[1:, 0] = 60.0  # the next row starts with a large logit
    cases.append(("V = 48, BLOCK_V = 16: the next row starts with a large logit", x, 16))
    cases.append(("B = 1, V = 1", torch.tensor([[3.5]]), 8))
    cases.append(("the max grows by 100 and then 200 across blocks (V = 4, BLOCK_V = 2: rescale s every time)",
                  torch.tensor([[0.0, 100.0, 200.0, 1.0], [1.0, 0.0, -5.0, 300.0]]), 2))
    cases.append(("B = 5, V = 1000, BLOCK_V = 128, random", 4 * torch.randn(5, 1000, generator=g), 128))
    return cases


def check_logsumexp_kernel(kernel: Callable) -> None:
    for desc, x, block in logsumexp_cases():
        label = f"logsumexp_kernel on {desc}"

        outputs: dict[str, torch.Tensor] = {}

        def run(k: Callable, x=x, block=block) -> torch.Tensor:
            outputs["out"] = guarded(torch.full((x.shape[0],), float("nan")), _OUT_GUARD)
            return ref.logsumexp(guarded(x, 100.0), block_v=block, kernel=k, out=outputs["out"]).cpu()

        got = launch(kernel, "logsumexp_kernel", label, run)
        expect_guards_intact(label, outputs)
        expected = torch.logsumexp(x, -1)
        if not _close(got, expected, rtol=1e-5):
            row = int((~torch.isclose(got, expected, atol=1e-4, rtol=1e-5)).nonzero()[0, 0])
            never = " (NaN can also mean the kernel never stored out[b])" if got[row].isnan() else ""
            raise CheckFailure(f"{label}: row {row}: expected {float(expected[row]):.6g}, got {float(got[row]):.6g}"
                               f"{never}." + hint("logsumexp_kernel", run, got, _same_floats))
    x = logsumexp_cases()[-1][1]
    expect_one_pass(kernel, "logsumexp_kernel", "logsumexp_kernel on B = 5, V = 1000, BLOCK_V = 128, loads counted",
                    lambda k, t: ref.logsumexp(t["x"], block_v=128, kernel=k), {"x": x})
    expect_compiles(kernel, "logsumexp_kernel")


# -- verify_chain_kernel ----------------------------------------------------------------------------------------


def verify_inputs(B: int, gamma: int, V: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Rows of every kind: row 0 accepts everything (q = p), row 1 rejects its first draft
    (p(draft) = 0 with u = 0: a <= test would accept it) and only that one, every third row from row 2 is
    greedy (drafts mostly the argmax), the others sample with a draft close to the target."""
    g = torch.Generator().manual_seed(salted(seed))
    p = torch.softmax(2 * torch.randn(B, gamma + 1, V, generator=g), -1)
    q = torch.softmax(p[:, :gamma].log() + 0.7 * torch.randn(B, gamma, V, generator=g), -1)
    q[0] = p[0, :gamma]
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, gamma)
    u = torch.rand(B, gamma, generator=g)
    if B > 1:
        p[1, 0, draft[1, 0]] = 0.0
        p[1, 0] /= p[1, 0].sum()
        u[1, 0] = 0.0
        q[1, 1:] = p[1, 1:gamma]  # and would accept every later draft
    greedy = torch.arange(B) % 3 == 2
    draft[greedy] = torch.where(torch.rand(int(greedy.sum()), gamma, generator=g) < 0.7,
                                p[greedy, :gamma].argmax(-1), draft[greedy])
    return p, q, draft, u, ref.exponential_noise(B, V, generator=g), greedy


def verify_cases() -> list[tuple[str, tuple[torch.Tensor, ...], int]]:
    """(description, (p, q, draft, u, e, greedy), BLOCK_V) for the fused verifier."""
    cases = [("B = 4, gamma = 3, V = 64, BLOCK_V = 16", verify_inputs(4, 3, 64, 1), 16),
             ("B = 6, gamma = 2, V = 100, BLOCK_V = 32 (a partial last block)", verify_inputs(6, 2, 100, 2), 32),
             ("B = 1, gamma = 1, V = 7 smaller than one block", verify_inputs(1, 1, 7, 3), 8)]
    p, q, draft, u, e, greedy = verify_inputs(3, 2, 40, 4)  # greedy rows whose argmax is tied
    p[:, :] = torch.full((40,), 0.5 / 38).index_put((torch.tensor([5, 30]),), torch.tensor(0.25))
    greedy[:] = True
    draft[0] = torch.tensor([5, 5])  # the lower tied index: accepted
    draft[1] = torch.tensor([30, 5])  # the higher one: rejected, the correction is 5
    draft[2] = torch.tensor([5, 7])
    cases.append(("greedy rows with tied maxima at columns 5 and 30, BLOCK_V = 16", (p, q, draft, u, e, greedy), 16))
    cases.append(("B = 5, gamma = 4, V = 48, BLOCK_V = 16 (rows end exactly at a block edge)",
                  verify_inputs(5, 4, 48, 5), 16))
    cases += [(f"B = 9, gamma = 4, V = 1000, BLOCK_V = 128, random (seed {s})", verify_inputs(9, 4, 1000, s), 128)
              for s in (6, 7)]
    p, q, draft, u, e, greedy = verify_inputs(3, 2, 12, 8)  # sampling rows whose residual is 0 everywhere
    greedy[:] = False
    for row, position in ((0, 0), (1, 1)):
        target = torch.zeros(12).index_put((torch.tensor([4, 7, 9]),), torch.tensor([0.25, 0.25, 0.5]))
        p[row, position], q[row, position] = target, target.clone()
        q[row, position, 9] += 2.0**-20  # q >= p at every token: max(p - q, 0) is exactly 0, yet p(9) < q(9)
        draft[row, : position + 1] = 9
        u[row, : position + 1] = 0.999999  # u * q(9) > p(9): rejected (a draft before it is accepted: p = q there)
        p[row, :position] = q[row, :position]
    cases.append(("sampling rows rejected where q >= p at every token (a residual of zeros: p(0) = 0), V = 12, "
                  "BLOCK_V = 8", (p, q, draft, u, e, greedy), 8))
    p, q, draft, u, e, greedy = verify_inputs(2, 2, 12, 9)  # sampling rows whose residual has mass 1e-7, on token 2
    greedy[:] = False
    for row, position in ((0, 0), (1, 1)):
        target = torch.zeros(12).index_put((torch.tensor([4, 7, 9]),), torch.tensor([0.25, 0.25, 0.5]))
        q[row, position], p[row, position] = target, target.clone()
        p[row, position, 4] -= 1e-7
        p[row, position, 2] = 1e-7  # max(p - q, 0) = 1e-7 on token 2 alone: the correction must be 2
        draft[row, : position + 1] = 4
        u[row, : position + 1] = 1 - 2.0**-24  # the largest float32 below 1: u * q(4) > p(4), rejected
        p[row, :position] = q[row, :position]
    cases.append(("sampling rows rejected where the residual max(p - q, 0) has mass 1e-7, all on token 2, V = 12, "
                  "BLOCK_V = 8", (p, q, draft, u, e, greedy), 8))
    return cases


def _row_kind(args: tuple[torch.Tensor, ...], row: int, count: int) -> str:
    gamma = args[2].shape[1]
    kind = "greedy" if bool(args[5][row]) else "sampling"
    return f"{kind} row, {'all drafts accepted' if count == gamma + 1 else f'first rejection at position {count - 1}'}"


def check_verify_chain_kernel(kernel: Callable) -> None:
    for desc, args, block in verify_cases():
        label = f"verify_chain_kernel on {desc}"
        p, q, draft, u, e, greedy = args

        outputs: dict[str, torch.Tensor] = {}

        def run(k: Callable, args=args, block=block) -> tuple[torch.Tensor, torch.Tensor]:
            p, q, draft, u, e, greedy = args
            outputs["tokens"] = guarded(torch.full((draft.shape[0], draft.shape[1] + 1), -2), _OUT_GUARD)
            outputs["counts"] = guarded(torch.full((draft.shape[0],), -2), _OUT_GUARD)
            tokens, counts = ref.verify_chain_fused(
                guarded(p, 1.0), guarded(q, float("nan")), guarded(draft, 0), guarded(u, 0.5), guarded(e, 1e-30),
                guarded(greedy, True), block_v=block, kernel=k, out=(outputs["tokens"], outputs["counts"]))
            return tokens.cpu(), counts.cpu()

        got = launch(kernel, "verify_chain_kernel", label, run)
        expect_guards_intact(label, outputs)
        want_tokens, want_counts = ref.verify_chain_reference(*args)
        if not _same_ints(got, (want_tokens, want_counts)):
            tokens, counts = got
            row = int(((tokens != want_tokens).any(-1) | (counts != want_counts)).nonzero()[0, 0])
            never = " (-2 marks an entry the kernel never stored)" if (tokens[row] == -2).any() or counts[row] == -2 else ""
            raise CheckFailure(
                f"{label}: row {row} ({_row_kind(args, row, int(want_counts[row]))}, drafts {draft[row].tolist()}): "
                f"expected tokens {want_tokens[row].tolist()} and count {int(want_counts[row])}, got "
                f"{tokens[row].tolist()} and {int(counts[row])}{never}."
                + hint("verify_chain_kernel", run, got, _same_ints))
    expect_lowest_index_on_ties(kernel, "verify_chain_kernel")
    expect_compiles(kernel, "verify_chain_kernel")


# -- tree_attention_kernel -------------------------------------------------------------------------------------


def tree_cases() -> list[tuple[str, tuple[torch.Tensor, ...], int]]:
    """(description, (q, k, v, mask), BLOCK_K) for tree attention."""
    from specdec.tree import DEFAULT_CHOICES, flatten_tree, tree_mask

    g = torch.Generator().manual_seed(salted(10))
    small = tree_mask(flatten_tree([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]).parents)
    default = tree_mask(flatten_tree(DEFAULT_CHOICES).parents)

    def qkv(H: int, L: int, D: int, mask: torch.Tensor, size: float = 1.0) -> tuple[torch.Tensor, ...]:
        N = mask.shape[0]
        return (size * torch.randn(H, N, D, generator=g), size * torch.randn(H, L + N, D, generator=g),
                torch.randn(H, L + N, D, generator=g), mask)

    def negative(H: int, L: int, D: int, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        N = mask.shape[0]
        direction = torch.randn(D, generator=g)
        direction = direction / direction.norm()
        q = 30 * direction + 0.3 * torch.randn(H, N, D, generator=g)
        k = -30 * direction + 0.3 * torch.randn(H, L + N, D, generator=g)  # q . k / sqrt(D) is about -225
        return q, k, torch.randn(H, L + N, D, generator=g), mask

    def hidden_above(H: int, L: int, D: int, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every tree node's key but the root's scores about +225 against every query, the prefix's and the root's
        about 0: the root's row hides keys far above all it sees (exp(0 - 225) underflows in float32)."""
        N = mask.shape[0]
        direction = torch.randn(D, generator=g)
        direction = direction / direction.norm()
        q = 30 * direction + 0.3 * torch.randn(H, N, D, generator=g)
        k = 0.3 * torch.randn(H, L + N, D, generator=g)
        k[:, L + 1:] += 30 * direction
        return q, k, torch.randn(H, L + N, D, generator=g), mask

    return [("H = 2, no prefix (L = 0), 6 nodes, D = 8, BLOCK_K = 4", qkv(2, 0, 8, small), 4),
            ("H = 2, L = 10 (not a multiple of BLOCK_K = 8), 6 nodes, D = 16", qkv(2, 10, 16, small), 8),
            ("H = 3, L = 21, the default 12-node tree, D = 24 (not a power of two), BLOCK_K = 16",
             qkv(3, 21, 24, default), 16),
            ("H = 2, L = 30, 12 nodes, D = 16, large scores (q and k times 12)", qkv(2, 30, 16, default, 12.0), 16),
            ("H = 1, L = 70, 12 nodes, D = 32, BLOCK_K = 32", qkv(1, 70, 32, default), 32),
            ("H = 2, L = 19, 12 nodes, D = 16, every score large and negative (about -200: exp underflows unless "
             "the running max starts at -inf)", negative(2, 19, 16, default), 8),
            ("H = 2, L = 9, 12 nodes, D = 16, the keys hidden from the root score about 225 above those it sees",
             hidden_above(2, 9, 16, default), 8)]


def check_tree_attention_kernel(kernel: Callable) -> None:
    for desc, (q, k, v, mask), block in tree_cases():
        label = f"tree_attention_kernel on {desc}"

        outputs: dict[str, torch.Tensor] = {}

        def run(kern: Callable, q=q, k=k, v=v, mask=mask, block=block) -> torch.Tensor:
            outputs["out"] = guarded(torch.full(q.shape, float("nan")), _OUT_GUARD)
            # NaN around v too: a value read past the keys, even with weight 0, turns the output into NaN
            return ref.tree_attention(guarded(q, float("nan")), guarded(k, float("nan")), guarded(v, float("nan")),
                                      guarded(mask.to(torch.int8), 1), block_k=block, kernel=kern,
                                      out=outputs["out"]).cpu()

        got = launch(kernel, "tree_attention_kernel", label, run)
        expect_guards_intact(label, outputs)
        expected = ref.tree_attention_reference(q, k, v, mask)
        if not _close(got, expected):
            bad = (~torch.isclose(got, expected, atol=1e-4, rtol=1e-4)).any(-1).nonzero()[0].tolist()
            h, i = bad
            seen = mask[i].nonzero().flatten().tolist()
            raise CheckFailure(f"{label}: head {h}, node {i} (sees the prefix and tree nodes {seen}): expected "
                               f"{_head(expected[h, i])}, got {_head(got[h, i])}."
                               + hint("tree_attention_kernel", run, got, _same_floats))
    q, k, v, mask = tree_cases()[2][1]
    expect_one_pass(kernel, "tree_attention_kernel", "tree_attention_kernel on H = 3, L = 21, the default 12-node tree, "
                    "D = 24, BLOCK_K = 16, loads counted",
                    lambda kern, t: ref.tree_attention(t["q"], t["k"], t["v"], mask, block_k=16, kernel=kern),
                    {"q": q, "k": k, "v": v}, programs_per_element=mask.shape[0])
    expect_compiles(kernel, "tree_attention_kernel")


def _head(row: torch.Tensor) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in row[:4].tolist()) + (", ...]" if len(row) > 4 else "]")


# -- would it compile on a GPU? ---------------------------------------------------------------------------------

def compile_error(kernel: Callable, name: str) -> str | None:
    """Why Triton's compiler front end rejects the kernel for a GPU (its IR for sm_90), or None (also when it cannot
    tell). What the interpreter forgives and the compiler does not (a loop variable that changes type, ``break``,
    Python objects in the kernel) fails here. Compiled in the learner's sandbox when grading a cohort."""
    return compiled.run_compiler({name: kernel}, "ir", (90,), wrap=instruments.untrusted_command, timeout=120)[name].get(
        "error")


def expect_compiles(kernel: Callable, name: str) -> None:
    error = compile_error(kernel, name)
    if error:
        raise CheckFailure(f"{name} gives the right answers in the interpreter, but Triton's compiler rejects it for a "
                           f"GPU (the interpreter runs plain Python and forgives more). The compiler says:\n{error}")
