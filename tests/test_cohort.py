"""Cohort grading: every kind of bad submission gets a clear message, the others are still graded
correctly, and no submission can change another's score or the course's files."""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import os
import time
from pathlib import Path

import nbformat
import pytest

from conftest import SLUGS, background_job, background_result, read, source_path, student_path
from specdec.course import boxes, cohort
from specdec.paths import REPO_ROOT

SLUG = "02_greedy_verify"
UNSAFE = [] if boxes.missing() is None else ["--unsafe-no-sandbox"]  # where bubblewrap is missing: unsandboxed
FULL = 10.0  # notebook 02's points


def _answer(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _variant(change) -> nbformat.NotebookNode:
    nb = copy.deepcopy(read(source_path(SLUG)))
    change(nb)
    return nb


def _prepend(grade_id, code):
    def change(nb):
        cell = _answer(nb, grade_id)
        cell.source = code + "\n" + cell.source
    return change


def _replace(grade_id, code):
    def change(nb):
        _answer(nb, grade_id).source = code
    return change


def _delete_test(nb):
    nb.cells.remove(_answer(nb, "round_shapes_test"))


def _edit_test(nb):
    _answer(nb, "greedy_verify_test").source = "pass  # the learner emptied the test"


def _reorder(nb):
    cell = _answer(nb, "round_shapes")
    nb.cells.remove(cell)
    nb.cells.append(cell)


GUARDED_FILE = REPO_ROOT / "solutions" / "specdec" / "checks" / "greedy.py"

SUBMISSIONS = {
    "correct": lambda: read(source_path(SLUG)),
    "blank": lambda: read(student_path(SLUG)),
    "deleted_test": lambda: _variant(_delete_test),
    "edited_test": lambda: _variant(_edit_test),
    "reordered": lambda: _variant(_reorder),
    "endless": lambda: _variant(_prepend("greedy_verify", "while True:\n    pass")),
    "exits": lambda: _variant(_prepend("greedy_verify_batched", "import os\nos._exit(3)")),
    "segfault": lambda: _variant(_prepend("greedy_verify_batched", "import ctypes\nctypes.string_at(0)")),
    "hog": lambda: _variant(_prepend("greedy_verify", "hog = bytearray(64 * 2**30)")),
    "chatty": lambda: _variant(_prepend("round_shapes", "print('x' * 5_000_000)")),
    "patches_checks": lambda: _variant(_prepend("greedy_verify",
                                                "checks.check_greedy_verify = lambda fn: None\n"
                                                "def greedy_verify(*a):\n    return None\n")),
    "writes_course": lambda: _variant(_prepend("round_shapes", f"open({str(GUARDED_FILE)!r}, 'a').write('# pwned')")),
    "other_notebook": lambda: read(source_path("03_rejection_sampling")),
    "calls_reference": lambda: _variant(_replace("greedy_verify", "from specdec.greedy import greedy_verify")),
}


pytestmark = pytest.mark.pipeline


@background_job("graded")
def _grade_cohort(root):
    """Every submission above graded in one cohort run (started in the background after collection)."""
    submitted, out = root / "submitted", root / "out"
    for student, make in SUBMISSIONS.items():
        path = submitted / student / SLUG / f"{SLUG}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(make(), path)
    (submitted / "broken_json" / SLUG).mkdir(parents=True)
    (submitted / "broken_json" / SLUG / f"{SLUG}.ipynb").write_text('{"cells": [')
    (submitted / "not_a_notebook" / SLUG).mkdir(parents=True)
    (submitted / "not_a_notebook" / SLUG / f"{SLUG}.ipynb").write_text('{"cells": 3}')
    (submitted / "stray" / "99_unknown").mkdir(parents=True)
    before = hashlib.sha256(GUARDED_FILE.read_bytes()).hexdigest()
    assert cohort.main([*UNSAFE, str(submitted), "--out", str(out), "--workers", "2", "--cell-timeout", "8",
                        "--timeout", "120", "--memory-mb", "6144", "--quiet"]) == 0
    assert hashlib.sha256(GUARDED_FILE.read_bytes()).hexdigest() == before, "a submission changed the course's files"
    totals = {row["student"]: row for row in csv.DictReader(open(out / "totals.csv"))}
    return totals, out


@pytest.fixture(scope="module")
def graded():
    return background_result("graded")


def _score(totals, student) -> float:
    return float(totals[student]["score"])


@pytest.mark.cohort
def test_good_and_repaired_submissions_get_full_marks(graded):
    totals, _ = graded
    for student in ("correct", "deleted_test", "edited_test", "reordered", "chatty"):
        assert _score(totals, student) == FULL, (student, totals[student])
    assert "round_shapes_test was deleted: restored" in totals["deleted_test"]["messages"]
    assert "out of order" in totals["reordered"]["messages"]
    assert _score(totals, "blank") == 0


@pytest.mark.cohort
def test_unreadable_and_foreign_notebooks_are_named_not_graded(graded):
    totals, out = graded
    assert "not valid JSON" in totals["broken_json"]["messages"] and totals["broken_json"]["graded"] == "False"
    assert ("not a valid notebook" in totals["not_a_notebook"]["messages"]
            or "not a notebook" in totals["not_a_notebook"]["messages"])
    assert "notebook of 03_rejection_sampling" in totals["other_notebook"]["messages"]
    assert "99_unknown" in (out / "report.txt").read_text()


@pytest.mark.cohort
def test_a_stuck_or_crashing_answer_loses_only_its_own_points(graded):
    totals, out = graded
    assert 0 < _score(totals, "endless") < FULL  # the other exercises still count
    rows = [r for r in csv.DictReader(open(out / "grades.csv")) if r["student"] == "endless"]
    assert any("timed out: it ran past the per-cell limit of 8 s" in (r["message"] or "") for r in rows), [
        (r["exercise"], r["message"]) for r in rows]
    for student in ("exits", "segfault"):
        assert "kernel died" in totals[student]["messages"], totals[student]
        assert _score(totals, student) < FULL
    assert 0 < _score(totals, "hog") < FULL  # MemoryError under the limit, in that exercise only


@pytest.mark.cohort
def test_tampering_is_flagged_and_cannot_reach_the_course(graded):
    totals, _ = graded
    assert (totals["patches_checks"]["flagged"] == "True"
            and "assigns to an attribute of checks" in totals["patches_checks"]["messages"])
    assert totals["writes_course"]["flagged"] == "True"
    assert _score(totals, "correct") == FULL  # graded beside them, unaffected
    assert totals["correct"]["flagged"] == "False"


@pytest.mark.cohort
def test_an_answer_that_imports_the_reference_is_flagged_for_the_instructor(graded):
    totals, _ = graded
    row = totals["calls_reference"]
    assert row["flagged"] == "True"
    assert "calls the reference: greedy_verify: imports greedy_verify from specdec.greedy" in row["messages"]
    if UNSAFE:  # no sandbox here: the reference answers, and only the flag tells
        assert _score(totals, "calls_reference") == FULL
        return
    # In the sandbox the graded notebook's reference answers the package's code only: greedy_verify and the loop
    # that calls it score 0, round_shapes and the batched verifier (written by the learner) keep their points.
    assert row["needs_review"] == "True" and "withheld" in row["messages"], row
    assert _score(totals, "calls_reference") == 5.0


@pytest.mark.cohort
def test_outputs_grades_summary_and_feedback(graded):
    totals, out = graded
    assert "printed too much: 4.9 MB of output cut from the feedback" in totals["chatty"]["messages"]
    assert (out / "feedback" / "chatty" / f"{SLUG}.html").stat().st_size < 1_000_000
    rows = list(csv.DictReader(open(out / "grades.csv")))
    assert {r["exercise"] for r in rows if r["student"] == "correct"} == {
        "round_shapes", "greedy_verify", "speculative_greedy_generate", "greedy_verify_batched"}
    summary = json.loads((out / "summary.json").read_text())[SLUG]
    assert summary["submissions"] == len(SUBMISSIONS) + 2 and summary["max_total"] == FULL
    assert (out / "feedback" / "correct" / f"{SLUG}.html").exists()


def test_repair_restores_order_and_deleted_tests():
    released = read(student_path(SLUG))
    nb = _variant(_reorder)
    _delete_test(nb)
    done = cohort.repair(nb, released)
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")]
    assert ids == [c.metadata["nbgrader"]["grade_id"] for c in released.cells if c.metadata.get("nbgrader", {}).get("grade_id")]
    assert any("deleted" in d for d in done) and any("out of order" in d for d in done)


def test_tampering_scan_flags_patches_and_writes_but_not_ordinary_code():
    def flags(source):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        return cohort.tampering(nb)

    for bad in ("checks = None", "import specdec\nspecdec.checks.greedy.check_greedy_verify = print",
                "setattr(checks, 'check_x', print)", "open('notes.txt', 'w').write('x')", "def expect_equal(*a):\n    pass",
                "from math import inf as checks"):
        assert flags(bad), bad
    for fine in ("x = torch.zeros(3)", "def greedy_verify(draft, logits):\n    return logits.argmax(-1)",
                 "with open('data.txt') as f:\n    text = f.read()", "from specdec.checks import greedy as checks"):
        assert not flags(fine), fine


def test_long_outputs_are_cut_in_the_feedback(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('x' * 300_000)")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 300_000)]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert cohort.cut_long_outputs(path) == 300_000 - cohort.OUTPUT_LIMIT
    text = nbformat.read(path, as_version=4).cells[0].outputs[0].text
    assert len(text) < cohort.OUTPUT_LIMIT + 100 and "characters cut by the grader" in text


def _kernels_working_in(marker: str) -> list[int]:
    """Live Jupyter kernels whose working directory's path contains ``marker`` (a submission's scratch folder)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"ipykernel_launcher" in (proc / "cmdline").read_bytes() \
                    and marker in os.readlink(proc / "cwd"):
                found.append(int(proc.name))
        except OSError:  # it ended while we looked
            continue
    return found


@background_job("sleeper_graded")
def _grade_a_sleeper(tmp_path):
    """A submission that sleeps past a 10 s whole-notebook limit, graded alone."""
    student = "sleeper_past_the_limit"  # cohort grading works in a scratch folder named after the student
    path = tmp_path / "submitted" / student / SLUG / f"{SLUG}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(_variant(_prepend("round_shapes", "import time\ntime.sleep(120)")), path)
    code = cohort.main([*UNSAFE, str(tmp_path / "submitted"), "--out", str(tmp_path / "out"), "--workers", "1",
                        "--timeout", "10", "--quiet"])
    time.sleep(1)
    return code, next(csv.DictReader(open(tmp_path / "out" / "totals.csv"))), _kernels_working_in(f"/{student}-")


@pytest.fixture
def sleeper_graded():
    return background_result("sleeper_graded")


@pytest.mark.cohort
def test_a_notebook_past_the_whole_notebook_limit_is_killed_with_its_kernel(sleeper_graded):
    code, row, kernels_left = sleeper_graded
    assert code == 0
    assert "stopped after 10 s" in row["messages"] and float(row["score"]) == 0
    assert not kernels_left, "the killed notebook left its kernel running"


@background_job("every_reference_graded")
def _grade_every_reference(root):
    """The instructor notebook of every assignment, submitted by one student, graded in the sandbox."""
    submitted = root / "submitted"
    for slug in SLUGS:
        path = submitted / "reference" / slug / f"{slug}.ipynb"
        path.parent.mkdir(parents=True)
        path.write_bytes(source_path(slug).read_bytes())
    assert cohort.main([*UNSAFE, str(submitted), "--out", str(root / "out"), "--workers", "2", "--quiet"]) == 0
    return list(csv.DictReader(open(root / "out" / "totals.csv")))


@pytest.fixture
def every_reference_graded():
    return background_result("every_reference_graded")


@pytest.mark.cohort
def test_every_notebooks_reference_scores_full_marks_in_the_sandbox(every_reference_graded):
    """Across the sandbox's boundary the grader hands the learner's functions its own inputs (data, or handles to
    its models and callables): every notebook's reference must score full marks there, as in the plain round trip."""
    rows = every_reference_graded
    assert sorted(row["assignment"] for row in rows) == SLUGS
    short = [f"{row['assignment']}: {row['score']} of {row['max_score']} {row['messages']}" for row in rows
             if float(row["score"]) != float(row["max_score"]) or row["flagged"] != "False"]
    assert not short, "\n".join(short)
