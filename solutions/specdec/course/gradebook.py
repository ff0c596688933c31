"""One gradebook: cohort grading's results in nbgrader's own, where formgrader reads them.

The instructor's course folder (``grader/``, or a copy on a hub) holds nbgrader's ``gradebook.db``. Cohort grading
grades every submission in a scratch course of its own (``specdec.course.cohort``); ``record`` then writes each
submission's automatic scores, its grader's messages and its lateness into the course's gradebook with nbgrader's
API, and its autograded notebook under ``autograded/`` with the outputs a browser would run made inert. formgrader
then lists every submission with its written answers to grade; ``write_feedback`` renders feedback with the written
scores once they are in (a written answer not yet graded reads "awaiting the instructor", never 0), ready for
``nbgrader release_feedback``; ``totals`` keeps automatic, written-graded and written-pending points apart.

Lateness follows nbgrader: the submission's ``timestamp.txt`` (what ``nbgrader collect`` and ``zip_collect`` write)
against the assignment's due date plus the student's extension, both from the course's gradebook
(``nbgrader db assignment add SLUG --duedate=...``); the penalty is the course's ``LateSubmissionPlugin``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import functools
import hashlib
import html
import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

from specdec.course.inert import csv_cell, sanitise_html

TIMESTAMP_LIMIT = 200  # bytes of a timestamp.txt read

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def grader_id(student: str) -> str:
    """The name nbgrader knows the student by in the submission's own scratch course: the folder's name when it is a
    plain one (letters, digits, ``. _ -``, at most 64), else a stable stand-in. (nbgrader's gradebook cannot store a
    name that is not UTF-8, a 250-character name makes a scratch folder's name too long, and nbgrader reads ``*`` in
    --student as a pattern.) Each scratch course holds one student; the results keep the folder's name."""
    if _PLAIN_NAME.fullmatch(student):
        return student
    return "student-" + hashlib.sha256(student.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _db_url(course: Path) -> str:
    return f"sqlite:///{course / 'gradebook.db'}"


def read_timestamp(folder: Path) -> tuple[str, str]:
    """The submission time in ``folder/timestamp.txt`` as nbgrader writes it (UTC), and what was wrong with the file
    ("" when it is fine or absent). A link, an oversized or unparseable file counts as no timestamp, said so."""
    from nbgrader.utils import parse_utc

    path = folder / "timestamp.txt"
    if not os.path.lexists(path):
        return "", ""
    if path.is_symlink() or not path.is_file() or path.stat().st_size > TIMESTAMP_LIMIT:
        return "", "timestamp.txt is not a small plain file: lateness unknown, treated as on time"
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    try:
        return parse_utc(text).strftime("%Y-%m-%d %H:%M:%S.%f UTC"), ""
    except (ValueError, OverflowError):
        return "", f"timestamp.txt does not hold a date ({text[:40]!r}): lateness unknown, treated as on time"


def format_lateness(seconds: float) -> str:
    """'2 h 05 min' style."""
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours // 24} d {hours % 24} h {minutes:02d} min" if hours >= 24 else f"{hours} h {minutes:02d} min"


def due_date(course: Path, slug: str, student: str | None = None) -> datetime.datetime | None:
    """The assignment's due date in the course's gradebook, plus ``student``'s extension when one was given."""
    from nbgrader.api import Gradebook, MissingEntry

    if not (course / "gradebook.db").is_file():
        return None
    with Gradebook(_db_url(course)) as gb:
        try:
            due = gb.find_assignment(slug).duedate
        except MissingEntry:
            return None
        if due is not None and student is not None:
            try:
                extension = gb.find_submission(slug, student).extension
            except MissingEntry:
                extension = None
            due = due + extension if extension else due
    return due


def set_due_dates(course: Path, scratch_course: Path, slug: str, student: str | None = None) -> None:
    """Give the scratch course the course's due date for ``slug`` (and ``student``'s extension), so that nbgrader's
    autograde computes lateness and the late penalty there."""
    from nbgrader.api import Gradebook

    due = due_date(course, slug, student)
    if due is not None:
        with Gradebook(_db_url(scratch_course)) as gb:
            gb.update_or_create_assignment(slug, duedate=due)


def lateness(course: Path, slug: str, student: str) -> tuple[float, float]:
    """Seconds late and nbgrader's late penalty of a graded submission in a (scratch) course's gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(_db_url(course)) as gb:
        submission = gb.find_submission(slug, student)
        return float(submission.total_seconds_late), float(submission.late_submission_penalty or 0.0)


# -- into the course's gradebook -----------------------------------------------------------------------------------

#: Output kinds kept in the notebook formgrader renders: text and pictures; HTML, JavaScript, widgets and the rest of
#: what a submission's kernel printed could run in the instructor's browser.
_KEPT_DATA = ("text/plain", "image/png", "image/jpeg")


def inert_notebook(nb: dict, course_text: set[str]) -> dict:
    """The autograded notebook as formgrader may render it: rich outputs reduced to text and pictures, and the raw
    HTML of every markdown cell shown as text unless the cell is, word for word, one of the course's own
    (``course_text``: the released notebook's markdown). A cell's metadata proves nothing: the learner can set
    ``locked`` on a cell of their own."""
    for cell in nb.get("cells", []):
        source = "".join(cell.get("source", "")) if isinstance(cell.get("source"), (str, list)) else ""
        if cell.get("cell_type") == "markdown" and source not in course_text:
            cell["source"] = source.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        for output in cell.get("outputs", []):
            data = output.get("data")
            if isinstance(data, dict):
                output["data"] = {k: v for k, v in data.items() if k in _KEPT_DATA} or {"text/plain": ""}
                output.get("metadata", {}).clear()
    return nb


#: The tag of the cells that put a written answer's model answer and rubric beside it in formgrader; feedback
#: leaves them out (write_feedback).
RUBRIC_TAG = "instructor-rubric"


def with_rubrics(nb: dict, slug: str) -> dict:
    """The notebook with the course's model answer and rubric after each written answer, for the instructor who
    grades it in formgrader (cells tagged RUBRIC_TAG)."""
    from specdec.course.driver import source_notebook
    from specdec.drill.written import read_notebook

    questions = {q.id: q for q in read_notebook(source_notebook(slug))}
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("metadata", {}).get("tags") and RUBRIC_TAG in cell["metadata"]["tags"]:
            continue  # the learner cannot bring a rubric of their own
        cells.append(cell)
        question = questions.get(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id"))
        if question is not None and cell.get("cell_type") == "markdown":
            points = f"{question.points:g} point{'' if question.points == 1 else 's'}"
            cells.append({"cell_type": "markdown", "metadata": {"tags": [RUBRIC_TAG]}, "source": (
                f"**For the grader ({points}), not in the feedback.** Model answer: {question.model_answer}\n\n"
                f"**Rubric:** {question.rubric}")})
    nb["cells"] = cells
    return nb


@functools.cache
def course_text(slug: str) -> frozenset[str]:
    """The markdown of the released notebook: the only markdown formgrader renders as HTML."""
    from specdec.paths import NOTEBOOKS_DIR

    nb = json.loads((NOTEBOOKS_DIR / f"{slug}.ipynb").read_text(encoding="utf-8"))
    return frozenset("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def record(course: Path, subs: list, autograded_root: Path) -> list[str]:
    """Write every graded submission into the course's gradebook (nbgrader's API) and its autograded notebook into
    ``course/autograded``: automatic scores, the grader's first line per cell as its comment, the submission time
    and late penalty; a written answer the learner changed stays to grade. Returns what the instructor should know.
    Needs the assignments in the gradebook (``nbgrader generate_assignment``, which releasing runs)."""
    from nbgrader.api import Gradebook

    notes = []
    graded = [s for s in subs if s.graded]
    with Gradebook(_db_url(course)) as gb:
        missing = sorted({s.assignment for s in graded} - {a.name for a in gb.assignments})
        for slug in missing:
            notes.append(f"gradebook: {slug} is not in {course / 'gradebook.db'}: run `nbgrader generate_assignment "
                         f"{slug}` in {course}, then grade again to see it in formgrader")
        for sub in graded:
            if sub.assignment in missing:
                continue
            student = grader_id(sub.student)
            source = autograded_root / student / sub.assignment / f"{sub.assignment}.ipynb"
            if not source.is_file():
                notes.append(f"gradebook: {sub.student}/{sub.assignment}: no autograded notebook kept, not recorded")
                continue
            gb.update_or_create_student(student)
            stamp = {"timestamp": sub.timestamp} if sub.timestamp else {}
            with warnings.catch_warnings():  # SQLAlchemy's notice on nbgrader's own way of adding a submission
                warnings.simplefilter("ignore")
                submission = gb.update_or_create_submission(sub.assignment, student, **stamp)
            scores = {g.grade_id: g for g in sub.grades}
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    ours = scores.get(grade.name)
                    if ours is None:
                        continue
                    if ours.needs_manual_grade:  # the learner wrote an answer: the instructor grades it (once)
                        grade.auto_score, grade.needs_manual_grade = None, grade.manual_score is None
                    else:
                        grade.auto_score, grade.needs_manual_grade = ours.score, False
                for comment in notebook.comments:
                    ours = scores.get(comment.name)
                    comment.auto_comment = (ours.message.splitlines() or [""])[0] if ours and ours.message else None
                notebook.late_submission_penalty = sub.late_penalty or None
                notebook.flagged = bool(sub.flagged or sub.needs_review)
            gb.db.commit()
            target = course / "autograded" / student / sub.assignment
            target.mkdir(parents=True, exist_ok=True)
            nb = with_rubrics(inert_notebook(json.loads(source.read_text(encoding="utf-8")), course_text(sub.assignment)),
                              sub.assignment)
            (target / f"{sub.assignment}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
            for name in ("timestamp.txt", "submission_secret.txt"):  # release_feedback pairs feedback with them
                given = sub.path.parent / name
                if given.is_file() and not given.is_symlink() and given.stat().st_size <= TIMESTAMP_LIMIT:
                    shutil.copyfile(given, target / name)
    for path in (course / "autograded", course / "gradebook.db"):
        _owned_like(course, path)
    return notes


def _owned_like(course: Path, path: Path) -> None:
    """Give what root wrote into the course to the course folder's owner (the instructor whose formgrader writes the
    written scores into the same gradebook)."""
    if os.geteuid() != 0 or not os.path.lexists(path):
        return
    owner = course.stat()
    for folder, dirs, files in os.walk(path):  # nothing for a file
        for name in [*dirs, *files]:
            os.chown(os.path.join(folder, name), owner.st_uid, owner.st_gid, follow_symlinks=False)
    os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


# -- feedback and totals -------------------------------------------------------------------------------------------


def pending_written(course: Path, slug: str, student: str) -> dict[str, float]:
    """grade_id -> points of the written answers of a submission still waiting for the instructor."""
    from nbgrader.api import Gradebook

    with Gradebook(_db_url(course)) as gb:
        notebook = gb.find_submission_notebook(slug, slug, student)
        return {g.name: float(g.max_score) for g in notebook.grades
                if g.cell_type == "markdown" and g.needs_manual_grade and g.manual_score is None}


def _awaiting(page: str, pending: dict[str, float], score: float, max_score: float) -> str:
    """nbgrader's feedback page (its 0.9 template) with each pending written answer's score and the header's total
    saying what they are: awaiting the instructor, not 0."""
    for grade_id, points in pending.items():
        gid = re.escape(html.escape(grade_id))
        page = re.sub(rf'(<a href="#{gid}">[^<]*</a> \(Score: )[0-9.]+ / ', r"\g<1>awaiting the instructor / ", page, 1)
        page = re.sub(rf'(<a name="{gid}"></a>.*?Score: )[0-9.]+ / ', r"\g<1>awaiting the instructor / ", page, 1,
                      flags=re.S)
    if pending:
        waiting = sum(pending.values())
        page = re.sub(r"\(Score: [0-9.]+ / [0-9.]+\)",
                      f"(Score: {score:g} / {max_score - waiting:g} so far; {waiting:g} written "
                      f"point{'' if waiting == 1 else 's'} awaiting the instructor)", page, 1)
    return page


#: Long lines wrap in the page a learner reads (a check's message, a long value).
_WRAP = "<style>pre, .output_text pre, .output_stderr pre { white-space: pre-wrap; overflow-wrap: anywhere; }</style>"


def finish_page(page: str, pending: dict[str, float], score: float, max_score: float) -> str:
    """A feedback page as a learner gets it: pending written answers awaiting, long lines wrapped, made inert."""
    page = _awaiting(page, pending, score, max_score)
    page = page.replace("</head>", _WRAP + "</head>", 1)
    return sanitise_html(page)


def write_feedback(course: Path, slug: str) -> list[str]:
    """``nbgrader generate_feedback`` for every graded submission of ``slug`` in the course (no code runs: it
    renders the autograded notebooks with the gradebook's scores, written ones included), each page then finished
    (finish_page). What ``nbgrader release_feedback`` sends through the exchange. Returns the pages written."""
    from nbgrader.api import Gradebook

    from specdec.course.driver import run_nbgrader

    steps = ("nbgrader.preprocessors.GetGrades", "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
             "nbconvert.preprocessors.TagRemovePreprocessor")  # nbgrader's two, then the rubrics left out
    run_nbgrader(course, "generate_feedback", slug, "--force", *(f"--GenerateFeedback.preprocessors={s}" for s in steps),
                 "--TagRemovePreprocessor.enabled=True", f"--TagRemovePreprocessor.remove_cell_tags={RUBRIC_TAG}")
    written = []
    with Gradebook(_db_url(course)) as gb:
        rows = [(s.student.id, float(s.score), float(s.max_score)) for s in gb.assignment_submissions(slug)]
    for student, score, max_score in rows:
        page_path = course / "feedback" / student / slug / f"{slug}.html"
        if not page_path.is_file():
            continue
        pending = pending_written(course, slug, student)
        page = finish_page(page_path.read_text(encoding="utf-8"), pending, score, max_score)
        page_path.write_text(page, encoding="utf-8")
        written.append(str(page_path))
        submitted = sorted((course / "submitted" / student / slug).glob("*.ipynb"))
        if len(submitted) == 1 and submitted[0].stem != slug:  # a renamed notebook: the exchange pairs feedback by name
            (page_path.parent / f"{submitted[0].stem}.html").write_text(page, encoding="utf-8")
    return written


TOTALS_FIELDS = ("student", "assignment", "timestamp", "seconds_late", "automatic", "written_graded", "written_pending",
                 "late_penalty", "total", "max_score")


def totals(course: Path, slug: str) -> list[dict]:
    """One row per submission: automatic points, written points graded and still to grade, the late penalty and
    the total, each against the same maximum everywhere (automatic + written)."""
    from nbgrader.api import Gradebook

    rows = []
    with Gradebook(_db_url(course)) as gb:
        assignment = gb.find_assignment(slug)
        for sub in gb.assignment_submissions(slug):
            auto = written_graded = written_pending = 0.0
            for notebook in sub.notebooks:
                for grade in notebook.grades:
                    if grade.cell_type == "markdown":
                        if grade.needs_manual_grade and grade.manual_score is None:
                            written_pending += float(grade.max_score)
                        else:
                            written_graded += float(grade.score)
                    else:
                        auto += float(grade.score)
            penalty = float(sub.late_submission_penalty or 0.0)
            rows.append({"student": sub.student.id, "assignment": slug,
                         "timestamp": sub.timestamp.isoformat() if sub.timestamp else "",
                         "seconds_late": float(sub.total_seconds_late), "automatic": auto,
                         "written_graded": written_graded, "written_pending": written_pending,
                         "late_penalty": penalty, "total": max(0.0, auto + written_graded - penalty),
                         "max_score": float(assignment.max_score)})
    return sorted(rows, key=lambda r: r["student"])



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdec.course.gradebook",
        description="After cohort grading (--course) and the written answers in formgrader: feedback and totals.")
    parser.add_argument("command", choices=("feedback", "totals"),
                        help="feedback: render every graded submission's feedback with its written scores into "
                             "COURSE/feedback (then `nbgrader release_feedback SLUG` sends it through the exchange); "
                             "totals: one CSV row per submission, automatic, written graded, written pending, late "
                             "penalty, total and maximum")
    parser.add_argument("assignments", nargs="+", metavar="SLUG")
    parser.add_argument("--course", type=Path, default=Path("grader"), help="the nbgrader course (default grader/)")
    parser.add_argument("--out", type=Path, help="totals: the CSV file (default: printed)")
    args = parser.parse_args(argv)
    if not (args.course / "gradebook.db").is_file():
        print(f"gradebook: no gradebook.db in {args.course}", file=sys.stderr)
        return 2
    if args.command == "feedback":
        for slug in args.assignments:
            pages = write_feedback(args.course, slug)
            print(f"{slug}: {len(pages)} feedback pages in {args.course / 'feedback'}; send them with "
                  f"`nbgrader release_feedback {slug}` in {args.course}")
        return 0
    rows = [row for slug in args.assignments for row in totals(args.course, slug)]
    with (open(args.out, "w", newline="", encoding="utf-8") if args.out else contextlib.nullcontext(sys.stdout)) as f:
        writer = csv.DictWriter(f, fieldnames=list(TOTALS_FIELDS))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: csv_cell(v) if isinstance(v, str) else f"{v:g}" for k, v in row.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
