"""Driving nbgrader: scratch course folders, release, autograde and reading the gradebook.

``make release``, ``make grade`` and the pipeline tests all go through here. Every run
works in a scratch copy of ``grader/`` so neither the committed course root nor a
learner's notebooks are ever written to.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from specdec.paths import GRADER_DIR, SOURCE_DIR

SLUG = re.compile(r"^\d\d_[a-z0-9_]+$")


class NbgraderError(RuntimeError):
    """An nbgrader command failed; the message carries its log."""


@dataclass(frozen=True)
class CellGrade:
    """The result of one graded cell of one notebook."""

    notebook: str
    grade_id: str
    score: float
    max_score: float
    needs_manual_grade: bool = False
    message: str = ""
    written: bool = False  # a written answer an instructor grades (nbgrader's manually graded answer cell)


def assignments() -> list[str]:
    """The course's assignments, in order: one folder ``NN_slug`` per notebook."""
    return sorted(p.name for p in SOURCE_DIR.iterdir() if p.is_dir() and SLUG.match(p.name))


def source_notebook(slug: str) -> Path:
    return SOURCE_DIR / slug / f"{slug}.ipynb"


def nbgrader_env(threads: int | None = None) -> dict[str, str]:
    """The environment for nbgrader: this Python's bin/ first on PATH (it calls alembic); with ``threads``, the
    kernels' torch thread count (for graders running side by side). CUDA is hidden: grading judges on the CPU on
    every machine (Triton's interpreter, where notebook 08's loads are counted; the cohort sandbox has no GPU device
    either), so a GPU neither changes a verdict nor lets the trusted side hand the sandbox CUDA tensors."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_nbgrader(course_root: Path, *args: str, timeout: float | None = None,
                 threads: int | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``nbgrader ARGS`` with ``course_root`` as the course (``env``: variables to set for it and its kernels);
    raise with its log on failure."""
    cmd = [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course_root}"]
    proc = subprocess.run(cmd, cwd=course_root, env={**nbgrader_env(threads), **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise NbgraderError(f"`nbgrader {' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def make_course(root: Path, slugs: list[str]) -> Path:
    """A scratch nbgrader course at ``root`` holding the given assignments' sources."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(GRADER_DIR / "nbgrader_config.py", root / "nbgrader_config.py")
    for slug in slugs:
        shutil.copytree(SOURCE_DIR / slug, root / "source" / slug,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return root


def generate(course_root: Path, slug: str) -> Path:
    """``nbgrader generate_assignment``: returns the student notebook it wrote."""
    run_nbgrader(course_root, "generate_assignment", slug, "--force")
    return course_root / "release" / slug / f"{slug}.ipynb"


def submit(course_root: Path, slug: str, student: str, notebook: Path | nbformat.NotebookNode) -> Path:
    """Place a notebook where nbgrader looks for ``student``'s submission of ``slug``."""
    dest = course_root / "submitted" / student / slug / f"{slug}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(notebook, Path):
        shutil.copy(notebook, dest)
    else:
        nbformat.write(notebook, dest)
    return dest


#: nbgrader's per-cell limit for the course (seconds), as grader/nbgrader_config.py sets it.
CELL_TIMEOUT_S = 120


def autograde(course_root: Path, slug: str, student: str = "*", timeout: float | None = None,
              cell_timeout_s: float = CELL_TIMEOUT_S, threads: int | None = None,
              env: dict[str, str] | None = None) -> None:
    """``nbgrader autograde`` of one student, or of all ("*"); hidden tests restored from the source."""
    run_nbgrader(course_root, "autograde", slug, f"--student={student}", "--force",
                 f"--Execute.timeout={int(cell_timeout_s)}", timeout=timeout, threads=threads, env=env)


def timeout_message(cell_timeout_s: float) -> str:
    """What a learner or an instructor reads when nbgrader stopped a cell at its time limit."""
    return (f"timed out: it ran past the per-cell limit of {cell_timeout_s:g} s and was stopped (the code is too slow "
            "or never ends, or the machine was busy). Rerun on a quiet machine, or raise the limit: "
            "`make grade CELL_TIMEOUT=300` (cohorts: `--cell-timeout 300`)")


def _error_line(out: dict) -> str:
    first = (out.get("evalue") or "").strip().splitlines()
    return f"{out.get('ename')}: {first[0] if first else ''}".strip()


def _cell_messages(notebook_path: Path, cell_timeout_s: float = CELL_TIMEOUT_S) -> dict[str, str]:
    """grade_id -> first line of what went wrong in that cell (error or stderr)."""
    if not notebook_path.exists():
        return {}
    nb = json.loads(notebook_path.read_text())
    messages = {}
    broken_above = ""  # the last error raised by a cell that defines code (not a test cell)
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if not meta.get("grade"):
            if errors and cell.get("cell_type") == "code":
                name = meta.get("grade_id", "a cell above")
                timed_out = errors[0].get("ename") in ("KeyboardInterrupt", "CellTimeoutError")
                broken_above = (f"{name} {timeout_message(cell_timeout_s)}" if timed_out
                                else f"{name} raised {_error_line(errors[0])}")
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                first = (out.get("evalue") or "").strip().splitlines()
                if out.get("ename") == "NotImplementedError":
                    where = _innermost_function("\n".join(out.get("traceback", [])))
                    messages[meta["grade_id"]] = f"not done yet ({where or 'the skeleton'} still raises NotImplementedError)"
                elif out.get("ename") in ("KeyboardInterrupt", "CellTimeoutError"):
                    messages[meta["grade_id"]] = timeout_message(cell_timeout_s)
                elif broken_above and "NameError" in f"{out.get('ename')} {out.get('evalue')}":
                    # a function left undefined by a failed answer cell: name that cell (a check reports the
                    # NameError inside its own message)
                    messages[meta["grade_id"]] = f"the cell {broken_above} ({_error_line(out)} here)"
                elif out.get("ename") == "CheckFailure":  # the course's own checks: the message says it all
                    messages[meta["grade_id"]] = first[0] if first else "check failed"
                else:
                    messages[meta["grade_id"]] = _error_line(out)
                break
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                text = "".join(out.get("text", "")).strip().splitlines()
                messages[meta["grade_id"]] = f"wrote to stderr: {text[0] if text else ''}"
                break
    return messages


#: Frames of these folders are the hidden checks' own code: feedback leaves them out.
_HIDDEN_FRAMES = re.compile(r"^File [^\n]*[/\\\\]specdec[/\\\\](checks|mistakes)[/\\\\]")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def hide_check_frames(autograded: Path) -> int:
    """Drop the hidden checks' stack frames from every traceback of an autograded notebook, before its
    feedback is written: the learner sees their own cells' frames and the check's message. Frames removed."""
    nb = json.loads(autograded.read_text())
    removed = 0
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            kept = [entry for entry in out.get("traceback", []) if not _HIDDEN_FRAMES.match(_ANSI.sub("", entry))]
            if len(kept) < len(out.get("traceback", [])):
                removed += len(out["traceback"]) - len(kept)
                kept.insert(len(kept) - 1, "(the hidden check's own lines are left out: its message below says what "
                                           "was wrong)")
                out["traceback"] = kept
    if removed:
        autograded.write_text(json.dumps(nb))
    return removed


def _innermost_function(traceback_text: str) -> str:
    """The function named by the last 'in name(' frame of an IPython traceback."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", traceback_text)
    names = [n for n in re.findall(r"\bin (\w+)\(", plain) if n != "call"]
    return names[-1] if names else ""


def read_grades(course_root: Path, slug: str, student: str, cell_timeout_s: float = CELL_TIMEOUT_S) -> list[CellGrade]:
    """Scores of every graded cell of ``student``'s ``slug``, from the gradebook."""
    from nbgrader.api import Gradebook

    messages = _cell_messages(course_root / "autograded" / student / slug / f"{slug}.ipynb", cell_timeout_s)
    written = _written_ids(source_notebook(slug))
    db_url = f"sqlite:///{course_root / 'gradebook.db'}"
    rows = []
    with Gradebook(db_url) as gb:
        submission = gb.find_submission_notebook(slug, slug, student)
        for grade in submission.grades:
            rows.append(
                CellGrade(
                    notebook=slug,
                    grade_id=grade.name,
                    score=float(grade.score or 0.0),
                    max_score=float(grade.max_score),
                    needs_manual_grade=bool(grade.needs_manual_grade),
                    message=messages.get(grade.name, ""),
                    written=grade.name in written,
                )
            )
    order = _grade_order(source_notebook(slug))
    return sorted(rows, key=lambda r: order.get(r.grade_id, len(order)))


def _written_ids(notebook_path: Path) -> set[str]:
    """grade_ids of the manually graded answers (cells that are both graded and a solution)."""
    nb = json.loads(notebook_path.read_text())
    metas = [c.get("metadata", {}).get("nbgrader", {}) for c in nb["cells"]]
    return {m["grade_id"] for m in metas if m.get("grade") and m.get("solution")}


def _grade_order(notebook_path: Path) -> dict[str, int]:
    nb = json.loads(notebook_path.read_text())
    ids = [c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb["cells"]]
    return {grade_id: i for i, grade_id in enumerate(ids) if grade_id}
