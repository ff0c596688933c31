"""Shared helpers: the course's notebooks, and one autograde round trip per test session."""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from specdec import course
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


@pytest.fixture(scope="session")
def roundtrip(tmp_path_factory) -> dict[tuple[str, str], list[course.CellGrade]]:
    """Autograde every source notebook (as student 'solution') and every student notebook
    (as student 'blank'); grades by (slug, student). Two graders run side by side, each in its
    own scratch course (its own gradebook) with one torch thread per kernel, taking the next
    notebook when they finish one."""
    pending, grades, lock = list(SLUGS), {}, threading.Lock()

    def worker(root: Path) -> None:
        while True:
            with lock:
                if not pending:
                    return
                slug = pending.pop(0)
            course.make_course(root, [slug])
            released = course.generate(root, slug)
            course.submit(root, slug, "solution", source_path(slug))
            course.submit(root, slug, "blank", student_path(slug))
            assert read(released).cells, f"nbgrader released an empty {slug}"
            course.autograde(root, slug, threads=1)
            for student in ("solution", "blank"):
                grades[slug, student] = course.read_grades(root, slug, student)

    roots = [tmp_path_factory.mktemp(f"course{i}") for i in range(2)]
    with ThreadPoolExecutor(len(roots)) as pool:
        for done in [pool.submit(worker, root) for root in roots]:
            done.result()
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)
    return grades
