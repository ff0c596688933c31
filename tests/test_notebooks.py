"""The notebook pipeline: sources are well formed, notebooks/ is in sync and leaks nothing,
solution cells equal the package, and the autograde round trip gives full marks / zero."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re

import nbformat
import pytest

import specdec
from conftest import (
    SLUGS,
    graded_cells,
    manual_cells,
    nbgrader_meta,
    prune_for_blank,
    read,
    source_path,
    split_hidden,
    student_path,
)
from specdec.course.release import comparable_cells

GRADE_ID = re.compile(r"^[A-Za-z0-9_-]+$")


def test_course_has_notebooks():
    assert SLUGS and SLUGS[0] == "01_cost_ledger"


@pytest.mark.parametrize("slug", SLUGS)
def test_source_notebook_is_well_formed(slug):
    nb = read(source_path(slug))
    assert nb.metadata.kernelspec.name == "python3"
    ids = [nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c)]
    assert len(ids) == len(set(ids)), f"duplicate grade_id in {slug}"
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{slug}: commit source notebooks without outputs"
        if not meta:
            continue
        assert meta["schema_version"] == 3 and GRADE_ID.match(meta["grade_id"])
        if meta.get("solution"):
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source, meta["grade_id"]
        if meta.get("grade") and meta.get("solution"):  # a written answer: markdown, its rubric in the solution
            assert cell.cell_type == "markdown" and meta.get("points", 0) > 0, meta["grade_id"]
        elif meta.get("grade"):
            assert meta.get("locked") and meta.get("points", 0) > 0, meta["grade_id"]


@pytest.mark.parametrize("slug", SLUGS)
def test_every_exercise_has_visible_and_hidden_tests(slug):
    cells = graded_cells(read(source_path(slug)))
    assert len(cells) >= 1
    for cell in cells:
        visible, hidden = split_hidden(cell.source)
        code = [line for line in visible.splitlines() if line.strip() and not line.strip().startswith("#")]
        assert code, f"{nbgrader_meta(cell)['grade_id']}: no visible test"
        assert hidden.strip(), f"{nbgrader_meta(cell)['grade_id']}: no hidden test"


@pytest.mark.parametrize("slug", SLUGS)
def test_every_notebook_has_at_least_four_exercises(slug):
    assert len(graded_cells(read(source_path(slug)))) >= 4


@pytest.mark.parametrize("slug", SLUGS)
def test_student_notebook_leaks_no_solution_or_hidden_test(slug):
    student_text = student_path(slug).read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in student_text
    student_sources = "\n".join(c.source for c in read(student_path(slug)).cells)
    for cell in read(source_path(slug)).cells:
        secret = []
        if "### BEGIN SOLUTION" in cell.source:
            secret += re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", cell.source, re.S)
        secret.append(split_hidden(cell.source)[1])
        for block in secret:
            for line in block.splitlines():
                if len(line.strip()) > 12:
                    assert line.strip() not in student_sources, f"{slug}: {line.strip()!r} leaked"


@pytest.mark.pipeline
def test_release_is_in_sync(roundtrip):
    """Regenerating notebooks/ from grader/source/ gives the committed files, cell by cell."""
    for slug, built in roundtrip.released.items():
        committed = student_path(slug)
        assert committed.exists(), f"{committed} missing: run `make release`"
        assert comparable_cells(built) == comparable_cells(committed), f"{committed.name} is stale: run `make release`"
    assert sorted(p.stem for p in student_path("x").parent.glob("*.ipynb")) == SLUGS == sorted(roundtrip.released)


def _package_functions() -> dict[str, list[str]]:
    """Function name -> source of every top-level function in specdec, by name."""
    found: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(specdec.__path__, "specdec."):
        if info.name.endswith(".__main__"):  # an entry point: importing it runs it
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            obj = getattr(obj, "fn", obj)  # a Triton kernel: its Python function
            if inspect.isfunction(obj) and obj.__module__ == info.name:
                found.setdefault(name, []).append(inspect.getsource(obj))
    return found


@pytest.mark.parametrize("slug", SLUGS)
def test_solution_cells_equal_the_package(slug):
    """Each function a solution cell defines is, AST for AST, the package's function."""
    package = _package_functions()
    checked = 0
    for cell in read(source_path(slug)).cells:
        if not nbgrader_meta(cell).get("solution") or cell.cell_type != "code":
            continue
        for node in ast.parse(cell.source).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            sources = package.get(node.name)
            assert sources, f"{slug}: solution function {node.name} is not in specdec"
            assert any(ast.dump(ast.parse(s).body[0]) == ast.dump(node) for s in sources), (
                f"{slug}: {node.name} in the notebook differs from specdec's; keep them identical"
            )
            checked += 1
    assert checked, f"{slug}: no solution functions found"


@pytest.mark.pipeline
@pytest.mark.parametrize("slug", SLUGS)
def test_source_notebook_runs_without_errors(roundtrip, slug):
    """Every cell of the instructor notebook runs, top to bottom, in nbgrader's kernel (what nbval --nbval-lax
    checked, from the same execution that scores it)."""
    errors = roundtrip.solution_errors[slug]
    assert not errors, f"{slug}: " + "; ".join(errors)


@pytest.mark.pipeline
@pytest.mark.parametrize("slug", SLUGS)
def test_source_notebook_scores_full_marks(roundtrip, slug):
    grades = roundtrip.grades[slug, "solution"]
    assert grades, f"{slug}: no graded cells in the gradebook"
    manual = {nbgrader_meta(c)["grade_id"] for c in manual_cells(read(source_path(slug)))}
    for g in grades:
        if g.grade_id in manual:  # reported for an instructor, never scored automatically
            assert g.written and g.needs_manual_grade, f"{slug}/{g.grade_id}: a written answer was graded automatically"
            continue
        assert g.score == g.max_score, f"{slug}/{g.grade_id}: solution scored {g.score}/{g.max_score}: {g.message}"


@pytest.mark.pipeline
@pytest.mark.parametrize("slug", SLUGS)
def test_blank_student_notebook_scores_zero(roundtrip, slug):
    grades = roundtrip.grades[slug, "blank"]
    manual = {nbgrader_meta(c)["grade_id"] for c in manual_cells(read(source_path(slug)))}
    assert len(grades) == len(graded_cells(read(source_path(slug)))) + len(manual)
    for g in grades:
        assert g.score == 0, f"{slug}/{g.grade_id}: the blank skeleton scored {g.score}: the test cannot fail"
        assert g.written == (g.grade_id in manual) and not g.needs_manual_grade, f"{slug}/{g.grade_id}"


def _cell(source: str, **nbgrader) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    if nbgrader:
        cell.metadata["nbgrader"] = nbgrader
    return cell


def test_pruning_keeps_what_graded_cells_need():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("import torch\nfrom x import helper"),
        _cell("slow_demo = helper(10**9)"),  # nothing graded reads it: dropped
        _cell("table = [1, 2]"),  # read by the function the solution cell defines: kept
        _cell("unused = torch.zeros(3)"),  # binds a name no kept cell reads: dropped
        _cell("scale = 3"),  # read by the demo that builds `data`, which the test reads: kept
        _cell("data = [scale * t for t in table]"),
        _cell("def f(x):\n    return helper(table[x])", grade_id="f", solution=True),  # reads helper: the imports stay
        _cell("%matplotlib inline"),  # not Python: kept
        _cell("print(slow_demo)"),  # reads only a dropped name, binds nothing: dropped
        _cell("assert f(0) == data[0] // 3", grade_id="f_test", grade=True, points=1),
    ])
    pruned, dropped = prune_for_blank(nb)
    assert [c.source.split("\n")[0] for c in pruned.cells] == [
        "import torch", "table = [1, 2]", "scale = 3", "data = [scale * t for t in table]", "def f(x):",
        "%matplotlib inline", "assert f(0) == data[0] // 3"]
    assert dropped == 3 and len(nb.cells) == 10
