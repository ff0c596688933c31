"""Shared helpers: the course's notebooks, and one release and autograde round trip per test session."""

from __future__ import annotations

import ast
import copy
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from specdec.course import driver as course
from specdec.paths import NOTEBOOKS_DIR, SOURCE_DIR

SLUGS = course.assignments()


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
    """One nbgrader round trip per notebook: the released student notebook, the grades of the source
    notebook (student "solution") and of the pruned blank one (student "blank"), and the errors the
    executed source notebook raised outside graded cells (the notebook-runs check nbval used to make)."""

    released: dict[str, nbformat.NotebookNode] = field(default_factory=dict)
    grades: dict[tuple[str, str], list[course.CellGrade]] = field(default_factory=dict)
    solution_errors: dict[str, list[str]] = field(default_factory=dict)
    pruned_cells: dict[str, int] = field(default_factory=dict)


@pytest.fixture(scope="session")
def roundtrip(tmp_path_factory) -> RoundTrip:
    """Release every notebook and autograde its source (full marks expected) and its pruned blank
    student notebook (zero expected): each source notebook executes once. Two graders run side by side,
    each in its own scratch course (its own gradebook) with one torch thread per kernel, taking the next
    notebook when they finish one."""
    pending, result, lock = list(SLUGS), RoundTrip(), threading.Lock()

    def worker(root: Path) -> None:
        while True:
            with lock:
                if not pending:
                    return
                slug = pending.pop(0)
            course.make_course(root, [slug])
            released = read(course.generate(root, slug))
            assert released.cells, f"nbgrader released an empty {slug}"
            blank, dropped = prune_for_blank(read(student_path(slug)))
            course.submit(root, slug, "solution", source_path(slug))
            course.submit(root, slug, "blank", blank)
            course.autograde(root, slug, threads=1)
            with lock:
                result.released[slug], result.pruned_cells[slug] = released, dropped
                result.solution_errors[slug] = cell_errors(root / "autograded" / "solution" / slug / f"{slug}.ipynb")
                for student in ("solution", "blank"):
                    result.grades[slug, student] = course.read_grades(root, slug, student)

    roots = [tmp_path_factory.mktemp(f"course{i}") for i in range(2)]
    with ThreadPoolExecutor(len(roots)) as pool:
        for done in [pool.submit(worker, root) for root in roots]:
            done.result()
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)
    return result
