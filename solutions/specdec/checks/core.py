"""Building blocks of the checks: calling a learner's function, comparing, explaining a failure."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import traceback
from collections.abc import Callable, Iterable, Sequence
from numbers import Integral, Real
from typing import Any

import torch

from specdec.checks.seeds import salted
from specdec.course.instruments import fixed_uniforms, torch_calls
from specdec.mistakes import Mistake, for_exercise


class CheckFailure(AssertionError):
    """A learner's function gave a wrong answer; the message says how to fix it."""


def hidden_check(name: str) -> Callable[..., None]:
    """What stands where a hidden test was, in the student edition (``specdec.course.edition``)."""
    def hidden(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{name} is a hidden test: it is not in the student edition (your instructor grades it)")

    hidden.__name__ = name
    return hidden


def fmt(value: Any) -> str:
    """Numbers the way a person reads them: 6,738,415,616 and 3.3616."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, Integral):
        return f"{int(value):,}"
    if isinstance(value, Real):
        value = float(value)
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.6g}"
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return repr(value)


def _raiser(err: BaseException) -> str:
    """Name of the function in which an exception was raised (innermost frame)."""
    frames = traceback.extract_tb(err.__traceback__)
    return frames[-1].name if frames else ""


def not_implemented(fn: Callable, label: str, err: NotImplementedError) -> CheckFailure:
    """The failure for a skeleton that still raises NotImplementedError (here or in a callee)."""
    name, where = getattr(fn, "__name__", ""), _raiser(err)
    if where and where != name and not where.startswith("<") and not label.startswith(where):
        return CheckFailure(f"{label} calls {where}, which is not implemented yet (it still raises NotImplementedError)")
    return CheckFailure(f"{label}: not implemented yet (the skeleton still raises NotImplementedError)")


def call(fn: Callable, label: str, *args: Any, changes_inputs: bool = False) -> Any:
    """Call the learner's function, turning an exception into a readable failure, and (unless the exercise is
    meant to change them: ``changes_inputs``) failing when it changed a list, dict or tensor it was given."""
    before = None if changes_inputs else snapshot_inputs(args)
    rng = global_rng_state(args)
    try:
        result = fn(*args)
    except NotImplementedError as err:
        raise not_implemented(fn, label, err) from None
    except CheckFailure:
        raise
    except Exception as err:  # the learner's bug, reported with its input
        raise CheckFailure(f"{label} raised {type(err).__name__}: {err}") from None
    if before is not None:
        expect_untouched(label, args, before)
    expect_no_global_draws(label, rng)
    return result


def global_rng_state(args: Sequence[Any]) -> torch.Tensor | None:
    """torch's global random state before a call that was given a generator (None when it was given none)."""
    return torch.get_rng_state() if any(isinstance(a, torch.Generator) for a in args) else None


def expect_no_global_draws(label: str, state: torch.Tensor | None) -> None:
    """A function given a generator draws every random number from it: torch's global state must not have moved.
    Checked on every call, so every path counts (a rejection's resample, a bonus token, a fallback), not only the
    paths a reproducibility test happens to take."""
    if state is not None and not torch.equal(state, torch.get_rng_state()):
        raise CheckFailure(
            f"{label} drew from torch's global random state although it was given a generator: draw every random "
            "number from the generator you are given (torch.rand(..., generator=generator), torch.multinomial(..., "
            "generator=generator), specdec.sampling.sample(probs, generator)), on every path (a rejection's "
            "resample, the bonus token, a fallback); otherwise the same seed does not give the same result.")


_NOT_DATA = object()  # an argument the snapshot leaves out (a model, a cache, a generator, a config)


def snapshot_inputs(args: Sequence[Any]) -> list[Any]:
    """Copies of the arguments a pure function must leave as they were: lists, tuples, dicts, sets and tensors."""
    def plain(value: Any, depth: int = 0) -> bool:  # numbers, strings, tensors and containers of them
        if isinstance(value, (bool, int, float, str, type(None), torch.Tensor)):
            return True
        if depth < 4 and isinstance(value, (list, tuple, set)):
            return all(plain(v, depth + 1) for v in value)
        if depth < 4 and isinstance(value, dict):
            return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
        return False

    def copy_of(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _NOT_DATA if value.device.type == "meta" else value.detach().clone()  # meta: shapes, no values
        if isinstance(value, (list, tuple, dict, set)) and plain(value):
            return copy.deepcopy(value)
        return _NOT_DATA  # a model, a cache, a generator, a config, or a list of objects the exercise may update
    return [copy_of(a) for a in args]


def _identical(now: Any, before: Any) -> bool:
    if isinstance(before, torch.Tensor):
        return (isinstance(now, torch.Tensor) and now.dtype == before.dtype and now.shape == before.shape
                and bool(torch.equal(now.detach(), before)) if not before.is_floating_point()
                else isinstance(now, torch.Tensor) and now.shape == before.shape
                and bool(torch.equal(now.detach().nan_to_num(), before.nan_to_num())))
    if isinstance(before, (list, tuple)):
        return (type(now) is type(before) and len(now) == len(before)
                and all(_identical(a, b) for a, b in zip(now, before)))
    if isinstance(before, dict):
        return (isinstance(now, dict) and now.keys() == before.keys()
                and all(_identical(now[k], before[k]) for k in before))
    return now == before


def _first_change(now: Any, then: Any) -> str:
    """Where two same-shaped tensors first differ, as ' (first at [i, j]: a, now b)', or ''."""
    if not (isinstance(now, torch.Tensor) and isinstance(then, torch.Tensor) and now.shape == then.shape):
        return ""
    differs = (now.detach().to(then.dtype) != then) & ~(now.detach().to(then.dtype).isnan() & then.isnan())
    if not bool(differs.any()):
        return f" (its dtype changed from {then.dtype} to {now.dtype})" if now.dtype != then.dtype else ""
    at = tuple(int(i) for i in differs.nonzero()[0])
    return f" (first at {list(at)}: {then[at].item()!r}, now {now[at].item()!r})"


def expect_untouched(label: str, args: Sequence[Any], before: Sequence[Any]) -> None:
    """Fail when the learner's function changed an argument that :func:`snapshot_inputs` copied."""
    for i, (now, then) in enumerate(zip(args, before)):
        if then is not _NOT_DATA and not _identical(now, then):
            raise CheckFailure(f"{label} changed its argument {i + 1} in place{_first_change(now, then)}: it was "
                               f"{_short(then)}, afterwards {_short(now)}. The caller still needs its data: work on a "
                               "copy (list(x), x.clone()) and return a new value instead of changing the one you were "
                               "given.")


def close(got: Any, expected: float, rel: float = 1e-9, abs_tol: float = 0.0) -> bool:
    """True when got is a real number within tolerance of expected."""
    if isinstance(got, bool) or not isinstance(got, Real):
        return False
    got = float(got)
    if math.isinf(expected):
        return got == expected
    return math.isclose(got, expected, rel_tol=rel, abs_tol=abs_tol)


def _reproduces(mistake: Mistake, history: Sequence[tuple[tuple, Any]], rel: float) -> bool:
    """True when the mistake gives the learner's output (or crash) on every recorded input."""
    for args, got in history:
        try:
            wrong = mistake.fn(*args)
        except Exception as err:
            if not (isinstance(got, BaseException) and type(got) is type(err)):
                return False
            continue
        if isinstance(got, BaseException):
            return False
        agrees = close(got, float(wrong), rel=rel) if isinstance(wrong, Real) else same(wrong, got)
        if not agrees:
            return False
    return True


def same(a: Any, b: Any) -> bool:
    """Equality that also compares tensors and tuples of tensors."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        if a.is_floating_point() or b.is_floating_point():
            return bool(torch.allclose(a.double(), b.double(), atol=1e-9, equal_nan=True))
        return bool(torch.equal(a.long(), b.long()))  # token ids: int32 and int64 compare alike
    return a == b


def diagnose(mistakes: Iterable[Mistake], history: Sequence[tuple[tuple, Any]], rel: float = 1e-9) -> str:
    """The hint of the first catalogued mistake that reproduces everything the learner returned.

    Random samplers (a torch.Generator among the arguments) get no hint: a wrong sampler
    can agree with the learner's by chance."""
    if any(isinstance(a, torch.Generator) for args, _ in history for a in args):
        return ""
    for mistake in mistakes:
        if _reproduces(mistake, history, rel):
            return f" Hint (a known slip gives exactly this output): {mistake.hint}"
    return ""


def _label(fn: Callable, args: tuple, label: str | None) -> str:
    return label or f"{getattr(fn, '__name__', 'function')}({', '.join(fmt(a) for a in args)})"


def expect_equal(fn: Callable, args: tuple, expected: Any, label: str | None = None) -> None:
    """Visible test: fn(*args) == expected exactly (an int stays an int)."""
    label = _label(fn, args, label)
    got = call(fn, label, *args)
    if isinstance(expected, Integral) and isinstance(got, Real) and not isinstance(got, Integral):
        if float(got).is_integer() and int(got) == expected:
            raise CheckFailure(f"{label} returned the float {fmt(got)}; return an int (use // or int()).")
    if got != expected:
        hint = diagnose(for_exercise(fn.__name__), [(args, got)], rel=0.0)
        if dataclasses.is_dataclass(expected) and type(got) is type(expected):
            wrong = [f"{f.name} should be {getattr(expected, f.name)!r}, got {getattr(got, f.name)!r}"
                     for f in dataclasses.fields(expected) if getattr(got, f.name) != getattr(expected, f.name)]
            raise CheckFailure(f"{label}: " + "; ".join(wrong) + f".{hint}")
        raise CheckFailure(f"{label}: expected {fmt(expected)}, got {fmt(got)}.{where_lists_differ(expected, got)}{hint}")


def where_lists_differ(expected: Any, got: Any) -> str:
    """For two sequences (lists, tuples, strings, 1-D tensors), where they first differ and their lengths."""
    def as_list(x: Any) -> list | None:
        if isinstance(x, torch.Tensor) and x.dim() == 1:
            return x.tolist()
        if isinstance(x, (list, tuple, str)):
            return list(x)
        return None

    a, b = as_list(expected), as_list(got)
    if a is None or b is None or a == b:
        return ""
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f" They first differ at index {first} (expected length {len(a)}, yours {len(b)})."


def expect_close(fn: Callable, args: tuple, expected: float, label: str | None = None, rel: float = 1e-6) -> None:
    """Visible test: fn(*args) equals expected up to a relative tolerance."""
    label = _label(fn, args, label)
    got = call(fn, label, *args)
    if not close(got, expected, rel=rel):
        hint = diagnose(for_exercise(fn.__name__), [(args, got)], rel=rel)
        raise CheckFailure(f"{label}: expected {fmt(expected)} (relative tolerance {rel:g}), got {fmt(got)}.{hint}")


def count_torch_calls(fn: Callable, *args: Any) -> int:
    """How many torch functions and tensor methods one call of fn makes (to spot Python loops)."""
    with torch_calls() as counts:
        fn(*args)
    return sum(counts.values())


def torch_function_names(fn: Callable, *args: Any) -> set[str]:
    """Names of the torch functions and tensor methods fn calls (tolist, unbind for iteration, ...)."""
    with torch_calls() as counts:
        fn(*args)
    return set(counts)


def expect_no_loop_over(fn: Callable, label: str, small: tuple, large: tuple, what: str) -> None:
    """Fail if fn makes more torch calls on the larger input: a Python loop over ``what``."""
    few, many = count_torch_calls(fn, *small), count_torch_calls(fn, *large)
    if many > few:
        raise CheckFailure(
            f"{label}: {few} torch operations on the small input but {many} on the larger one, so there is a Python "
            f"loop over {what}. Use whole-tensor operations (comparisons, cumprod, gather, where) instead."
        )


def upstream_note(fn: Callable, requires: Sequence[tuple[str, Callable[[Callable], None]]]) -> str:
    """If fn calls another exercise of the learner's that fails its own check, say so."""
    learner_globals = getattr(fn, "__globals__", {})
    for name, check in requires:
        upstream = learner_globals.get(name)
        if upstream is None:
            continue
        try:
            check(upstream)
        except CheckFailure:
            return f" ({fn.__name__} calls your {name}, which fails its own test: fix that first.)"
    return ""


def call_recorded(fn: Callable, label: str, args: tuple, mistakes: Sequence[Mistake], history: list,
                  requires: Sequence[tuple[str, Callable[[Callable], None]]] = (), rel: float = 1e-9,
                  named: Callable | None = None, changes_inputs: bool = False) -> Any:
    """fn(*args) inside a check that keeps a history for :func:`diagnose`: an exception becomes a CheckFailure
    naming the input and the likely mistake (or the failing exercise fn calls). ``named``: the learner's function
    when fn wraps it. Unless ``changes_inputs``, changing a list or tensor argument in place fails."""
    before = None if changes_inputs else snapshot_inputs(args)
    rng = global_rng_state(args)
    try:
        result = fn(*args)
        if before is not None:
            expect_untouched(label, args, before)
        expect_no_global_draws(label, rng)
        return result
    except NotImplementedError as err:
        raise not_implemented(named or fn, label, err) from None
    except CheckFailure:
        raise
    except Exception as err:
        history.append((args, err))
        note = upstream_note(named or fn, requires)
        hint = "" if note else diagnose(mistakes, history, rel=rel)
        raise CheckFailure(f"{label} raised {type(err).__name__}: {err}.{hint}{note}") from None


def compare_cases(
    fn: Callable,
    reference: Callable,
    cases: Iterable[tuple[str, tuple]],
    *,
    rel: float = 1e-9,
    integer: bool = False,
    requires: Sequence[tuple[str, Callable[[Callable], None]]] = (),
    plain: bool = False,
) -> int:
    """Run fn and reference on every case (description, args); fail on the first disagreement,
    naming the input and, when a catalogued mistake reproduces every answer so far, its hint. ``plain``: the answer
    must be a Python float or int (a Fraction or a Decimal is a number, but not the float the statement promises).
    Returns the number of cases checked."""
    name = reference.__name__  # the learner implements the function of the same name
    mistakes = for_exercise(name)
    history: list[tuple[tuple, Any]] = []
    count = 0
    for description, args in cases:
        label = f"{name}({description})"
        expected = reference(*args)
        before = snapshot_inputs(args)
        try:
            got = fn(*args)
        except NotImplementedError as err:
            raise not_implemented(fn, label, err) from None
        except Exception as err:
            history.append((args, err))
            note = upstream_note(fn, requires)  # a wrong function this one calls explains it better than a hint
            hint = "" if note else diagnose(mistakes, history, rel=rel)
            raise CheckFailure(f"{label} raised {type(err).__name__}: {err}.{hint}{note}") from None
        expect_untouched(label, args, before)
        if isinstance(got, torch.Tensor):
            raise CheckFailure(f"{label} returned a tensor ({got!r}); return a Python {'int' if integer else 'float'} "
                               f"(use {'int' if integer else 'float'}(...) or .item()).")
        if integer and isinstance(got, Real) and not (isinstance(got, int) and not isinstance(got, bool)):
            kind = type(got).__name__ if type(got).__module__ == "builtins" else f"{type(got).__module__}.{type(got).__name__}"
            raise CheckFailure(f"{label} returned {fmt(got)} of type {kind}; return an int (a Python int: int(...) "
                               "around a numpy or torch number).")
        if plain and not (isinstance(got, (int, float)) and not isinstance(got, bool)):
            raise CheckFailure(f"{label} returned {got!r} of type {type(got).__module__}.{type(got).__qualname__}; "
                               "return a Python float (float(...) around it).")
        history.append((args, got))
        if not close(got, expected, rel=rel):
            note = upstream_note(fn, requires)
            hint = "" if note else diagnose(mistakes, history, rel=rel)
            relative = (abs(float(got) - float(expected)) / max(abs(float(expected)), 1e-300)
                        if isinstance(got, Real) and not isinstance(got, bool) else 1.0)
            if fmt(got) == fmt(expected) or (rel > 0 and relative < 1e-5):  # past the digits a person reads: say how far
                kind = type(got).__name__
                kind = kind if type(got).__module__ == "builtins" else f"{type(got).__module__}.{kind}"
                advice = "" if hint or note else (": compute in float64 (Python floats), not float32, and do not "
                                                  "round")
                raise CheckFailure(f"{label}: expected {expected!r}, got {got!r} ({kind}): they differ by "
                                   f"{abs(float(got) - float(expected)) / max(abs(float(expected)), 1e-300):.1e} "
                                   f"relatively, more than the {rel:g} allowed{advice}.{hint}{note}")
            raise CheckFailure(f"{label}: expected {fmt(expected)}, got {fmt(got)}.{hint}{note}")
        count += 1
    return count


def expect_reproducible(fn: Callable, label: str, make_args: Callable[[int], tuple], seeds: Sequence[int] = (0, 1, 2)) -> None:
    """The statement promises seeded reproducibility: fn(*make_args(seed)) twice, with torch's global
    RNG in different states, must give the same result. An answer that draws from the global RNG
    (torch.rand without generator=...) instead of the generator it was given fails. The global RNG
    is restored afterwards."""
    state = torch.get_rng_state()
    try:
        for seed in seeds:
            results = []
            for global_seed in (1_000 + seed, 2_000 + seed):
                torch.manual_seed(salted(global_seed))
                results.append(call(fn, label, *make_args(seed)))
            if not same(_comparable(results[0]), _comparable(results[1])):
                raise CheckFailure(
                    f"{label}: called twice with a generator seeded {seed}, it returned {_short(results[0])} and then "
                    f"{_short(results[1])}. Draw every random number from the generator you are given "
                    "(torch.rand(..., generator=generator), torch.multinomial(..., generator=generator), or "
                    "specdec.sampling.sample(probs, generator)), never from torch's global random state: the same "
                    "seed must give the same result.")
    finally:
        torch.set_rng_state(state)


def _comparable(value: Any) -> Any:
    """Lists become tuples (recursively) so that ``same`` can compare nested results."""
    if isinstance(value, (list, tuple)):
        return tuple(_comparable(v) for v in value)
    return value


def _short(value: Any) -> str:
    text = repr(value.tolist() if isinstance(value, torch.Tensor) else value)
    return text if len(text) < 120 else text[:117] + "..."


def single_threaded(check: Callable) -> Callable:
    """Run a check on one torch thread (restored afterwards). Checks make thousands of tiny forwards;
    on a busy machine (a shared grading server, a laptop doing other work) PyTorch's thread pool makes
    each of them many times slower, and a correct answer could run past nbgrader's per-cell limit."""
    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return check(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run


@contextlib.contextmanager
def uniforms_at_zero():
    """While inside, every uniform drawn with torch.rand, torch.rand_like or Tensor.uniform_ is exactly 0 (a draw that
    U[0, 1) allows): the one input that tells an acceptance test ``u < p / q`` from ``u <= p / q``, which accepts a
    token of probability 0. Sampling with torch.multinomial is left as it is."""
    with fixed_uniforms(top=False):
        yield


@contextlib.contextmanager
def uniforms_just_below_one():
    """While inside, every uniform is the largest value below 1 of the dtype it is drawn in (1 - 2**-53 in float64,
    1 - 2**-24 in float32). A float64 test ``u < p / q`` then rejects a ratio of 1 - 2e-10; a float32 uniform, or a
    ratio rounded to float32 (it becomes 1.0), accepts it: the input that shows float32 where float64 is prescribed."""
    with fixed_uniforms(top=True):
        yield




def is_int_list(values: Any) -> bool:
    """A list of Python ints (not tensors, not bools): what "a list of ints" promises."""
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def describe_types(values: Any) -> str:
    """'a list of Tensor' / 'a tuple of int': what a learner returned, for a type mismatch message."""
    if isinstance(values, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in values})
        return f"a {type(values).__name__} of {' and '.join(kinds) or 'nothing'}"
    return f"a {type(values).__name__}"


def expect_value_error(fn: Callable, label: str, *args: Any, why: str, error: type[Exception] = ValueError) -> None:
    """The statement promises a ValueError (or ``error``) for this bad input (the course's rule: bad input gets a
    clear error, never a silent wrong number)."""
    try:
        got = fn(*args)
    except error:
        return
    except NotImplementedError as err:
        raise not_implemented(fn, label, err) from None
    except Exception as err:
        raise CheckFailure(f"{label} raised {type(err).__name__}: {err}; expected a {error.__name__} ({why}).") from None
    raise CheckFailure(f"{label} returned {fmt(got)}; expected a {error.__name__}: {why}.")
