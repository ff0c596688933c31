"""``make grade``: grade the learner's own notebooks against the hidden tests.

Copies each ``notebooks/NN_slug.ipynb`` into a scratch nbgrader course as a submission,
autogrades it (hidden tests restored from ``grader/source``), prints a table of points
per exercise with each failure's first sentence, and writes HTML feedback to ``.grades/feedback/``
(the learner's code and each check's message; the hidden checks' own lines are left out). While a
notebook runs it shows which cell is running; after it, the written answers the learner attempted
beside their model answers and rubrics (``--no-model-answers`` hides them), and a note for any answer
that calls the ``specdec`` reference it is meant to implement. The learner's files are only read,
never written.

Usage: ``python -m specdec.course.grading [NOTEBOOK ...]`` where NOTEBOOK is a path, a file
name or a number (``01``). Exit status 0 whenever grading ran, whatever the score.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import nbformat

from specdec.course.driver import (
    CELL_TIMEOUT_S,
    CellGrade,
    NbgraderError,
    assignments,
    autograde,
    generate,
    hide_check_frames,
    make_course,
    read_grades,
    run_nbgrader,
    source_notebook,
    submit,
)
from specdec.course.progress import HOOK_CONFIG, PROGRESS_ENV, CellWatch
from specdec.course.reference_calls import reference_calls
from specdec.course.written import format_model_answers, written_answers
from specdec.models.devices import NEEDS_TRITON, TRITON_NEEDED, triton_installed
from specdec.paths import NOTEBOOKS_DIR, REPO_ROOT

STUDENT = "learner"
REPORT_DIR = REPO_ROOT / ".grades"


def _resolve(names: list[str], notebooks_dir: Path) -> list[tuple[str, Path]]:
    """(slug, path) for the notebooks to grade; all of the course's by default."""
    known = assignments()
    if not names:
        return [(slug, notebooks_dir / f"{slug}.ipynb") for slug in known]
    chosen = []
    for name in names:
        stem = Path(name).stem
        matches = [slug for slug in known if slug == stem or slug.startswith(f"{stem}_")
                   or (stem.isdigit() and int(stem) == int(slug[:2]))]
        if len(matches) != 1:
            raise SystemExit(f"grade: {name!r} names no notebook of this course; known: {', '.join(known)}")
        given = Path(name)
        path = given if given.suffix == ".ipynb" and given.exists() else notebooks_dir / f"{matches[0]}.ipynb"
        chosen.append((matches[0], path))
    return chosen


def read_submission(path: Path) -> nbformat.NotebookNode:
    """Read and validate a learner's notebook; raise ValueError with a readable reason."""
    if not path.exists():
        raise ValueError(f"{path.name}: file not found at {path}")
    return parse_submission(path.name, path.read_bytes())  # it says when the bytes are not UTF-8


def parse_submission(name: str, text: str | bytes) -> nbformat.NotebookNode:
    """Validate the text of a learner's notebook called ``name``; raise ValueError with a readable reason."""
    try:
        text = text.decode("utf-8") if isinstance(text, bytes) else text
        json.loads(text)
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not a notebook: it is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{name} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                         "restore it from a checkpoint or from git") from None
    except RecursionError:
        raise ValueError(f"{name} is not a notebook: its JSON is nested too deeply to read") from None
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception as err:  # nbformat raises many kinds on malformed input
        reason = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise ValueError(f"{name} is not a notebook: {reason}") from None
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as err:
        raise ValueError(f"{name} is not a valid notebook: {err.message[:200]}") from None
    return nb


Result = tuple[str, list[CellGrade] | str]


def grade(targets: list[tuple[str, Path]], report_dir: Path = REPORT_DIR,
          cell_timeout_s: float = CELL_TIMEOUT_S, model_answers: bool = True) -> list[Result]:
    """Grade each (slug, path) in turn: (slug, cell grades), or (slug, why it could not be graded). Prints a
    progress line per notebook, and after each one its notes (answers calling the reference, model answers)."""
    results: list[Result] = []
    feedback_dir = report_dir / "feedback"
    with tempfile.TemporaryDirectory(prefix="specdec-grade-") as tmp:
        root = make_course(Path(tmp), sorted({slug for slug, _ in targets}))
        with open(root / "nbgrader_config.py", "a") as config:
            config.write(HOOK_CONFIG)
        progress_file = root / "progress.jsonl"
        os.environ[PROGRESS_ENV] = str(progress_file)  # read by the hook inside nbgrader's process
        try:
            for number, (slug, path) in enumerate(targets, 1):
                started = time.perf_counter()
                print(f"[{number}/{len(targets)}] {slug}: running it with the hidden tests...", flush=True)
                results.append((slug, _grade_one(root, slug, path, feedback_dir, cell_timeout_s, progress_file,
                                                 model_answers)))
                cells = results[-1][1]
                score = (f"{sum(c.score for c in cells):g} / {sum(c.max_score for c in cells if not c.written):g} "
                         "points" if isinstance(cells, list) else "not graded")
                print(f"[{number}/{len(targets)}] {slug}: {score} in {time.perf_counter() - started:.0f} s", flush=True)
        finally:
            os.environ.pop(PROGRESS_ENV, None)
    return results


def _grade_one(root: Path, slug: str, path: Path, feedback_dir: Path, cell_timeout_s: float, progress_file: Path,
               model_answers: bool) -> list[CellGrade] | str:
    if slug in NEEDS_TRITON and not triton_installed():
        return TRITON_NEEDED
    try:
        nb = read_submission(path)
        generate(root, slug)
        submit(root, slug, STUDENT, nb)
        with CellWatch(progress_file, slug, len(nb.cells)):
            autograde(root, slug, STUDENT, cell_timeout_s=cell_timeout_s)
        cells = read_grades(root, slug, STUDENT, cell_timeout_s)
        autograded = root / "autograded" / STUDENT / slug / f"{slug}.ipynb"
        if autograded.exists():
            hide_check_frames(autograded)
        run_nbgrader(root, "generate_feedback", slug, f"--student={STUDENT}", "--force")
        html = root / "feedback" / STUDENT / slug / f"{slug}.html"
        if html.exists():
            feedback_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(html, feedback_dir / f"{slug}.html")
    except ValueError as err:
        return str(err)
    except NbgraderError as err:
        return f"grading failed: {str(err).splitlines()[0]} (log below)\n{err}"
    for note in reference_calls(nb, nbformat.read(source_notebook(slug), as_version=4)):
        print(f"  note: {note}: its points are the reference's, not yours (fine for moving on; write your own to "
              "practise)", flush=True)
    answers = written_answers(slug, nb) if model_answers else []
    if answers:
        print(format_model_answers(slug, answers), flush=True)
    return cells


MESSAGE_WIDTH = 90


def _first_sentence(message: str) -> str:
    """The message up to the end of its first sentence (a period, '?' or '!' before a space), its lines joined: a
    tensor printed over several lines stays in it."""
    line = " ".join(message.split())
    for i, char in enumerate(line[:-1]):
        if char in ".?!" and line[i + 1] == " " and not line[max(0, i - 3):i + 1].endswith(("e.g.", "i.e.", "vs.")):
            return line[: i + 1]
    return line


FULL_MESSAGE_CHARS = 1500


def format_failures(results: list[Result]) -> str:
    """Every failing exercise's whole message (the table shows its first sentence): the input, what was expected,
    what came back and the likely cause, or a drill answer's derivation."""
    blocks = []
    for slug, cells in results:
        if isinstance(cells, str):
            continue
        for cell in cells:
            if cell.written or cell.score >= cell.max_score or not cell.message.strip():
                continue
            text = " ".join(cell.message.split())
            if len(text) > FULL_MESSAGE_CHARS:
                text = text[:FULL_MESSAGE_CHARS] + " ... (the rest in the HTML feedback)"
            wrapped = textwrap.fill(text, MESSAGE_WIDTH + 20, initial_indent="    ", subsequent_indent="    ")
            blocks.append(f"{slug} / {cell.grade_id.removesuffix('_test')}:\n{wrapped}")
    return "\n\n".join(["why each failed, in full:", *blocks]) if blocks else ""


def format_table(results: list[Result]) -> str:
    """The report a learner reads: one row per exercise, then the total."""
    rows = [("notebook", "exercise", "points", "what failed (first sentence; in full below the table)")]
    total = possible = manual = 0.0
    ungraded = []
    for slug, cells in results:
        if isinstance(cells, str):
            rows.append((slug, "-", "-", _first_sentence(cells)))
            ungraded.append(slug)
            continue
        for cell in cells:
            exercise = cell.grade_id.removesuffix("_test")
            if cell.written:  # an instructor grades it; not part of the automatic total
                status = ("needs manual grading (a written answer)" if cell.needs_manual_grade
                          else "written answer: not answered yet")
                rows.append((slug, exercise, f"? / {cell.max_score:g}", status))
                manual += cell.max_score
                continue
            rows.append((slug, exercise, f"{cell.score:g} / {cell.max_score:g}", _first_sentence(cell.message)))
            total += cell.score
            possible += cell.max_score
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    indent = " " * (sum(widths) + 6)
    lines = []
    for r in rows:
        wrapped = textwrap.wrap(r[3], MESSAGE_WIDTH) or [""]
        lines.append(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {wrapped[0]}".rstrip())
        lines += [indent + more for more in wrapped[1:]]
    lines.insert(1, "-" * (sum(widths) + 6 + MESSAGE_WIDTH))
    not_graded = f" (not graded: {', '.join(ungraded)})" if ungraded else ""
    by_hand = f", plus {manual:g} points of written answers for an instructor to grade" if manual else ""
    lines.append(f"total: {total:g} / {possible:g} points{by_hand}{not_graded}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade your notebooks against the hidden tests.")
    parser.add_argument("notebooks", nargs="*", help="notebooks to grade (path, file name or number); default: all")
    parser.add_argument("--dir", type=Path, default=NOTEBOOKS_DIR, help="folder of your notebooks (default: notebooks/)")
    parser.add_argument("--report-dir", type=Path, default=REPORT_DIR, help="where HTML feedback goes (default: .grades/)")
    parser.add_argument("--no-model-answers", action="store_true",
                        help="do not show the model answers of attempted written answers (for an instructor)")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S,
                        help=f"seconds one cell may run before it is stopped (default {CELL_TIMEOUT_S})")
    args = parser.parse_args(argv)
    if args.cell_timeout <= 0:
        parser.error(f"--cell-timeout must be > 0, got {args.cell_timeout:g}")
    targets = _resolve(args.notebooks, args.dir)
    print(f"grading {len(targets)} notebook(s) (a copy; your files are not changed)...", flush=True)
    results = grade(targets, args.report_dir, args.cell_timeout, model_answers=not args.no_model_answers)
    print(format_table(results))
    failures = format_failures(results)
    if failures:
        print("\n" + failures)
    for slug, cells in results:
        if isinstance(cells, str) and "\n" in cells:
            print(f"\n--- {slug} ---\n{cells}", file=sys.stderr)
    if (args.report_dir / "feedback").exists():
        print(f"HTML feedback (your code and every check's message in full): {args.report_dir / 'feedback'}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
