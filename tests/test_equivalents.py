"""The graded build holds no answer (issue 51): each graded exercise's reference is cut out of the sandbox's copy of
the package, its callers get the learner's own, and a helper that computes the same thing is found and watched."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import signal
import subprocess
import sys
import textwrap
import types

import matplotlib.pyplot as plt
import nbformat
import pytest

import specdec
from specdec.course import sandbox
from specdec.course.equivalents import EQUIVALENTS
from specdec.course.reference_calls import reference_calls
from specdec.course.withheld import WITHHELD
from test_checks import RUN_CHECK

LESSONS_ONLY = ("specdec.course", "specdec.checks", "specdec.mistakes", "specdec.bench")


def _required(fn) -> int | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return sum(p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in params)


def _public_functions() -> dict[str, types.FunctionType]:
    found = {}
    for info in pkgutil.walk_packages(specdec.__path__, "specdec."):
        if info.name.startswith(LESSONS_ONLY) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, types.FunctionType) and value.__module__ == info.name and not name.startswith("_"):
                found[f"{info.name}:{name}"] = value
    return found


class _TooLong(Exception):
    pass


@pytest.mark.cohort
def test_the_table_of_equivalent_helpers_is_complete():
    """Every public function of the lessons with as many required arguments as an exercise is run through that
    exercise's check; those that pass are the table (about 4,500 checks, a minute)."""
    def stop(*_):
        raise _TooLong

    functions, found = _public_functions(), {}
    previous = signal.signal(signal.SIGALRM, stop)
    try:
        for exercise, (reference, check) in sorted(RUN_CHECK.items()):
            arity = _required(reference)
            for name, fn in functions.items():
                if fn is reference or getattr(fn, "__name__", "") == exercise or not arity or _required(fn) != arity:
                    continue
                signal.alarm(20)
                try:
                    check(fn)
                except BaseException as err:  # a check's failure, or anything the wrong function raised
                    if isinstance(err, KeyboardInterrupt):
                        raise
                else:
                    found.setdefault(exercise, []).append(name)
                finally:
                    signal.alarm(0)
                    plt.close("all")
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert {k: tuple(sorted(v)) for k, v in found.items()} == EQUIVALENTS


def test_the_graded_build_has_no_reference_and_runs_the_learners_own(tmp_path):
    build = sandbox.graded_build(tmp_path, {"verify_chain", "count_params", "bonus_token"})
    chain_source = (build / "specdec" / "chain.py").read_text()
    assert "def verify_chain(" not in chain_source and "LearnersOwn('verify_chain'" in chain_source
    assert "def verify_chain_batched(" in chain_source  # not graded here: stays
    assert not list(build.rglob("*.pyc")) and not list(build.rglob("__pycache__"))
    program = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(build)!r})
        import specdec.ledger as ledger, specdec.sampling as sampling, torch
        from specdec.params import *
        def count_params(cfg):
            return 7
        print(ledger.count_params(None))  # the package's name runs the learner's function
        count_params = ledger.count_params  # the learner binds the reference: there is none
        try:
            count_params(None)
        except RuntimeError as err:
            print(err)
        def bonus_token(p, generator=None):
            return sampling.sample(p, generator)  # the helper that computes the same thing
        try:
            bonus_token(torch.tensor([0.5, 0.5]))
        except RuntimeError as err:
            print(err)
        print(int(sampling.sample(torch.tensor([0.0, 1.0]), None)))  # called from elsewhere, it works
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert lines[0] == "7", done.stdout + done.stderr
    assert WITHHELD in lines[1] and "specdec.ledger.count_params" in lines[1], lines
    assert WITHHELD in lines[2] and "specdec.sampling.sample" in lines[2] and "bonus_token" in lines[2], lines
    assert lines[3] == "1", lines


def test_an_answer_that_calls_an_equivalent_helper_is_flagged():
    exercise, helpers = next(iter(EQUIVALENTS.items()))
    module, name = helpers[0].split(":")
    source = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"def {exercise}(p, generator=None):\n    raise NotImplementedError()",
        metadata={"nbgrader": {"solution": True, "grade_id": "answer"}})])
    submission = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(f"import {module} as helpers"),
        nbformat.v4.new_code_cell(f"def {exercise}(p, generator=None):\n    return helpers.{name}(p, generator)",
                                  metadata={"nbgrader": {"solution": True, "grade_id": "answer"}})])
    found = reference_calls(submission, source)
    assert found and f"{module}.{name}" in found[0] and "computes what" in found[0], found
