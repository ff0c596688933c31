"""Building blocks of the checks: comparing a learner's result and explaining a failure."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from numbers import Integral, Real
from typing import Any

from specdec.mistakes import Mistake


class CheckFailure(AssertionError):
    """A learner's function gave a wrong answer; the message says how to fix it."""


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


def call(fn: Callable, label: str, *args: Any) -> Any:
    """Call the learner's function, turning an exception into a readable failure."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise CheckFailure(f"{label}: not implemented yet (the skeleton still raises NotImplementedError)") from None
    except CheckFailure:
        raise
    except Exception as err:  # the learner's bug, reported with its input
        raise CheckFailure(f"{label} raised {type(err).__name__}: {err}") from None


def close(got: Any, expected: float, rel: float = 1e-9, abs_tol: float = 0.0) -> bool:
    """True when got is a real number within tolerance of expected."""
    if isinstance(got, bool) or not isinstance(got, Real):
        return False
    got = float(got)
    if math.isinf(expected):
        return got == expected
    return math.isclose(got, expected, rel_tol=rel, abs_tol=abs_tol)


def diagnose(mistakes: Iterable[Mistake], got: Any, args: tuple, rel: float = 1e-9) -> str:
    """The hint of the first catalogued mistake that reproduces the learner's result."""
    for mistake in mistakes:
        try:
            wrong = mistake.fn(*args)
        except Exception:
            continue
        if isinstance(wrong, Real) and close(got, float(wrong), rel=rel):
            return f" This is what you get when: {mistake.hint}"
    return ""


def expect_equal(got: Any, expected: Any, label: str, hint: str = "") -> None:
    """Visible-test helper: exact equality, with both values in the message."""
    if isinstance(expected, Integral) and isinstance(got, Real) and not isinstance(got, Integral):
        if float(got).is_integer() and int(got) == expected:
            raise CheckFailure(f"{label} returned the float {fmt(got)}; return an int (use // or int()).")
    if got != expected:
        raise CheckFailure(f"{label}: expected {fmt(expected)}, got {fmt(got)}.{(' ' + hint) if hint else ''}")


def expect_close(got: Any, expected: float, label: str, rel: float = 1e-6, hint: str = "") -> None:
    """Visible-test helper: equality up to a relative tolerance."""
    if not close(got, expected, rel=rel):
        raise CheckFailure(
            f"{label}: expected {fmt(expected)} (relative tolerance {rel:g}), got {fmt(got)}."
            f"{(' ' + hint) if hint else ''}"
        )


def compare_cases(
    fn: Callable,
    reference: Callable,
    cases: Iterable[tuple[str, tuple]],
    mistakes: Iterable[Mistake] = (),
    *,
    rel: float = 1e-9,
    integer: bool = False,
    note: str = "",
) -> int:
    """Run fn and reference on every case; fail on the first disagreement.

    Each case is (description, args). Returns the number of cases checked.
    """
    mistakes = list(mistakes)
    name = reference.__name__  # the learner implements the function of the same name
    count = 0
    for description, args in cases:
        label = f"{name}({description})"
        expected = reference(*args)
        got = call(fn, label, *args)
        if integer and isinstance(got, Real) and not isinstance(got, Integral):
            raise CheckFailure(f"{label} returned {fmt(got)} of type {type(got).__name__}; return an int.")
        if not close(got, expected, rel=rel):
            message = f"{label}: expected {fmt(expected)}, got {fmt(got)}."
            message += diagnose(mistakes, got, args, rel=rel)
            raise CheckFailure(message + (f" {note}" if note else ""))
        count += 1
    return count
