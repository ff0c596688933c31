"""Shared helpers: the course's notebooks, and one autograde round trip per test session."""

from __future__ import annotations

import shutil
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
    (as student 'blank') in one scratch course; grades by (slug, student)."""
    root = course.make_course(tmp_path_factory.mktemp("course"), SLUGS)
    grades = {}
    for slug in SLUGS:
        released = course.generate(root, slug)
        course.submit(root, slug, "solution", source_path(slug))
        course.submit(root, slug, "blank", student_path(slug))
        assert read(released).cells, f"nbgrader released an empty {slug}"
        course.autograde(root, slug)
        for student in ("solution", "blank"):
            grades[slug, student] = course.read_grades(root, slug, student)
    shutil.rmtree(root, ignore_errors=True)
    return grades
