"""Shared helpers: the course's notebooks, one release and autograde round trip per test session, and the
background thread that runs the slow nbgrader work beside the in-process tests."""

from __future__ import annotations

import ast
import copy
import functools
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
import torch

from specdec.course import driver as course, reference_calls
from specdec.paths import NOTEBOOKS_DIR, SOURCE_DIR

SLUGS = course.assignments()
# The tests parse source (the import graph, notebook cells) while the background thread grades: every ast.parse of
# this process goes through the package's lock (reference_calls.parse: CPython 3.11's AST constructor is not safe
# in two threads at once).
ast.parse = reference_calls.parse


@functools.cache
def measured_costs(target, draft) -> tuple:
    """The forward costs a serving engine for this pair measures the first time a row asks for gamma "auto"
    (``ServingEngine.measure_costs()``, its full default grid: 2 s for a tiny pair, 13 s for the shipped one),
    measured once per pair per session: pass them as ``costs=`` to engines whose test is not about measuring."""
    from specdec.serving.engine import ServingEngine

    return ServingEngine(target, draft).measure_costs()


def source_path(slug: str) -> Path:
    return SOURCE_DIR / slug / f"{slug}.ipynb"


def student_path(slug: str) -> Path:
    return NOTEBOOKS_DIR / f"{slug}.ipynb"


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def graded_cells(nb) -> list:
    """The autograded test cells (locked code cells with points)."""
    return [c for c in nb.cells if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]


def manual_cells(nb) -> list:
    """Written answers an instructor grades (nbgrader's "manually graded answer" cells)."""
    return [c for c in nb.cells if nbgrader_meta(c).get("grade") and nbgrader_meta(c).get("solution")]


def split_hidden(source: str) -> tuple[str, str]:
    """(visible part, hidden part) of a test cell."""
    if "### BEGIN HIDDEN TESTS" not in source:
        return source, ""
    before, rest = source.split("### BEGIN HIDDEN TESTS", 1)
    hidden, after = rest.split("### END HIDDEN TESTS", 1)
    return before + after, hidden


def _bound_names(tree: ast.AST) -> set[str]:
    """Names a cell binds at its top level: assignments, definitions, imports, loop and with targets."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    return bound


def _used_names(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def prune_for_blank(nb: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, int]:
    """The student notebook without the code cells no graded cell depends on, and how many were dropped.

    A blank skeleton scores zero whatever its demonstrations compute, so they need not run: every nbgrader
    cell is kept, and so is every other code cell that binds a name a kept cell below it reads (transitively).
    No graded cell can then fail for a name that pruning removed: it fails because the skeleton is blank."""
    keep, needed = [True] * len(nb.cells), set()
    for i in range(len(nb.cells) - 1, -1, -1):
        cell = nb.cells[i]
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # a magic or shell line: keep it, it may set something up
            continue
        if not nbgrader_meta(cell) and not (_bound_names(tree) & needed):
            keep[i] = False
            continue
        needed |= _used_names(tree)
    pruned = copy.deepcopy(nb)
    pruned.cells = [c for c, k in zip(nb.cells, keep) if k]
    return pruned, keep.count(False)


def cell_errors(notebook_path: Path) -> list[str]:
    """Every error an executed notebook's code cells raised, as 'cell N: Name: message'."""
    errors = []
    for i, cell in enumerate(read(notebook_path).cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error":
                errors.append(f"cell {i} ({nbgrader_meta(cell).get('grade_id', 'no grade_id')}): "
                              f"{out.get('ename')}: {(out.get('evalue') or '').strip()[:300]}")
    return errors


@dataclass
class RoundTrip:
    """The nbgrader round trip of every notebook: the released student notebook, the grades of the source
    notebook (student "solution") and of the pruned blank one (student "blank"), and the errors the
    executed source notebook raised outside graded cells (the notebook-runs check nbval used to make)."""

    released: dict[str, nbformat.NotebookNode] = field(default_factory=dict)
    grades: dict[tuple[str, str], list[course.CellGrade]] = field(default_factory=dict)
    solution_errors: dict[str, list[str]] = field(default_factory=dict)
    pruned_cells: dict[str, int] = field(default_factory=dict)


# --- Slow pipeline work in the background -------------------------------------------------------------------
# nbgrader runs in subprocesses that keep a core busy for minutes while the in-process tests need the other.
# A job registered here starts right after collection, if a selected test uses the fixture of the same name,
# and runs in its lane's background thread (a lane's jobs one after another, in registration order; the
# lanes side by side: nbgrader's, and the catalogued mistakes' notebook cells); the fixture waits for its
# result. Pipeline tests run last, so the in-process tests overlap the jobs.

BACKGROUND_JOBS: dict[str, Callable[[Path], object]] = {}
_results: dict[str, Future] = {}
_scratch: list[Path] = []
_seconds: dict[str, float] = {}  # each background job's wall time, printed at the end of the session
# CPU seconds, the suite's budget (tests/budget.json): each in-process test's (its thread's time: the background lane
# does not count), each background job's (its thread's time and its subprocesses', reaped while it ran)
_test_cpu: dict[str, float] = {}
_job_cpu: dict[str, float] = {}


_reaped = threading.local()  # per thread: CPU seconds of the subprocesses it waited for (their children included)
_waitpid = os.waitpid


def _waitpid_counting(pid: int, options: int) -> tuple[int, int]:
    """os.waitpid, through os.wait4 so that the finished child's CPU time is added to the thread that waited for it
    (subprocess and multiprocessing wait through os.waitpid): a lane's time includes the processes it ran."""
    done, status, usage = os.wait4(pid, options)
    if done:
        _reaped.cpu = getattr(_reaped, "cpu", 0.0) + usage.ru_utime + usage.ru_stime
    return done, status


os.waitpid = _waitpid_counting


def _children_cpu() -> float:
    """CPU seconds of the subprocesses this thread has waited for."""
    return getattr(_reaped, "cpu", 0.0)


_selected: list[str] = []  # the node ids of the tests this session runs


def selected_nodeids() -> list[str]:
    """The tests this session runs (a background job may compute only what they need)."""
    return list(_selected)


_lane_of: dict[str, str] = {}  # job -> the background thread that runs it


def background_job(fixture_name: str, lane: str = "nbgrader"):
    """Register ``fn(scratch_dir) -> result`` as the work behind the session fixture ``fixture_name``; the jobs of
    one ``lane`` run one after another in one thread, lanes side by side."""
    def register(fn):
        BACKGROUND_JOBS[fixture_name] = fn
        _lane_of[fixture_name] = lane
        return fn
    return register


def background_result(fixture_name: str):
    """The result of a background job (waiting for it), or its exception raised here."""
    if fixture_name not in _results:  # not started after collection (an unusual selection): run it now
        _start([fixture_name])
    return _results[fixture_name].result()


def _start(names: list[str]) -> None:
    futures = {name: Future() for name in names}
    _results.update(futures)
    for lane in dict.fromkeys(_lane_of[name] for name in names):
        _start_lane(lane, {name: future for name, future in futures.items() if _lane_of[name] == lane})


def _start_lane(lane: str, futures: dict[str, Future]) -> None:
    def run() -> None:
        # below the in-process tests' priority (Linux: this thread, and the subprocesses it starts): the in-process
        # lane is the longer one, and the jobs take what it leaves of the 2 cores
        os.nice(10)
        for name, future in futures.items():
            scratch = Path(tempfile.mkdtemp(prefix=f"specdec-{name}-"))
            _scratch.append(scratch)
            start, cpu = time.perf_counter(), time.thread_time() + _children_cpu()
            try:
                future.set_result(BACKGROUND_JOBS[name](scratch))
            except BaseException as error:  # handed to the tests that need it
                future.set_exception(error)
            _seconds[name] = time.perf_counter() - start
            _job_cpu[name] = time.thread_time() + _children_cpu() - cpu

    threading.Thread(target=run, name=f"background-{lane}", daemon=True).start()


@pytest.hookimpl(trylast=True)  # after -k and -m deselected: only the jobs the selected tests need start
def pytest_collection_modifyitems(session, config, items) -> None:
    # stable: pipeline tests last, the budget test after them
    items.sort(key=lambda item: (item.get_closest_marker("budget") is not None, item.get_closest_marker("pipeline") is not None))
    # `make test`'s selection: every test but the cohort suite (`make test-cohort`)
    config.whole_suite = (config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
                          and config.option.markexpr == "not cohort" and not config.option.deselect)
    _selected[:] = [item.nodeid for item in items]
    wanted = {name for item in items for name in getattr(item, "fixturenames", ())}
    names = [name for name in BACKGROUND_JOBS if name in wanted and name not in _results]
    if config.option.collectonly:  # nothing runs, so nothing to compute
        names = []
    if names:
        torch.set_num_threads(1)  # one thread per process: the in-process tests and the background jobs share 2 cores
        _start(names)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.thread_time() + _children_cpu()
    yield
    _test_cpu[item.nodeid] = time.thread_time() + _children_cpu() - start


def lane_cpu() -> dict[str, float]:
    """CPU seconds of each lane so far: the in-process tests, the background jobs (finished ones)."""
    return {"in-process": sum(_test_cpu.values()), "background": sum(_job_cpu.values())}


def slowest(count: int = 20) -> list[tuple[str, float]]:
    """The ``count`` slowest tests and background jobs, by CPU seconds."""
    every = [*_test_cpu.items(), *((f"background job {name}", cpu) for name, cpu in _job_cpu.items())]
    return sorted(every, key=lambda pair: -pair[1])[:count]


def pytest_terminal_summary(terminalreporter) -> None:
    if _seconds:
        jobs = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in _seconds.items())
        terminalreporter.write_line(f"background jobs (wall time; lanes side by side, jobs in a lane in turn): {jobs}")
    if _test_cpu:
        lanes = ", ".join(f"{lane} {cpu:.0f} s" for lane, cpu in lane_cpu().items())
        terminalreporter.write_line(f"CPU time by lane: {lanes}; the slowest 20 (CPU seconds):")
        for name, cpu in slowest():
            terminalreporter.write_line(f"  {cpu:7.1f}  {name}")


BUDGET_FILE = Path(__file__).with_name("budget.json")


def pytest_addoption(parser) -> None:
    parser.addoption("--write-budget", action="store_true",
                     help=f"after a passing run of the whole suite, write its CPU time per lane into {BUDGET_FILE.name}")


def wait_for_background_jobs() -> None:
    for future in _results.values():
        future.exception()


TIMES_FILE = Path(__file__).resolve().parent.parent / "artifacts" / "test-times.json"


def pytest_sessionfinish(session, exitstatus) -> None:
    wait_for_background_jobs()  # no nbgrader left running after the session
    if _test_cpu:  # this run's CPU seconds, per lane and per test (the budget test compares the lanes)
        TIMES_FILE.parent.mkdir(exist_ok=True)
        TIMES_FILE.write_text(json.dumps({"lanes": lane_cpu(), "background_jobs": _job_cpu, "tests": _test_cpu,
                                          "background_wall_s": _seconds}, indent=1) + "\n")
    if session.config.getoption("--write-budget"):
        if exitstatus != 0 or not getattr(session.config, "whole_suite", False):
            print(f"\n--write-budget: {BUDGET_FILE.name} left as it was (only a passing run of the whole suite is written)")
        else:
            budget = {"lanes": {lane: round(cpu) for lane, cpu in lane_cpu().items()}, "tests": len(session.items),
                      "measured": time.strftime("%Y-%m-%d") + ", CPU seconds (not wall): the in-process tests' thread, "
                                  "the background jobs' thread and subprocesses"}
            BUDGET_FILE.write_text(json.dumps(budget, indent=1) + "\n")
    for scratch in _scratch:
        shutil.rmtree(scratch, ignore_errors=True)


#: As on a Mac: ``import triton`` fails in every process (tests/no_triton/sitecustomize.py) except the kernels that run
#: notebook 08, whose working folder nbgrader names after it.
NO_TRITON = Path(__file__).with_name("no_triton")
WITHOUT_TRITON_BUT_FOR_08 = {"PYTHONPATH": os.pathsep.join(filter(None, [str(NO_TRITON), os.environ.get("PYTHONPATH")])),
                             "HIDE_TRITON_EXCEPT": "08_gpu_kernels"}


@background_job("roundtrip")
def _round_trip(root: Path) -> RoundTrip:
    """Release every notebook and autograde its source (full marks expected) and its pruned blank student
    notebook (zero expected) in one scratch course: one nbgrader call each, every source notebook executed
    once, one torch thread per kernel; every notebook but 08 without triton, as on a Mac."""
    result = RoundTrip()
    course.make_course(root, SLUGS)
    course.run_nbgrader(root, "generate_assignment", "*", "--force")
    for slug in SLUGS:
        result.released[slug] = read(root / "release" / slug / f"{slug}.ipynb")
        assert result.released[slug].cells, f"nbgrader released an empty {slug}"
        blank, result.pruned_cells[slug] = prune_for_blank(read(student_path(slug)))
        course.submit(root, slug, "solution", source_path(slug))
        course.submit(root, slug, "blank", blank)
    course.autograde(root, "*", threads=1, env=WITHOUT_TRITON_BUT_FOR_08)
    for slug in SLUGS:
        result.solution_errors[slug] = cell_errors(root / "autograded" / "solution" / slug / f"{slug}.ipynb")
        for student in ("solution", "blank"):
            result.grades[slug, student] = course.read_grades(root, slug, student)
    return result


@pytest.fixture(scope="session")
def roundtrip() -> RoundTrip:
    return background_result("roundtrip")


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A benchmark's main() sets torch's thread count to every core for its own run; put it back after each test.
    Left at 2 beside the background nbgrader job, small-tensor tests spin-wait and ran 10-20x slower (measured:
    test_eagle3's sampling test 13.6 s of CPU alone, 166 s after test_bench)."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
