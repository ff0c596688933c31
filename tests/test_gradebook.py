"""One gradebook: cohort results in nbgrader's gradebook, lateness by nbgrader's rules, feedback a learner can read.

The fast tests judge the pieces (timestamps, the feedback page's pending written answers, the inert notebook
formgrader renders, the learner's traceback); the cohort-marked one grades notebook 14 (it has written answers)
for three students into a course's gradebook, grades a written answer as an instructor would, and renders the
feedback that `nbgrader release_feedback` sends."""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import re

import nbformat
import pytest

from conftest import read, source_path, student_path
from specdec.course import boxes, cohort, gradebook, trusted
from specdec.course.driver import generate, make_course, run_nbgrader


def test_timestamps_are_read_as_nbgrader_writes_them(tmp_path):
    (tmp_path / "timestamp.txt").write_text("2026-12-02 14:30:00.123456 UTC\n")
    assert gradebook.read_timestamp(tmp_path) == ("2026-12-02 14:30:00.123456 UTC", "")
    (tmp_path / "timestamp.txt").write_text("2026-12-02T15:30:00+01:00")  # another zone: kept in UTC
    assert gradebook.read_timestamp(tmp_path)[0] == "2026-12-02 14:30:00.000000 UTC"
    (tmp_path / "timestamp.txt").write_text("yesterday")
    stamp, problem = gradebook.read_timestamp(tmp_path)
    assert stamp == "" and "does not hold a date" in problem and "treated as on time" in problem
    (tmp_path / "timestamp.txt").write_text("2" * 1000)
    assert "not a small plain file" in gradebook.read_timestamp(tmp_path)[1]
    (tmp_path / "timestamp.txt").unlink()
    (tmp_path / "timestamp.txt").symlink_to("/etc/passwd")
    assert "not a small plain file" in gradebook.read_timestamp(tmp_path)[1]
    assert gradebook.read_timestamp(tmp_path / "nowhere") == ("", "")


def test_lateness_is_said_in_units_a_person_reads():
    assert gradebook.format_lateness(59) == "0 min 59 s"
    assert gradebook.format_lateness(3 * 3600 + 5 * 60) == "3 h 05 min"
    assert gradebook.format_lateness(95400) == "1 d 2 h 30 min"


_PAGE = """<html><head><title>t</title></head><body>
<h4>nb (Score: 26.0 / 28.0)</h4><ol>
<li><a href="#a_test">Test cell</a> (Score: 26.0 / 26.0)</li>
<li><a href="#written_one">Written response</a> (Score: 0.0 / 1.0)</li>
<li><a href="#written_two">Written response</a> (Score: 1.0 / 1.0)</li></ol>
<a name="written_one"></a><div class="panel-heading"><span>Student's answer</span><span>Score: 0.0 / 1.0</span></div>
<p>My answer says Score: 0.0 / 1.0 <script>alert(1)</script></p>
<a name="written_two"></a><div class="panel-heading"><span>Score: 1.0 / 1.0</span></div>
</body></html>"""


def test_a_written_answer_not_graded_yet_reads_awaiting_never_zero():
    page = gradebook.finish_page(_PAGE, {"written_one": 1.0}, 26.0, 28.0)
    assert "(Score: 26 / 27 so far; 1 written point awaiting the instructor)" in page
    assert re.search(r'href="#written_one">Written response</a> \(Score: awaiting the instructor / 1.0\)', page)
    assert re.search(r'name="written_one"></a><div class="panel-heading"><span>Student\'s answer</span><span>Score: '
                     r"awaiting the instructor / 1.0", page)
    assert "My answer says Score: 0.0 / 1.0" in page  # the learner's own text is left alone
    assert 'href="#written_two">Written response</a> (Score: 1.0 / 1.0)' in page  # a graded one keeps its score
    assert "<script" not in page and "white-space: pre-wrap" in page
    assert "awaiting" not in gradebook.finish_page(_PAGE, {}, 27.0, 28.0)


def test_formgrader_renders_no_active_content_of_a_submission():
    nb = {"cells": [
        {"cell_type": "markdown", "metadata": {"nbgrader": {"solution": True, "grade": True}},
         "source": "an <img src=x onerror=alert(1)> answer & more"},
        {"cell_type": "markdown", "metadata": {"nbgrader": {"locked": True}}, "source": "<b>the course's</b>"},
        {"cell_type": "markdown", "metadata": {"nbgrader": {"locked": True}}, "source": "<script>steal()</script>"},
        {"cell_type": "code", "metadata": {}, "source": "", "outputs": [
            {"output_type": "display_data", "metadata": {"x": 1},
             "data": {"text/html": "<script>steal()</script>", "application/javascript": "steal()",
                      "text/plain": "<IPython.display>", "image/png": "iVBOR"}},
            {"output_type": "execute_result", "metadata": {}, "data": {"text/html": "<b>only html</b>"}}]}]}
    cells = gradebook.inert_notebook(copy.deepcopy(nb), frozenset({"<b>the course's</b>"}))["cells"]
    assert cells[0]["source"] == "an &lt;img src=x onerror=alert(1)&gt; answer &amp; more"
    assert cells[1]["source"] == "<b>the course's</b>"  # the course's own cells, word for word, render as written
    assert cells[2]["source"] == "&lt;script&gt;steal()&lt;/script&gt;"  # "locked" set by the learner proves nothing
    assert cells[3]["outputs"][0]["data"] == {"text/plain": "<IPython.display>", "image/png": "iVBOR"}
    assert cells[3]["outputs"][0]["metadata"] == {}
    assert cells[3]["outputs"][1]["data"] == {"text/plain": ""}
    assert any("speculative" in text.lower() for text in gradebook.course_text("14_frontier"))


def _raise_through_the_grader(error: BaseException) -> BaseException:
    """An error raised as the trusted side raises a learner's: through _raise_in's frame named after the function,
    under a test cell."""
    ns = {"raise_in": trusted._raise_in, "error": error}
    try:
        exec(compile("raise_in('experts_touched', error)", "<test cell>", "exec"), ns)
    except BaseException as raised:  # noqa: BLE001 (the point is to catch what the grader would)
        return raised
    raise AssertionError("nothing raised")


def test_the_learner_reads_no_grader_frame_and_the_first_line_names_exercise_and_cause():
    lines = trusted.learner_traceback(_raise_through_the_grader(NotImplementedError()), "experts_touched")
    assert lines[0] == "experts_touched: experts_touched still raises NotImplementedError: not done yet"
    assert not any("specdec" in line for line in lines)
    assert any('File "<test cell>"' in line for line in lines) and lines[-1] == "NotImplementedError"
    assert "raised in experts_touched(...)" in "\n".join(lines)  # what _cell_messages names the function by
    lines = trusted.learner_traceback(_raise_through_the_grader(ValueError("got 4.022935, expected 4.0\nmore")),
                                      "moe_step_seconds")
    assert lines[0] == "moe_step_seconds: got 4.022935, expected 4.0"
    assert not any("trusted.py" in line for line in lines)


# -- the whole path, graded in the sandbox ---------------------------------------------------------------------------

SLUG = "14_frontier"  # two written answers
DUE = "2026-12-01 12:00:00 UTC"


def _partial() -> nbformat.NotebookNode:
    """The first code answer solved and the first written answer written; the rest left blank."""
    nb, full = copy.deepcopy(read(student_path(SLUG))), read(source_path(SLUG))
    solved = False
    for cell, reference in zip(nb.cells, full.cells, strict=True):
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code" and not solved:
            cell.source, solved = reference.source, True
        if meta.get("grade_id") == "written_moe_long_context":
            cell.source = "The union of experts the gamma + 1 tokens touch grows with gamma."
    return nb


@pytest.mark.cohort
def test_a_cohort_lands_in_one_gradebook_with_lateness_and_written_answers_to_grade(tmp_path):
    course = make_course(tmp_path / "course", [SLUG])
    with open(course / "nbgrader_config.py", "a") as f:
        f.write("\nc.LateSubmissionPlugin.penalty_method = 'zero'\n")
    generate(course, SLUG)
    run_nbgrader(course, "db", "assignment", "add", SLUG, f"--duedate={DUE}")
    submitted = tmp_path / "submitted"
    for student, nb, name, stamp in (
            ("correct", read(source_path(SLUG)), SLUG, "2026-12-01 11:59:00.000000 UTC"),
            ("blank", read(student_path(SLUG)), SLUG, "2026-12-01 10:00:00.000000 UTC"),
            ("partial", _partial(), f"{SLUG}-Copy1", "2026-12-02 14:30:00.000000 UTC")):
        folder = submitted / student / SLUG
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{name}.ipynb")
        (folder / "timestamp.txt").write_text(stamp)
    out = tmp_path / "out"
    unsafe = [] if boxes.missing() is None else ["--unsafe-no-sandbox"]
    assert cohort.main([str(submitted), "--course", str(course), "--out", str(out), "--workers", "2", "--quiet",
                        *unsafe]) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(out / "totals.csv"))}
    assert {k: (rows[k]["score"], rows[k]["written_points_to_grade"], rows[k]["seconds_late"],
                rows[k]["late_penalty"]) for k in rows} == {
        "correct": ("26", "2", "0", "0"), "blank": ("0", "0", "0", "0"), "partial": ("1", "1", "95400", "1")}
    assert "renamed: the folder's one notebook, 14_frontier-Copy1.ipynb, was graded as 14_frontier.ipynb" in \
        rows["partial"]["messages"]
    assert "late: submitted 1 d 2 h 30 min after the due date; penalty 1 points" in rows["partial"]["messages"]
    report = (out / "report.txt").read_text()
    assert report.startswith("summary: 3 of 3 submissions graded") and "partial/14_frontier: late:" in report
    # the reference pasted: listed with its score for review, never penalised
    assert (rows["correct"]["similar"], rows["blank"]["similar"]) == ("True", "False")
    assert re.search(r"^similarity: correct/14_frontier exercise \w+: 1\.00 like the reference \(for review; not "
                     r"penalised\)$", report, re.M)
    page = (out / "feedback" / "correct" / f"{SLUG}.html").read_text()
    assert "(Score: 26 / 26 so far; 2 written points awaiting the instructor)" in page
    partial_page = (out / "feedback" / "partial" / f"{SLUG}.html").read_text()
    assert "trusted.py" not in partial_page and "experts_touched: " in partial_page
    for noise in ("Permission denied", "/tmp/mpl", "MPLCONFIGDIR", "ontconfig", "cache folder"):
        assert noise not in re.sub(r"<style.*?</style>|data:image/[^\"']+", "", page, flags=re.S), noise

    # nbgrader's gradebook, as formgrader reads it: every submission, its scores, its written answers to grade
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        subs = {s.student.id: s for s in gb.assignment_submissions(SLUG)}
        assert sorted(subs) == ["blank", "correct", "partial"]
        assert subs["correct"].needs_manual_grade and not subs["blank"].needs_manual_grade
        assert subs["partial"].total_seconds_late == 95400 and subs["partial"].late_submission_penalty == 1.0
        written = {g.name: g.needs_manual_grade for g in subs["partial"].notebooks[0].grades if g.cell_type == "markdown"}
        assert written == {"written_moe_long_context": True, "written_ranks_rollouts": False}
        grade = gb.find_grade("written_moe_long_context", SLUG, SLUG, "correct")
        grade.manual_score, grade.needs_manual_grade = 1.0, False  # what formgrader's API does
        gb.db.commit()
    assert (course / "autograded" / "partial" / SLUG / "timestamp.txt").read_text() == "2026-12-02 14:30:00.000000 UTC"

    # a regrade keeps the instructor's written score
    assert cohort.main([str(submitted), "--course", str(course), "--out", str(tmp_path / "again"), "--workers", "2",
                        "--student", "correct", "--quiet", *unsafe]) == 0
    totals = {r["student"]: r for r in gradebook.totals(course, SLUG)}
    assert (totals["correct"]["automatic"], totals["correct"]["written_graded"], totals["correct"]["written_pending"],
            totals["correct"]["total"], totals["correct"]["max_score"]) == (26.0, 1.0, 1.0, 27.0, 28.0)
    assert (totals["partial"]["late_penalty"], totals["partial"]["total"]) == (1.0, 0.0)
    assert {r["max_score"] for r in totals.values()} == {28.0}

    graded_view = json.loads((course / "autograded" / "partial" / SLUG / f"{SLUG}.ipynb").read_text())["cells"]
    at = next(i for i, c in enumerate(graded_view) if c["metadata"].get("nbgrader", {}).get("grade_id")
              == "written_moe_long_context")
    assert graded_view[at + 1]["metadata"]["tags"] == [gradebook.RUBRIC_TAG]  # formgrader shows the rubric beside it
    assert "Model answer:" in graded_view[at + 1]["source"] and "Rubric:" in graded_view[at + 1]["source"]

    gradebook.write_feedback(course, SLUG)
    page = (course / "feedback" / "correct" / SLUG / f"{SLUG}.html").read_text()
    assert "(Score: 27 / 27 so far; 1 written point awaiting the instructor)" in page
    assert "For the grader" not in page and "Rubric:" not in page  # the rubric stays the instructor's
    assert (course / "feedback" / "partial" / SLUG / f"{SLUG}-Copy1.html").exists() is False  # nothing collected
    assert gradebook.main(["totals", SLUG, "--course", str(course), "--out", str(tmp_path / "totals.csv")]) == 0
    assert "correct,14_frontier,2026-12-01T11:59:00,0,26,1,1,0,27,28" in (tmp_path / "totals.csv").read_text()


@pytest.mark.cohort
def test_a_regrade_with_changed_grades_only_what_changed(tmp_path):
    """--changed keeps a result whose inputs are the same (notebook, submission time, instructor notebook, package,
    due date) and regrades the rest; the outputs still hold every submission."""
    slug = "01_cost_ledger"
    submitted, out = tmp_path / "submitted", tmp_path / "out"
    for student in ("alice", "bob"):
        (submitted / student / slug).mkdir(parents=True)
        nbformat.write(read(student_path(slug)), submitted / student / slug / f"{slug}.ipynb")

    def grade(*extra: str) -> list[str]:
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            assert cohort.main([str(submitted), "--out", str(out), "--workers", "2", "--unsafe-no-sandbox", *extra]) == 0
        lines = printed.getvalue().splitlines()
        return [line for line in lines if line.startswith(("graded ", "[")) or "unchanged" in line]

    first = grade()
    assert len([line for line in first if line.startswith("[")]) == 2
    again = grade("--changed")
    assert again[0].startswith("2 submissions unchanged") and not [line for line in again if line.startswith("[")]
    assert [r["student"] for r in csv.DictReader(open(out / "totals.csv"))] == ["alice", "bob"]
    (submitted / "bob" / slug / "timestamp.txt").write_text("2026-12-02 10:00:00 UTC")  # a later submission
    third = grade("--changed")
    assert third[0].startswith("1 submission unchanged") and [line for line in third if line.startswith("[")] == [
        "[1/1] bob/01_cost_ledger: 0 / 10"]
    rows = {r["student"]: r for r in csv.DictReader(open(out / "totals.csv"))}
    assert (rows["alice"]["timestamp"], rows["bob"]["timestamp"]) == ("", "2026-12-02 10:00:00.000000 UTC")
