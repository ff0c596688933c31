"""Inside a grading sandbox: the graded exercises' references are absent, and the package's code runs the learner's.

``specdec.course.sandbox.graded_build`` removes each reference of the graded notebook's exercises from its copy of the
package (source and bytecode) and puts a :class:`LearnersOwn` in its place: a call from the package's own code (a
helper the notebook gives the learner, built on the exercise) runs the learner's function of that name. A submission
that reaches for the reference (an import, ``importlib``, ``vars(module)``) finds the stand-in, which says so in the
cell's output: evidence the grader holds for review. A package helper that computes the same thing as an exercise
(``specdec.course.equivalents``) stays, watched (:func:`watch`): called from inside the learner's function of that
exercise, it refuses, and that is evidence too.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

WITHHELD = "is withheld while grading"
_active = threading.local()


def _learners_namespace() -> dict[str, Any]:
    """The namespace the notebook's cells run in (IPython's, in a kernel)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell.user_ns if shell is not None else vars(sys.modules["__main__"])


class LearnersOwn:
    """Where the reference of ``exercise`` was: its callers get the learner's ``exercise``."""

    __withheld__ = True  # what the package's own code looks for (the drill leaves out questions built on one)

    def __init__(self, exercise: str, module: str):
        self.exercise, self.__name__, self.__module__ = exercise, exercise, module
        self.__qualname__ = exercise

    def _learners(self) -> Any:
        found = _learners_namespace().get(self.exercise)
        if isinstance(found, LearnersOwn):
            raise RuntimeError(f"{self.__module__}.{self.exercise} {WITHHELD}: the notebook grades your own version "
                               "of it")
        if found is None:
            raise NameError(f"{self.__module__}.{self.exercise} runs your own {self.exercise} here (the course's answer "
                            f"is not in this package): define {self.exercise} first, in its exercise's cell")
        return found

    def _entered(self) -> bool:
        return self in getattr(_active, "stack", ())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._entered():  # the learner's function, reached through this stand-in, came back to it
            raise RuntimeError(f"{self.__module__}.{self.exercise} {WITHHELD}: your {self.exercise} calls the "
                               "package's, which is graded as yours")
        target = self._learners()
        stack = getattr(_active, "stack", ())
        _active.stack = (*stack, self)
        try:
            return target(*args, **kwargs)
        finally:
            _active.stack = stack

    def __getitem__(self, grid: Any) -> Any:  # a Triton kernel: kernel[grid](...)
        return self._learners()[grid]

    def __repr__(self) -> str:
        return f"<{self.__module__}.{self.exercise}: the learner's own while grading>"


def watch(helper: Callable, exercise: str) -> Callable:
    """``helper`` computes what ``exercise`` asks for: it refuses when called from inside the learner's
    ``exercise``."""
    @functools.wraps(helper)
    def watched(*args: Any, **kwargs: Any) -> Any:
        learners = _learners_namespace()
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == exercise and frame.f_globals is learners:
                raise RuntimeError(f"{helper.__module__}.{helper.__name__} {WITHHELD} inside {exercise}: it computes "
                                   f"what {exercise} asks for")
            frame = frame.f_back
        return helper(*args, **kwargs)

    del watched.__wrapped__
    return watched
