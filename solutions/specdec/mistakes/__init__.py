"""The catalogue of known-wrong implementations, one module per notebook.

Each :class:`Mistake` is a plausible wrong answer to one exercise, with the hint a
learner should read when their output matches it. The test suite proves that every
check rejects every mistake aimed at it; the checks use the catalogue to explain a
failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mistake:
    """A wrong implementation of ``exercise`` and what it gets wrong."""

    exercise: str
    name: str
    fn: Callable[..., Any]
    hint: str


#: The modules of the catalogue, one per notebook.
MODULES = ("ledger", "greedy", "rejection", "chain", "engine", "lookup", "tree", "kernels", "analysis", "pitfalls",
           "serving", "drafters", "production", "frontier", "questions2026")


#: The catalogue's modules that need Triton (notebook 08's kernels): left out where it is not installed (a Mac), so
#: every other notebook's checks still find their mistakes there.
NEED_TRITON = ("kernels",)


def catalogue() -> list[Mistake]:
    """Every catalogued mistake of the course (notebook 08's only where Triton is installed)."""
    import importlib

    from specdec.models.devices import triton_installed

    names = MODULES if triton_installed() else tuple(name for name in MODULES if name not in NEED_TRITON)
    return [m for name in names for m in importlib.import_module(f"specdec.mistakes.{name}").MISTAKES]


def for_exercise(exercise: str) -> list[Mistake]:
    """The catalogued mistakes aimed at one exercise (a function name)."""
    return [m for m in catalogue() if m.exercise == exercise]
