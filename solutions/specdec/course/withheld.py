"""Inside a grading sandbox: the references of the graded notebook answer the package's own code only.

``specdec.course.sandbox.graded_build`` wraps each reference of the graded notebook's exercises with :func:`guard`.
A call from a function of the package (a helper the notebook gives the learner, built on the reference) runs the
reference; a call from anywhere else (the learner's cells, ``importlib``, ``vars(module)``) raises and leaves evidence
in the cell's output. This is a wall against copying an answer through the usual doors, not a vault: the reference
still lives in this process (a submission that digs it out of the wrapper's closure is not stopped here, and gains
nothing a learner could not write).
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

WITHHELD = "is withheld while grading"
_codes: dict[str, set[int]] = {}


def _code_ids(module: types.ModuleType) -> set[int]:
    found: set[int] = set()
    stack: list[Any] = [v for v in vars(module).values() if isinstance(v, (types.FunctionType, type))]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, type) and item.__module__ == module.__name__:
            stack += [v for v in vars(item).values() if isinstance(v, (types.FunctionType, staticmethod, classmethod,
                                                                          property))]
        elif isinstance(item, (staticmethod, classmethod)):
            stack.append(item.__func__)
        elif isinstance(item, property):
            stack += [f for f in (item.fget, item.fset) if f]
        elif isinstance(item, types.FunctionType) and item.__module__ == module.__name__:
            stack.append(item.__code__)
            stack += [c.cell_contents for c in item.__closure__ or () if isinstance(c.cell_contents, types.FunctionType)]
        elif isinstance(item, types.CodeType):
            found.add(id(item))
            stack += [c for c in item.co_consts if isinstance(c, types.CodeType)]
    return found


def _from_package(code: types.CodeType) -> bool:
    """True when code is a function of the package's lessons (not of specdec.course, which calls learners' code)."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "specdec" and not name.startswith("specdec.course") \
                and getattr(module, "__file__", None) == code.co_filename:
            if name not in _codes:
                _codes[name] = _code_ids(module)
            return id(code) in _codes[name]
    return False


def guard(reference: Callable) -> Callable:
    @functools.wraps(reference)
    def withheld(*args: Any, **kwargs: Any) -> Any:
        if not _from_package(sys._getframe(1).f_code):
            raise RuntimeError(f"{reference.__module__}.{reference.__name__} {WITHHELD}: the notebook grades your own "
                               "version of it")
        return reference(*args, **kwargs)

    del withheld.__wrapped__
    return withheld
