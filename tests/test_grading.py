"""`make grade`: a table per exercise, bad notebooks named and skipped, learner files untouched."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import nbformat
import pytest

from conftest import background_job, background_result, read, source_path, student_path
from specdec.course.driver import CellGrade
from specdec.course.grading import format_failures, format_table, grade, read_submission


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@background_job("graded_by_cli", lane="cells")
def _grade_by_cli(tmp_path):
    """`python -m specdec.course.grading 01` on a folder holding one finished notebook."""
    mine = tmp_path / "notebooks"
    mine.mkdir()
    finished = nbformat.read(source_path("01_cost_ledger"), as_version=4)
    for cell in finished.cells:  # count_params taken from the reference, speedup wrong (so best_gamma too)
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id == "count_params":
            cell.source = "from specdec.ledger import count_params"
        elif grade_id == "speedup":
            cell.source = ("def speedup(a, gamma, c):\n    return expected_tokens_per_round(a, gamma) / "
                           "(1 + gamma * c + 1)")
    nbformat.write(finished, mine / "01_cost_ledger.ipynb")
    before = _digest(mine)
    proc = subprocess.run(
        [sys.executable, "-m", "specdec.course.grading", "01", "--dir", str(mine), "--report-dir", str(tmp_path / "report")],
        capture_output=True, text=True, timeout=600,
    )
    return proc, mine, before, tmp_path / "report"


@pytest.fixture
def graded_by_cli():
    return background_result("graded_by_cli")


@pytest.mark.pipeline
def test_grade_cli_reads_but_never_writes_the_learners_notebooks(graded_by_cli):
    proc, mine, before, report = graded_by_cli
    assert proc.returncode == 0, proc.stderr
    assert "[1/1] 01_cost_ledger: running it with the hidden tests" in proc.stdout
    assert re.search(r"\[1/1\] 01_cost_ledger: 7 / 10 points in \d+ s", proc.stdout), proc.stdout
    assert "note: count_params: imports count_params from specdec.ledger instead of writing it" in proc.stdout
    assert "count_params" in proc.stdout and "2 / 2" in proc.stdout
    assert re.search(r"speedup\s+0 / 1  speedup\(0.8, 4, 0.05\): expected", proc.stdout), proc.stdout
    assert "total: 7 / 10 points" in proc.stdout
    html = (report / "feedback" / "01_cost_ledger.html").read_text()
    assert "speedup" in html and "hidden check's own lines are left out" in html
    assert "specdec/checks/" not in html  # the learner's cells and the check's message, not the check's source
    assert _digest(mine) == before
    assert [p.name for p in mine.iterdir()] == ["01_cost_ledger.ipynb"]


@background_job("graded_with_a_corrupt_notebook", lane="cells")
def _grade_with_a_corrupt_notebook(tmp_path):
    corrupt = tmp_path / "01_cost_ledger.ipynb"
    corrupt.write_text('{"cells": [')
    return grade([("01_cost_ledger", corrupt), ("01_cost_ledger", student_path("01_cost_ledger"))], tmp_path)


@pytest.fixture
def graded_with_a_corrupt_notebook():
    return background_result("graded_with_a_corrupt_notebook")


@pytest.mark.pipeline
def test_corrupt_notebook_is_named_and_the_others_still_graded(graded_with_a_corrupt_notebook):
    results = graded_with_a_corrupt_notebook
    (slug, error), (_, cells) = results
    assert isinstance(error, str) and "01_cost_ledger.ipynb is not valid JSON" in error
    assert [c.score for c in cells] == [0] * len(cells) and len(cells) >= 5
    assert all("not implemented yet" in c.message for c in cells), [c.message for c in cells]
    table = format_table(results)
    assert "not valid JSON" in table and "total: 0 / 10 points" in table


def test_read_submission_errors(tmp_path):
    path = tmp_path / "01_cost_ledger.ipynb"
    with pytest.raises(ValueError, match="file not found"):
        read_submission(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a (valid )?notebook"):
        read_submission(path)
    path.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5, "extra": 1}')
    with pytest.raises(ValueError, match="not a valid notebook"):
        read_submission(path)


def test_unknown_notebook_name_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specdec.course.grading", "99"], capture_output=True, text=True)
    assert proc.returncode != 0 and "names no notebook of this course" in proc.stderr


def test_table_lists_every_exercise_and_the_total():
    cells = [CellGrade("01_x", "a_test", 2, 2), CellGrade("01_x", "b_test", 0, 1, message="CheckFailure: b(1): expected 2")]
    table = format_table([("01_x", cells), ("02_y", "02_y.ipynb is not valid JSON")])
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["notebook", "exercise", "points"]
    assert any(line.startswith("01_x") and " a " in line and "2 / 2" in line for line in lines)
    assert any("0 / 1" in line and "expected 2" in line for line in lines)
    assert lines[-1] == "total: 2 / 3 points (not graded: 02_y)"


def test_table_wraps_the_first_sentence_and_names_ungraded_notebooks():
    long = ("CheckFailure: verify(p, q) on a batch of three rows where the second row differs: expected the residual "
            "sampled from max(p - q, 0), e.g. token 2, got token 0 from p itself. Likely cause: resampling from p. "
            "More detail follows.")
    table = format_table([("01_x", [CellGrade("01_x", "a_test", 0, 1, message=long)]), ("02_y", "02_y.ipynb is not valid JSON")])
    lines = table.splitlines()
    assert max(len(line) for line in lines) < 130 and "…" not in table
    assert " ".join(" ".join(lines).split()).count("got token 0 from p itself.") == 1  # the whole first sentence
    assert "Likely cause" not in table  # the rest is in the HTML feedback
    assert lines[-1] == "total: 0 / 1 points (not graded: 02_y)"


def test_every_failure_is_printed_in_full_below_the_table():
    """A terminal-only learner sees the whole message (input, expected, got, likely cause, a drill's derivation),
    also when the input is a tensor printed over several lines."""
    message = ("CheckFailure: medusa_candidates(7, tensor([[0.1000, 0.9000],\n        [0.3000, 0.5000]]), [(0,)]): "
               "expected [7, 1], got [7, 0]. Hint (a known slip gives exactly this output): rank by the last step of the path.")
    cells = [CellGrade("12_x", "medusa_candidates_test", 0, 2, message=message), CellGrade("12_x", "ok_test", 1, 1),
             CellGrade("12_x", "drill_test", 0, 1, message="MTP_TAU = 3.38 is not it. Rates multiply: 1 + 0.88 + ...")]
    table = format_table([("12_x", cells)])
    assert "[0.3000, 0.5000]]), [(0,)]): expected [7, 1], got [7, 0]." in " ".join(table.split())  # lines joined
    full = format_failures([("12_x", cells)])
    flat = " ".join(full.split())
    assert "Hint (a known slip gives exactly this output): rank by the last step of the path." in flat
    assert "Rates multiply" in flat
    assert "12_x / ok" not in full  # passing cells are not listed
    assert format_failures([("12_x", cells[1:2])]) == ""


def test_feedback_leaves_out_the_hidden_checks_frames(tmp_path):
    from specdec.course.driver import hide_check_frames

    frames = ["\x1b[0;31m-------\x1b[0m", "CheckFailure  Traceback (most recent call last)",
              "Cell \x1b[0;32mIn[7], line 1\x1b[0m\n----> 1 check_speedup(speedup)",
              "File \x1b[0;32m/x/solutions/specdec/checks/ledger.py:40\x1b[0m, in \x1b[0;36mcheck_speedup\x1b[0m(fn)",
              "Cell \x1b[0;32mIn[6], line 2\x1b[0m, in \x1b[0;36mspeedup\x1b[0m(a, gamma, c)",
              "\x1b[0;31mCheckFailure\x1b[0m: speedup(0.8, 4, 0.05): expected 2.80, got 1.4"]
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "error", "ename": "CheckFailure", "evalue": "",
                                                       "traceback": frames}]}]}
    path = tmp_path / "graded.ipynb"
    path.write_text(json.dumps(nb))
    assert hide_check_frames(path) == 1
    kept = json.loads(path.read_text())["cells"][0]["outputs"][0]["traceback"]
    assert not any("specdec/checks" in f for f in kept) and "In[6]" in kept[3] and kept[-1] == frames[-1]
    assert "left out" in kept[-2]


def test_model_answers_are_shown_only_for_attempted_written_answers():
    from specdec.course.written import format_model_answers, written_answers

    student = nbformat.read(student_path("10_pitfalls_interview"), as_version=4)
    assert written_answers("10_pitfalls_interview", student) == []  # the skeleton is not an attempt
    for cell in student.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "written_gamma":
            cell.source = "Pick the gamma that maximises E over the round's cost, measured on real traffic."
    (answer,) = written_answers("10_pitfalls_interview", student)
    assert answer.question.prompt.startswith("How do you choose gamma?") and answer.answer.startswith("Pick the gamma")
    text = format_model_answers("10_pitfalls_interview", [answer])
    assert "model answer:" in text and "rubric:" in text and "maximises E over" in text
    assert "Maximise S = E(a, gamma)" in text and "revise: notebooks/01_cost_ledger.ipynb" in text


def test_answers_that_call_the_reference_are_named():
    from specdec.course.reference_calls import reference_calls

    source = nbformat.read(source_path("02_greedy_verify"), as_version=4)
    assert reference_calls(source, source) == []  # the reference solutions themselves
    cheats = {
        "from specdec import greedy\ndef greedy_verify(drafts, target_logits):\n"
        "    return greedy.greedy_verify(drafts, target_logits)": "greedy_verify calls specdec's greedy_verify",
        "def greedy_verify(drafts, target_logits):\n    from specdec.greedy import greedy_verify as ref\n"
        "    return ref(drafts, target_logits)": "greedy_verify calls specdec's greedy_verify",
        "import specdec.greedy\ngreedy_verify = specdec.greedy.greedy_verify": "binds its function to specdec's",
        "from specdec.greedy import greedy_verify": "imports greedy_verify from specdec.greedy",
        "def greedy_verify(drafts, target_logits):\n    return greedy_verify_batched(drafts[None], "
        "target_logits[None])": None,  # the learner's own other answer: allowed
    }
    for code, expected in cheats.items():
        learner = nbformat.read(student_path("02_greedy_verify"), as_version=4)
        for cell in learner.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == "greedy_verify":
                cell.source = code
        notes = reference_calls(learner, source)
        assert (notes == []) if expected is None else (len(notes) == 1 and expected in notes[0]), (code, notes)


def test_notebook_numbers_resolve():
    from specdec.course.grading import _resolve
    from specdec.paths import NOTEBOOKS_DIR

    assert _resolve(["1"], NOTEBOOKS_DIR)[0][0] == "01_cost_ledger"
    assert _resolve(["01_cost_ledger.ipynb"], NOTEBOOKS_DIR)[0][0] == "01_cost_ledger"


def test_error_in_a_solution_cell_is_named_for_the_tests_that_need_it(tmp_path):
    import json

    from specdec.course.driver import _cell_messages

    def cell(meta, outputs):
        return {"cell_type": "code", "metadata": {"nbgrader": meta}, "outputs": outputs, "source": ""}

    nb = {"cells": [
        cell({"grade_id": "residual", "solution": True},
             [{"output_type": "error", "ename": "SyntaxError", "evalue": "invalid syntax", "traceback": []}]),
        cell({"grade_id": "residual_test", "grade": True},
             [{"output_type": "error", "ename": "NameError", "evalue": "name 'residual' is not defined", "traceback": []}]),
        cell({"grade_id": "slow_test", "grade": True},
             [{"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []}]),
    ]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    messages = _cell_messages(path)
    assert messages["residual_test"] == ("the cell residual raised SyntaxError: invalid syntax (NameError: name 'residual' "
                                         "is not defined here)")
    assert messages["slow_test"].startswith("timed out: it ran past the per-cell limit of 120 s"), messages["slow_test"]
    assert "CELL_TIMEOUT" in messages["slow_test"] and "--cell-timeout" in messages["slow_test"]
    assert "limit of 30 s" in _cell_messages(path, 30)["slow_test"]
    nb["cells"][0]["outputs"] = [{"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []}]
    path.write_text(json.dumps(nb))  # an answer cell that never ends: its test cell says so, not just NameError
    assert _cell_messages(path)["residual_test"].startswith("the cell residual timed out: it ran past the per-cell limit")


def test_written_answers_are_listed_for_an_instructor_and_kept_out_of_the_total():
    cells = [CellGrade("10_x", "a_test", 1, 1), CellGrade("10_x", "essay", 0, 1, needs_manual_grade=True, written=True),
             CellGrade("10_x", "blank_essay", 0, 1, written=True)]
    table = format_table([("10_x", cells)])
    assert "? / 1  needs manual grading (a written answer)" in table
    assert "written answer: not answered yet" in table
    assert table.splitlines()[-1] == "total: 1 / 1 points, plus 2 points of written answers for an instructor to grade"


def test_reset_keeps_the_learners_version_and_writes_a_blank_one(tmp_path, monkeypatch):
    from specdec.course import release

    monkeypatch.setattr(release, "NOTEBOOKS_DIR", tmp_path)
    mine = tmp_path / "01_cost_ledger.ipynb"
    nb = read(student_path("01_cost_ledger"))
    nb.cells[0].source += "\nmy own notes"
    nbformat.write(nb, mine)
    first = release.reset(["1"])
    second = release.reset(["01_cost_ledger"])  # within the same second: a second backup, not an overwrite
    assert len({*first, *second}) == 2 and all(p.parent == tmp_path / ".backup" for p in first + second)
    assert "my own notes" in first[0].read_text() and "my own notes" not in second[0].read_text()
    assert release.comparable_cells(mine) == release.comparable_cells(student_path("01_cost_ledger"))
    with pytest.raises(SystemExit, match="names no notebook"):
        release.reset(["99"])
