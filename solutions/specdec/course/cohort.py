"""Grade a cohort's submissions in parallel: ``python -m specdec.course.cohort SUBMITTED [--out DIR]``.

SUBMITTED uses nbgrader's layout, ``<student>/<assignment>/<notebook>.ipynb`` (what
``nbgrader collect`` gives, or an LMS export unpacked that way). Each submission is graded alone,
in its own scratch copy of a course prepared once (the assignments generated, so the hidden
tests come from ``grader/source``), by its own ``nbgrader autograde`` process with a wall-clock
limit, a per-cell limit and a memory limit. Run as root on Linux, each grading process also gets
a private mount namespace in which the repository (course sources, package, virtual environment),
the submissions, the results and every other scratch folder are read-only. So a submission can
stall, crash or tamper only with its own grading: never another's, never the course's files.

Before grading, each notebook is checked and repaired where a repair is safe: unreadable files
are reported, a deleted test cell is restored from the course, graded cells moved out of order
are put back in the course's order, a notebook of another assignment is refused, and code that
looks like tampering with the checks, or an answer that calls the ``specdec`` reference it is meant to
implement, is flagged for review. Every such event goes into the
report with the student's name. One submission never costs the cohort: a notebook that is a folder, a
named pipe, a device or over NOTEBOOK_LIMIT is refused unopened, malformed nbgrader metadata is refused,
and whatever else goes wrong with one submission becomes its own "not graded: why" row.

Writes to --out: ``grades.csv`` (one row per student, assignment and graded cell),
``totals.csv`` (one row per student and assignment), ``summary.json`` (mean and distribution per
exercise), ``report.txt`` (every message) and ``feedback/<student>/<assignment>.html``. What a submission
controls is written inert (``specdec.course.inert``): names, messages and quoted lines with their control
characters escaped and their length capped, and the feedback HTML without scripts, handlers or active content.
Exit status 0 when grading ran, whatever the scores; 2 when it could not start.

A cohort too big for one machine runs as shards on a cluster scheduler (``grader/cluster/``: a Kubernetes
Indexed Job and a Slurm array): ``--shard K/N`` grades only the students whose name hashes to K
(0 <= K < N; a stable partition, so every student lands in exactly one shard), and also writes
``shard.json``; ``python -m specdec.course.cohort merge SHARD_DIR ... --out DIR`` combines the shards into
the same four files (and feedback) one machine would have written.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import dataclasses
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from specdec.checks.seeds import SALT_VARIABLE
from specdec.course import boxes, sandbox, similarity
from specdec.course.driver import (
    CellGrade,
    assignments,
    generate,
    hide_check_frames,
    make_course,
    nbgrader_env,
    read_grades,
    source_notebook,
)
from specdec.course.gradebook import (
    due_date,
    finish_page,
    format_lateness,
    grader_id,
    lateness,
    read_timestamp,
    record,
    set_due_dates,
)
from specdec.course.grading import parse_submission
from specdec.course.inert import cap, csv_cell, visible
from specdec.course.reference_calls import parse_cell, reference_calls
from specdec.course.trusted import FORGED, SHADOWED
from specdec.course.withheld import WITHHELD
from specdec.paths import NOTEBOOKS_DIR, REPO_ROOT


@dataclass(frozen=True)
class Limits:
    timeout_s: float  # a whole notebook
    cell_timeout_s: float
    memory_mb: int  # address space of the grading process and its kernel
    isolate: bool  # read-only mounts of everything but the submission's own scratch folder
    sandbox: bool = False  # the kernel in a bubblewrap sandbox, test cells judged outside it (specdec.course.trusted)
    salt: str = ""  # the run's secret, mixed into the hidden tests' seeds (specdec.checks.seeds); graders see it
    course: Path | None = None  # the instructor's nbgrader course: due dates and extensions come from its gradebook


@dataclass
class Submission:
    student: str
    assignment: str
    path: Path
    grades: list[CellGrade] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)  # what happened, for the report
    flagged: bool = False  # looks like tampering: an instructor should read it
    needs_review: bool = False  # the sandbox or the grader saw something a score cannot show: held for review
    graded: bool = False
    seconds: float = 0.0
    refused: str = ""  # why it cannot be graded, found before grading (its folder holds no notebook, say)
    index: int = 0  # its place in the run: its grader's uid (specdec.course.boxes.grader_uid)
    timestamp: str = ""  # when it was submitted (nbgrader's timestamp.txt, UTC), "" when unknown
    seconds_late: float = 0.0  # past the assignment's due date, as nbgrader's gradebook computes it
    late_penalty: float = 0.0  # points taken off by nbgrader's LateSubmissionPlugin (the course's penalty_method)
    answers: dict[str, str] = field(default_factory=dict)  # grade_id -> code answer, for similarity
    similar: bool = False  # an answer too alike another's or the reference's: for review, never penalised
    fingerprint: str = ""  # what its grade depends on (fingerprint): --changed keeps a grade whose inputs are the same


#: Most bytes a submitted notebook may have: a bigger file is refused unread (the course's notebooks, outputs
#: included, are a few MB).
NOTEBOOK_LIMIT = 50 * 2**20
MESSAGE_LIMIT = 2000  # characters kept of one message (a check's, an exception's, the grader's)
NAME_LIMIT = 1024  # characters of a name in the results (a folder name has at most 255 bytes: escaped, 1,020)
LINE_LIMIT = 4000  # characters of one line of report.txt or the console
MESSAGES_LIMIT = 20_000  # characters of totals.csv's messages (the csv module reads fields of up to 131,072)
FEEDBACK_LIMIT = 64 * 2**20  # bytes of feedback HTML sanitised and kept


def _folders(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir())


def find_submissions(root: Path, known: list[str]) -> tuple[list[Submission], list[str]]:
    """The submissions under root (student/assignment/notebook.ipynb), and what could not be used. A folder of an
    assignment whose notebook cannot be picked out is a submission too, refused (its row says why)."""
    found, problems = [], []
    for student_dir in _folders(root):
        try:
            assignment_dirs = _folders(student_dir)
        except OSError as err:
            problems.append(f"{student_dir.name}: the folder cannot be read ({err.strerror})")
            continue
        for assignment_dir in assignment_dirs:
            where = f"{student_dir.name}/{assignment_dir.name}"
            if assignment_dir.name not in known:
                problems.append(f"{where}: {assignment_dir.name!r} is not an assignment of this course")
                continue
            expected = assignment_dir / f"{assignment_dir.name}.ipynb"
            try:
                notebooks = sorted(p for p in assignment_dir.glob("*.ipynb") if not p.name.startswith("."))
            except OSError as err:
                found.append(Submission(student_dir.name, assignment_dir.name, expected,
                                        refused=f"the folder cannot be read ({err.strerror})"))
                continue
            path = expected if expected in notebooks else notebooks[0] if len(notebooks) == 1 else None
            if path is None:
                names = [p.name for p in notebooks[:20]] + ([f"and {len(notebooks) - 20} more"] if len(notebooks) > 20 else [])
                found.append(Submission(student_dir.name, assignment_dir.name, expected,
                                        refused=f"expected {expected.name}, found {names or 'no notebook'}"))
                continue
            sub = Submission(student_dir.name, assignment_dir.name, path)
            if path != expected:
                sub.messages.append(f"renamed: the folder's one notebook, {path.name}, was graded as {expected.name}")
            sub.timestamp, problem = read_timestamp(assignment_dir)
            if problem:
                sub.messages.append(problem)
            found.append(sub)
    return found, problems


def _file_kind(mode: int) -> str | None:
    """None for a regular file, else what it is."""
    for test, kind in ((stat.S_ISREG, None), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a link")):
        if test(mode):
            return kind
    return "not a regular file"


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The submitted notebook, read only when it is a regular file of at most NOTEBOOK_LIMIT bytes: a named pipe
    would block the grader for ever, a device or a huge file fill its memory. ValueError says why not."""
    def refuse(why: str):
        raise ValueError(f"{path.name} {why}")

    try:
        info = os.lstat(path)
    except OSError as err:
        refuse(f"cannot be read ({err.strerror})")
    kind = _file_kind(info.st_mode)
    if kind:
        refuse(f"is {kind}, not a notebook file")
    too_big = (f"has more than the {NOTEBOOK_LIMIT // 2**20} MB a notebook may have ({{:,.0f}} MB): clear its "
               "outputs (Kernel > Restart and clear outputs) and submit it again")
    if info.st_size > NOTEBOOK_LIMIT:
        refuse(too_big.format(info.st_size / 2**20))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:  # what was checked is what is opened: no link followed, no pipe waited on, no regular file swapped in
        fd = os.open(path, flags)
    except OSError as err:
        refuse(f"cannot be read ({err.strerror})")
    with os.fdopen(fd, "rb") as f:
        kind = _file_kind(os.fstat(f.fileno()).st_mode)
        if kind:
            refuse(f"is {kind}, not a notebook file")
        data = f.read(NOTEBOOK_LIMIT + 1)
    if len(data) > NOTEBOOK_LIMIT:
        refuse(too_big.format(len(data) / 2**20))
    return parse_submission(path.name, data)


# -- repairs and flags before grading --------------------------------------------------------------------------


def _nbgrader(cell) -> dict:
    """A cell's nbgrader metadata; {} when it has none (or none that is an object: see malformed)."""
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    found = meta.get("nbgrader") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def _grade_id(cell) -> str | None:
    gid = _nbgrader(cell).get("grade_id")
    return gid if isinstance(gid, str) and gid else None


def _json_kind(value) -> str:
    if value is None:
        return "null"
    for kind, name in ((bool, "true or false"), ((int, float), "a number"), (str, "text"), (list, "a list"),
                       (dict, "an object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def malformed(nb) -> str | None:
    """Why the notebook's nbgrader metadata cannot be graded (a cell's is null or not an object, a grade_id that
    is not text, a flag that is not true or false, points that are not a number), or None."""
    for index, cell in enumerate(nb.cells, 1):
        meta = cell.get("metadata")
        if not isinstance(meta, dict):
            return f"cell {index}'s metadata is {_json_kind(meta)}, not an object"
        if "nbgrader" not in meta:
            continue
        found = meta["nbgrader"]
        restore = "(was the notebook edited outside Jupyter?): restore the cell from the released notebook"
        if not isinstance(found, dict):
            return f"cell {index}'s nbgrader metadata is {_json_kind(found)}, not an object {restore}"
        if "grade_id" in found and not isinstance(found["grade_id"], str):
            return f"cell {index}'s nbgrader grade_id is {_json_kind(found['grade_id'])}, not text {restore}"
        for flag in ("grade", "solution", "locked", "task"):
            if flag in found and not isinstance(found[flag], bool):
                return f"cell {index}'s nbgrader {flag!r} is {_json_kind(found[flag])}, not true or false {restore}"
        points = found.get("points")
        if "points" in found and (isinstance(points, bool) or not isinstance(points, (int, float))):
            return f"cell {index}'s nbgrader points are {_json_kind(points)}, not a number {restore}"
    return None


def course_ids() -> dict[str, set[str]]:
    """Each assignment's grade_ids that no other assignment uses (so "setup" does not count)."""
    ids = {slug: {g for g in map(_grade_id, nbformat.read(source_notebook(slug), as_version=4).cells) if g}
           for slug in assignments()}
    return {slug: own - set().union(*(v for k, v in ids.items() if k != slug)) for slug, own in ids.items()}


def identify(nb, assignment: str, distinctive: dict[str, set[str]]) -> str | None:
    """None when nb looks like the assignment's notebook; else why not (another assignment's, say)."""
    ids = {g for g in map(_grade_id, nb.cells) if g}
    if ids & distinctive[assignment]:
        return None
    others = [slug for slug, own in distinctive.items() if slug != assignment and ids & own]
    if others:
        return f"this is the notebook of {others[0]}, submitted as {assignment}"
    return "none of its cells belongs to the assignment (was it made from scratch, or its cells' metadata removed?)"


def repair(nb, released: nbformat.NotebookNode) -> list[str]:
    """Restore deleted test cells and the course's order of graded cells, in place; what was done."""
    release_ids = [g for g in map(_grade_id, released.cells) if g]
    sub_ids = [g for g in map(_grade_id, nb.cells) if g]
    done, restored = [], {}
    for cell in released.cells:
        meta = _nbgrader(cell)
        if meta.get("locked") and meta.get("grade_id") not in sub_ids:
            restored[meta["grade_id"]] = cell
            done.append(f"cell {meta['grade_id']} was deleted: restored from the course")
    lost = [g for g in release_ids if g not in sub_ids and g not in restored]
    if lost:
        done.append(f"answer cells deleted: {', '.join(lost)} (the tests that need them fail)")
    in_order = [g for g in sub_ids if g in release_ids] == [g for g in release_ids if g in sub_ids]
    if not in_order:
        done.append("graded cells were out of order: graded in the course's order")
    if in_order and not restored:
        return done
    groups: dict[str | None, list] = {None: []}  # each graded cell with the learner's own cells that follow it
    current = None
    for cell in nb.cells:
        if _grade_id(cell):
            current = _grade_id(cell)
            groups[current] = [cell]
        else:
            groups[current].append(cell)
    cells = list(groups[None])
    for gid in release_ids:
        cells += groups.get(gid, [restored[gid]] if gid in restored else [])
    for gid in sub_ids:
        if gid not in release_ids:
            cells += groups[gid]
    nb.cells = cells
    return done


#: Names whose rebinding in a submission would let it fake the checks or the grading.
_GUARDED_NAMES = {"checks", "expect_equal", "expect_close", "CheckFailure", "compare_frequencies"}


def tampering(nb) -> list[str]:
    """Lines of the learner's code cells that could fake the checks or write outside the notebook."""
    found = []
    for index, cell in enumerate(nb.cells):
        meta = _nbgrader(cell)
        if cell.cell_type != "code" or meta.get("locked"):
            continue
        tree = parse_cell(cell.source)
        if tree is None:
            continue
        for node in ast.walk(tree):
            why = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in _GUARDED_NAMES:
                        why = f"rebinds {target.id}"
                    elif isinstance(target, ast.Attribute):
                        base = target
                        while isinstance(base, ast.Attribute):
                            base = base.value
                        if isinstance(base, ast.Name) and base.id in _GUARDED_NAMES | {"specdec", "sys", "builtins",
                                                                                        "torch", "nbgrader"}:
                            why = f"assigns to an attribute of {base.id}"
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in _GUARDED_NAMES:
                why = f"redefines {node.name}"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.asname or a.name for a in node.names]
                if any(n in _GUARDED_NAMES for n in names) and not (
                        isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec.checks")):
                    why = "imports over a name the tests use"
            elif isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in {"setattr", "delattr", "exec", "eval", "__import__", "system", "popen", "rmtree", "unlink",
                            "remove", "write_text", "write_bytes"}:
                    why = f"calls {name}"
                elif name == "open" and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and
                                            any(m in a.value for m in "wax+") for a in node.args[1:2]):
                    why = "opens a file for writing"
            if why:
                lines = re.split(r"\r\n|\r|\n", cell.source)  # Python's line breaks (splitlines has more)
                number = getattr(node, "lineno", 0)
                line = lines[number - 1].strip() if 0 < number <= len(lines) else ""
                found.append(f"cell {index + 1} ({_grade_id(cell) or 'not graded'}), line "
                             f"{getattr(node, 'lineno', '?')}: {why}: {line[:100]}")
    return found


OUTPUT_LIMIT = 100_000  # characters kept of one cell output in the feedback


def cut_long_outputs(path: Path) -> int:
    """Shorten every text output longer than OUTPUT_LIMIT in an autograded notebook; characters removed."""
    nb = json.loads(path.read_text())
    removed = 0
    cells = nb.get("cells") if isinstance(nb, dict) else None
    for cell in cells if isinstance(cells, list) else []:  # the kernel wrote the outputs: any shape
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        for output in outputs if isinstance(outputs, list) else []:
            if not isinstance(output, dict):
                continue
            data = output.get("data")
            fields = [("text", output)] if "text" in output else []
            fields += [(k, data) for k in ("text/plain", "text/html") if isinstance(data, dict) and k in data]
            for key, holder in fields:
                text = holder[key]
                text = "".join(t for t in text if isinstance(t, str)) if isinstance(text, list) else text
                if isinstance(text, str) and len(text) > OUTPUT_LIMIT:
                    removed += len(text) - OUTPUT_LIMIT
                    holder[key] = text[:OUTPUT_LIMIT] + f"\n[... {len(text) - OUTPUT_LIMIT:,} characters cut by the grader]\n"
    if removed:
        path.write_text(json.dumps(nb))
    return removed


# -- grading one submission -------------------------------------------------------------------------------------


_SETUP = """
import json, os, resource, subprocess, sys
protect, own, limit = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for path in protect:  # read-only views of the course, the submissions, the results and the other graders' folders
    subprocess.run(["mount", "--bind", path, path], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", path], check=True)
if own:  # ... except this submission's own scratch folder
    subprocess.run(["mount", "--bind", own, own], check=True)
    subprocess.run(["mount", "-o", "remount,rw,bind", own], check=True)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.argv[4], sys.argv[4:])
"""


def can_isolate() -> bool:
    """True when this process may make private read-only mounts (root on Linux, with util-linux's unshare)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mount"):
        return False
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                                f"mount --bind {tmp} {tmp} && mount -o remount,ro,bind {tmp} && ! touch {tmp}/x"],
                               capture_output=True)
        return probe.returncode == 0


def _contained(cmd: list[str], memory_mb: int, protect: list[Path], own: Path, isolate: bool) -> list[str]:
    """cmd, started by a small Python that first sets the limits its children inherit (address space,
    no core files) and, when isolating, mounts ``protect`` read-only in a private mount namespace
    with ``own`` left writable. (A wrapper rather than preexec_fn, which is unsafe with threads.)"""
    args = [json.dumps([str(p) for p in protect] if isolate else []), str(own) if isolate else "",
            str(memory_mb * 1024 * 1024)]
    wrapper = [sys.executable, "-c", _SETUP, *args, *cmd]
    return ["unshare", "--mount", "--propagation", "private", "--", *wrapper] if isolate else wrapper


def _private_env(scratch: Path) -> dict[str, str]:
    """nbgrader's environment with every per-user folder inside the submission's scratch folder (never the run's
    salt: the grader reads it from its settings file)."""
    env = nbgrader_env()
    env.pop(SALT_VARIABLE, None)
    for name, sub in (("HOME", "home"), ("IPYTHONDIR", "ipython"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                      ("JUPYTER_DATA_DIR", "data"), ("MPLCONFIGDIR", "mpl"), ("TRITON_CACHE_DIR", "triton")):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(scratch / sub)
    env["OMP_NUM_THREADS"] = "1"  # parallel workers each get one thread
    return env


def _sandbox_settings(scratch: Path, course: Path, assignment: str, build: Path, limits: Limits) -> Path:
    """The settings TrustedExecute reads, and nbgrader told to use it instead of Execute, in this scratch course."""
    own = scratch / "sandbox"
    own.mkdir()
    path = scratch / "sandbox.json"
    path.touch(mode=0o600)  # the run's salt is in it: the grader alone reads it (the kernel never sees scratch)
    path.write_text(json.dumps({"own": str(own), "build": str(build), "assignment": assignment, "salt": limits.salt,
                                "limits": {"cpu_s": int(limits.timeout_s) + 60, "memory_mb": limits.memory_mb}}))
    with open(course / "nbgrader_config.py", "a") as f:
        f.write("\nfrom nbgrader.converters import Autograde\n"
                "from specdec.course.trusted import TrustedExecute\n"
                "c.Autograde.autograde_preprocessors = [\n"
                "    TrustedExecute if p.__name__ == 'Execute' else p\n"
                "    for p in Autograde.class_traits()['autograde_preprocessors'].default()]\n")
    return path


def _held(sub: Submission, log: str, autograded: Path) -> None:
    """Evidence the sandbox leaves: a call of a withheld reference, the grader's helper in the kernel replaced."""
    text = log + (autograded.read_text() if autograded.exists() else "")
    for marker, why in ((WITHHELD, "called a reference that is withheld while grading"),
                        ("was the grader's helper in the kernel replaced",
                         "replaced the grader's helper in its kernel, or kept it from running")):
        if marker in text:
            sub.needs_review = True
            sub.messages.append(f"held for review: the submission {why}")
    for marker, then in ((SHADOWED, " (the tests used the grader's)"), (FORGED, " (the tests had nothing to call)")):
        for line in log.splitlines():  # from the grader's own log only: a submission cannot write it
            if marker in line:
                sub.needs_review = True
                sub.messages.append(f"held for review: the submission {line[line.index(marker):][:300]}{then}")
                break


def publish_feedback(html: Path, target: Path, grades: list[CellGrade] = ()) -> None:
    """nbgrader's feedback page at ``target``, finished as a learner reads it (specdec.course.gradebook.finish_page:
    written answers still to grade awaiting the instructor, lines wrapped, made inert)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    size = html.stat().st_size
    if size > FEEDBACK_LIMIT:
        page = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>feedback</title></head><body><p>The "
                f"feedback page was {size / 2**20:,.0f} MB, over the {FEEDBACK_LIMIT // 2**20} MB the grader keeps: "
                "the scores are in grades.csv.</p></body></html>")
    else:
        pending = {g.grade_id: g.max_score for g in grades if g.written and g.needs_manual_grade}
        automatic = sum(g.score for g in grades if not g.written)
        page = finish_page(html.read_text(encoding="utf-8", errors="replace"), pending, automatic,
                           sum(g.max_score for g in grades))
    target.write_text(page, encoding="utf-8")


def grade_one(sub: Submission, template: Path, release: dict[str, nbformat.NotebookNode], out: Path,
              limits: Limits, protect: list[Path], scratch_root: Path, distinctive: dict[str, set[str]],
              builds: dict[str, Path] | None = None) -> Submission:
    """Grade one submission. Whatever goes wrong with it is its own row ("not graded: why"), never an exception
    that stops the cohort."""
    start = time.perf_counter()
    try:
        _grade(sub, template, release, out, limits, protect, scratch_root, distinctive, builds or {})
    except Exception as err:  # a submission the checks above did not foresee: it alone is not graded
        sub.grades, sub.graded = [], False
        sub.messages.append(f"not graded: the grader failed on this submission ({type(err).__name__}: "
                            f"{cap(str(err), 300)}); an instructor should look at it")
    sub.messages = [cap(m, MESSAGE_LIMIT) for m in sub.messages]
    sub.grades = [dataclasses.replace(g, message=cap(g.message, MESSAGE_LIMIT)) for g in sub.grades]
    sub.seconds = time.perf_counter() - start
    return sub


def _grade(sub: Submission, template: Path, release: dict[str, nbformat.NotebookNode], out: Path, limits: Limits,
           protect: list[Path], scratch_root: Path, distinctive: dict[str, set[str]], builds: dict[str, Path]) -> None:
    if sub.refused:
        sub.messages.append(f"not graded: {sub.refused}")
        return
    if sub.path.is_symlink() or any(p.is_symlink() for p in sub.path.parents if p != p.parent):
        sub.messages.append(f"not graded: {sub.path.name} is a link (to {os.path.realpath(sub.path)}); submit the "
                            "notebook itself")
        sub.needs_review = True
        return
    try:
        nb = read_notebook(sub.path)
    except ValueError as err:
        sub.messages.append(f"not graded: {err}")
        return
    wrong = malformed(nb) or identify(nb, sub.assignment, distinctive)
    if wrong:
        sub.messages.append(f"not graded: {wrong}")
        return
    sub.messages += repair(nb, release[sub.assignment])
    sub.answers = similarity.answers(nb)
    flags = tampering(nb)
    if flags:
        sub.flagged = True
        sub.messages += [f"flagged for review: {f}" for f in flags]
    copied = reference_calls(nb, nbformat.read(source_notebook(sub.assignment), as_version=4))
    if copied:
        sub.flagged = True
        sub.messages += [f"flagged for review: calls the reference: {note}" for note in copied]
    student = grader_id(sub.student)
    scratch = Path(tempfile.mkdtemp(prefix=f"{student}-", dir=scratch_root))
    try:
        _autograde(sub, student, nb, scratch, template, out, limits, protect, builds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _autograde(sub: Submission, student: str, nb: nbformat.NotebookNode, scratch: Path, template: Path, out: Path,
               limits: Limits, protect: list[Path], builds: dict[str, Path]) -> None:
    """nbgrader's autograde and feedback of ``nb`` as ``student`` in a scratch course of its own."""
    course = scratch / "course"
    shutil.copytree(template / sub.assignment, course)
    dest = course / "submitted" / student / sub.assignment / f"{sub.assignment}.ipynb"
    dest.parent.mkdir(parents=True)
    nbformat.write(nb, dest)
    if sub.timestamp:  # with the course's due date, nbgrader's autograde decides lateness
        (dest.parent / "timestamp.txt").write_text(sub.timestamp)
        if limits.course is not None:
            set_due_dates(limits.course, course, sub.assignment, student)
    env = _private_env(scratch)
    tree = None
    if limits.sandbox:
        env["SPECDEC_SANDBOX"] = str(_sandbox_settings(scratch, course, sub.assignment, builds[sub.assignment], limits))
        uid = boxes.grader_uid(sub.index)
        boxes.give(scratch, uid)
        tree = boxes.Tree(scratch.name, limits.memory_mb, TREE_PROCESSES)

        def contained(cmd: list[str]) -> list[str]:
            boxed = boxes.command(uid, scratch, builds[sub.assignment], sub.assignment, cmd, env)
            return [sys.executable, "-c", _JOIN, json.dumps(tree.procs_files()), *boxed]
    else:
        def contained(cmd: list[str]) -> list[str]:
            return _contained(cmd, limits.memory_mb, protect, scratch, limits.isolate)
    try:
        _run_graders(sub, student, course, scratch, out, limits, env, contained, tree)
    finally:
        if tree is not None:
            if not tree.remove():  # whatever the submission started dies with its grading
                sub.messages.append(f"its cgroup ({tree.dirs['memory']}) could not be removed in {boxes.REMOVE_S:g} s: "
                                    "a process of it may still be leaving; an administrator should look")


def _run_graders(sub: Submission, student: str, course: Path, scratch: Path, out: Path, limits: Limits,
                 env: dict[str, str], contained, tree: boxes.Tree | None) -> None:
    cmd = [sys.executable, "-m", "nbgrader", "autograde", sub.assignment, f"--student={student}", "--force",
           f"--CourseDirectory.root={course}", f"--Execute.timeout={int(limits.cell_timeout_s)}"]
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log_file:  # out of the grader's reach
        proc = subprocess.Popen(contained(cmd), cwd=course, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                process_group=0)
        stopped = _watch(proc, tree, limits)
        if stopped:
            sub.messages.append(stopped)
        log_file.seek(0)
        log = log_file.read(LOG_LIMIT)
    if tree is not None:  # nothing of the submission runs while this process (root) reads what it wrote
        tree.kill()
    if tree is not None and tree.out_of_memory():
        sub.messages.append(f"ran out of memory: the submission's processes together passed the {limits.memory_mb} MB "
                            "limit and one was killed (look for a tensor or a list that grows without end)")
    autograded = course / "autograded" / student / sub.assignment / f"{sub.assignment}.ipynb"
    gradebook = course / "gradebook.db"
    for path in (autograded, gradebook):
        if os.path.lexists(path) and not _plain_file(path):
            sub.needs_review = True
            sub.messages.append(f"held for review: the grader's {path.name} was not a plain file of its own folder")
            return
    if "DeadKernelError" in log or "kernel died" in log.lower():
        sub.messages.append("the Python kernel died while running the notebook (os._exit, a crash, or running out "
                            f"of the {limits.memory_mb} MB memory limit); nbgrader then scores the whole notebook 0: "
                            "find the cell that exits or crashes")
    if limits.sandbox:
        _held(sub, log, autograded)
    if autograded.exists():
        cut = cut_long_outputs(autograded)
        if cut:
            sub.messages.append(f"printed too much: {cut / 1e6:.1f} MB of output cut from the feedback (each output "
                                f"keeps its first {OUTPUT_LIMIT // 1000} kB; the scores are unaffected)")
    try:
        sub.grades, sub.seconds_late, sub.late_penalty = _read_grades_copy(course, autograded, sub.assignment, student,
                                                                            limits.cell_timeout_s)
        sub.graded = True
        if sub.seconds_late > 0:
            sub.messages.append(f"late: submitted {format_lateness(sub.seconds_late)} after the due date"
                                + (f"; penalty {sub.late_penalty:g} points" if sub.late_penalty else ""))
    except Exception:  # no gradebook entry: autograde never got to record this submission
        sub.messages.append("nbgrader could not grade this notebook; its log: "
                            + " | ".join(line for line in log.splitlines()[-5:] if line.strip())[:400])
    if not (sub.graded and autograded.exists()):
        return
    try:  # the grades stand whatever happens to the feedback
        hide_check_frames(autograded)
        kept = out / "autograded" / student / sub.assignment / f"{sub.assignment}.ipynb"  # for the course's gradebook
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(autograded, kept, follow_symlinks=False)
        feedback = [sys.executable, "-m", "nbgrader", "generate_feedback", sub.assignment, f"--student={student}",
                    "--force", f"--CourseDirectory.root={course}"]
        subprocess.run(contained(feedback), cwd=course, env=env, capture_output=True, timeout=300, process_group=0)
        if tree is not None:
            tree.kill()
        html = course / "feedback" / student / sub.assignment / f"{sub.assignment}.html"
        if _plain_file(html):
            publish_feedback(html, out / "feedback" / sub.student / f"{sub.assignment}.html", sub.grades)
    except Exception as err:
        sub.messages.append(f"no feedback written: {type(err).__name__}: {cap(str(err), 300)}")


def _plain_file(path: Path) -> bool:
    """A regular file reached through no link (what a grader's folder holds is read by root only so)."""
    return path.is_file() and os.path.realpath(path) == os.path.abspath(path)


def _read_grades_copy(course: Path, autograded: Path, slug: str, student: str,
                      cell_timeout_s: float) -> tuple[list[CellGrade], float, float]:
    """read_grades on copies of the gradebook and the autograded notebook in a folder of this process's own; with
    the seconds the submission was late and nbgrader's late penalty."""
    with tempfile.TemporaryDirectory(prefix="gradebook-") as tmp:
        copy = Path(tmp)
        shutil.copyfile(course / "gradebook.db", copy / "gradebook.db", follow_symlinks=False)
        if autograded.exists():
            target = copy / "autograded" / student / slug / f"{slug}.ipynb"
            target.parent.mkdir(parents=True)
            shutil.copyfile(autograded, target, follow_symlinks=False)
        return read_grades(copy, slug, student, cell_timeout_s), *lateness(copy, slug, student)


#: Tasks (processes and threads) in one submission's tree: its grader's, its kernel's and what the kernel starts.
TREE_PROCESSES = 512
LOG_LIMIT = 4 * 2**20  # characters of the grader's log read back

#: Run by root before a grader's box: join the submission's cgroup (the box and all it starts inherit it), no cores.
_JOIN = """
import json, os, resource, sys
for path in json.loads(sys.argv[1]):
    with open(path, "w") as f:
        f.write(str(os.getpid()))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.argv[2], sys.argv[2:])
"""


def _watch(proc: subprocess.Popen, tree: boxes.Tree | None, limits: Limits) -> str:
    """Wait for the grader; stop the submission's whole tree when it passes the wall-clock limit or, summed over
    every process it started, the CPU limit. Returns why it was stopped, or ''."""
    deadline = time.monotonic() + limits.timeout_s
    while True:
        try:
            proc.wait(timeout=0.25)
            return ""
        except subprocess.TimeoutExpired:
            pass
        why = ""
        if time.monotonic() > deadline:
            why = (f"stopped after {limits.timeout_s:g} s: the notebook ran past the time limit for a whole notebook "
                   "(look for a loop that never ends)")
        elif tree is not None and tree.cpu_seconds() > limits.timeout_s:
            why = (f"stopped after {limits.timeout_s:g} s of CPU time, summed over every process the submission "
                   "started (look for processes or threads that keep computing)")
        if why:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the kernel too: it is in the same process group
            if tree is not None:
                tree.kill()
            proc.wait()
            return why


# -- the whole cohort --------------------------------------------------------------------------------------------


def _graded_build(root: Path, released: nbformat.NotebookNode) -> Path:
    """The package as one assignment's sandbox sees it: no checks, no mistakes, its exercises' references withheld."""
    exercises = {node.name for cell in released.cells if cell.get("metadata", {}).get("nbgrader", {}).get("solution")
                 for node in (getattr(parse_cell(cell.source), "body", None) or []) if isinstance(node, ast.FunctionDef)}
    root.mkdir(parents=True)
    return sandbox.graded_build(root, exercises)


def prepare(slugs: list[str], root: Path, course: Path | None = None) -> tuple[Path, dict[str, nbformat.NotebookNode]]:
    """A course per assignment (its gradebook and released notebook), to copy per submission: ``template/<slug>``.
    A grader sees its own assignment's hidden tests only. With the instructor's ``course``, its nbgrader_config.py
    (the late penalty method, say) and its assignments' due dates carry over."""
    template = root / "template"
    release = {}
    for slug in slugs:
        made = make_course(template / slug, [slug])
        if course is not None and (course / "nbgrader_config.py").is_file():
            shutil.copyfile(course / "nbgrader_config.py", made / "nbgrader_config.py")
        release[slug] = nbformat.read(generate(made, slug), as_version=4)
    return template, release


def similar_answers(subs: list[Submission]) -> list[str]:
    """Answers too alike (specdec.course.similarity): each graded submission's code answers against the
    reference and against every other's; both sides of a pair are flagged for review, never penalised."""
    graded = [s for s in subs if s.graded and s.answers]
    slugs = sorted({s.assignment for s in graded})
    references = {slug: similarity.answers(nbformat.read(source_notebook(slug), as_version=4)) for slug in slugs}
    skeletons = {slug: similarity.answers(nbformat.read(NOTEBOOKS_DIR / f"{slug}.ipynb", as_version=4))
                 for slug in slugs}
    matches = similarity.compare({(s.student, s.assignment): s.answers for s in graded}, references, skeletons)
    by_key = {(s.student, s.assignment): s for s in graded}
    for match in matches:
        for student in (match.first, match.second):
            if (student, match.assignment) in by_key:
                by_key[student, match.assignment].similar = True
    return similarity.report_lines(matches)


def summarise(subs: list[Submission]) -> dict:
    """Per assignment: how many were graded, the mean automatic total, and per exercise the mean and the
    distribution of scores."""
    out: dict = {}
    for assignment in sorted({s.assignment for s in subs}):
        mine = [s for s in subs if s.assignment == assignment]
        graded = [s for s in mine if s.graded]
        totals = [sum(g.score for g in s.grades if not g.written) for s in graded]
        exercises: dict[str, list[float]] = {}
        for s in graded:
            for g in s.grades:
                if not g.written:
                    exercises.setdefault(g.grade_id.removesuffix("_test"), []).append(g.score)
        out[assignment] = {
            "submissions": len(mine), "graded": len(graded), "flagged": sum(s.flagged for s in mine),
            "mean_total": round(statistics.mean(totals), 3) if totals else None,
            "max_total": sum(g.max_score for g in graded[0].grades if not g.written) if graded else None,
            "exercises": {name: {"mean": round(statistics.mean(v), 3),
                                 "distribution": {f"{k:g}": v.count(k) for k in sorted(set(v))}}
                          for name, v in exercises.items()},
        }
    return out


def _first_line(text: str) -> str:
    return (text.splitlines() or [""])[0]


def report_summary(subs: list[Submission]) -> list[str]:
    """report.txt's first lines, written for every cohort (a clean one too): how many were graded, held, flagged,
    and each assignment's mean of the automatic points."""
    graded = [s for s in subs if s.graded]
    lines = [f"summary: {len(graded)} of {len(subs)} submissions graded; {sum(s.needs_review for s in subs)} held for "
             f"review; {sum(s.flagged for s in subs)} flagged; {len(subs) - len(graded)} not graded"
             + (f"; {sum(s.similar for s in subs)} with answers too alike (see similarity:)" if any(s.similar for s in subs)
                else "")]
    for assignment in sorted({s.assignment for s in graded}):
        rows = [s for s in graded if s.assignment == assignment]
        scores = [sum(g.score for g in s.grades if not g.written) for s in rows]
        most = max(sum(g.max_score for g in s.grades if not g.written) for s in rows)
        lines.append(visible(f"summary: {assignment}: {len(rows)} graded, mean {statistics.mean(scores):.2f} of "
                             f"{most:g} automatic points", LINE_LIMIT))
    return lines


def write_outputs(subs: list[Submission], problems: list[str], out: Path) -> None:
    """The four result files. Every name, message and quoted line in them is the submission's to choose: each is
    written with its control characters escaped and its length capped (specdec.course.inert), and in the CSVs a
    leading spreadsheet formula character neutralised."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "assignment", "exercise", "score", "max_score", "status", "message"])
        for s in subs:
            for g in s.grades:
                status = "manual" if g.written else "needs_review" if s.needs_review else "auto"
                writer.writerow([csv_cell(s.student, NAME_LIMIT), csv_cell(s.assignment, NAME_LIMIT),
                                 csv_cell(g.grade_id.removesuffix("_test"), NAME_LIMIT), f"{g.score:g}",
                                 f"{g.max_score:g}", status, csv_cell(_first_line(g.message), MESSAGE_LIMIT)])
    with open(out / "totals.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "assignment", "graded", "score", "max_score", "written_points_to_grade",
                         "written_max_score", "timestamp", "seconds_late", "late_penalty", "flagged", "needs_review",
                         "similar", "seconds", "messages"])
        for s in subs:
            auto = [g for g in s.grades if not g.written]
            writer.writerow([csv_cell(s.student, NAME_LIMIT), csv_cell(s.assignment, NAME_LIMIT), s.graded,
                             f"{sum(g.score for g in auto):g}", f"{sum(g.max_score for g in auto):g}",
                             f"{sum(g.max_score for g in s.grades if g.written and g.needs_manual_grade):g}",
                             f"{sum(g.max_score for g in s.grades if g.written):g}", csv_cell(s.timestamp),
                             f"{s.seconds_late:.0f}", f"{s.late_penalty:g}", s.flagged, s.needs_review, s.similar,
                             f"{s.seconds:.1f}", csv_cell(" | ".join(s.messages), MESSAGES_LIMIT)])
    (out / "summary.json").write_text(json.dumps(summarise(subs), indent=1))
    lines = report_summary(subs) + [visible(p, LINE_LIMIT) for p in problems]
    lines += [visible(f"{s.student}/{s.assignment}: {m}", LINE_LIMIT) for s in subs for m in s.messages]
    (out / "report.txt").write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")


# -- shards: one cohort over several machines --------------------------------------------------------------------


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 0 <= K < N (Kubernetes' JOB_COMPLETION_INDEX and Slurm's array index start at 0)."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected K/N, e.g. 0/4") from None
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: need 0 <= K < N")
    return k, n


def shard_of(student: str, shards: int) -> int:
    """The shard that grades ``student``: a hash of the name, the same on every machine and Python."""
    return zlib.crc32(student.encode("utf-8", "surrogateescape")) % shards  # a name that is not UTF-8: its bytes


def _problem_student(problem: str) -> str:
    """The student a find_submissions problem is about ("student/assignment: ..."), or "" for the whole run."""
    head = problem.split(":", 1)[0]
    return head.split("/", 1)[0] if "/" in head else ""


def _submission_record(sub: Submission) -> dict:
    return {"student": sub.student, "assignment": sub.assignment, "path": str(sub.path),
            "grades": [dataclasses.asdict(g) for g in sub.grades], "messages": sub.messages,
            "flagged": sub.flagged, "graded": sub.graded, "seconds": sub.seconds, "needs_review": sub.needs_review,
            "timestamp": sub.timestamp, "seconds_late": sub.seconds_late, "late_penalty": sub.late_penalty,
            "answers": sub.answers, "fingerprint": sub.fingerprint}


def _submission_from(record: dict) -> Submission:
    return Submission(record["student"], record["assignment"], Path(record["path"]),
                      [CellGrade(**g) for g in record["grades"]], record["messages"], record["flagged"],
                      record.get("needs_review", False), record["graded"], record["seconds"],
                      timestamp=record.get("timestamp", ""), seconds_late=record.get("seconds_late", 0.0),
                      late_penalty=record.get("late_penalty", 0.0), answers=record.get("answers", {}),
                      fingerprint=record.get("fingerprint", ""))


RESULTS_FILE = "submissions.json"  # every run's submissions with their fingerprints, for the next run's --changed


@functools.cache
def _package_digest() -> bytes:
    """The package's code (checks, lessons, grading): a change anywhere in it regrades everything."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "solutions" / "specdec").rglob("*.py")):
        digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.digest()


def fingerprint(sub: Submission, course: Path | None) -> str:
    """What a submission's grade depends on: its notebook's bytes, its submission time, its assignment's instructor
    notebook (tests and points), the package's code and the due date with the student's extension. "" when the
    notebook is not a plain file of at most NOTEBOOK_LIMIT bytes (never kept: it is graded, and refused, again)."""
    try:
        info = os.lstat(sub.path)
    except OSError:
        return ""
    if sub.refused or not stat.S_ISREG(info.st_mode) or info.st_size > NOTEBOOK_LIMIT:
        return ""
    digest = hashlib.sha256(_package_digest())
    for part in (sub.path.read_bytes(), sub.timestamp.encode(), source_notebook(sub.assignment).read_bytes(),
                 str(due_date(course, sub.assignment, grader_id(sub.student)) if course else "").encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def keep_unchanged(subs: list[Submission], out: Path) -> tuple[list[Submission], list[Submission]]:
    """(to grade, kept): a submission whose fingerprint equals the one of the last run into ``out`` keeps that run's
    result (its feedback and autograded notebook are in ``out`` already)."""
    try:
        previous = {(r["student"], r["assignment"]): r for r in json.loads((out / RESULTS_FILE).read_text())}
    except (OSError, ValueError, KeyError, TypeError):
        return subs, []
    to_grade, kept = [], []
    for sub in subs:
        before = previous.get((sub.student, sub.assignment))
        if sub.fingerprint and before and before.get("fingerprint") == sub.fingerprint:
            kept.append(_submission_from(before))
        else:
            to_grade.append(sub)
    return to_grade, kept


def write_shard(subs: list[Submission], problems: list[str], shard: tuple[int, int], out: Path) -> None:
    """``shard.json``: what merge needs to rebuild the one-machine outputs."""
    (out / "shard.json").write_text(json.dumps({"shard": list(shard), "problems": problems,
                                                "submissions": [_submission_record(s) for s in subs]}, indent=1))


def clear_shard(out: Path) -> None:
    """Remove what an earlier run of this shard wrote to ``out``, shard.json first: a rerun stopped half-way (a
    cancelled task) then leaves a shard that merge refuses, never the earlier results beside part of the new ones."""
    for name in ("shard.json", "grades.csv", "totals.csv", "summary.json", "report.txt"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "feedback", ignore_errors=True)
    shutil.rmtree(out / "autograded", ignore_errors=True)


def merge(shard_dirs: list[Path], out: Path) -> tuple[list[Submission], list[str]]:
    """Combine shard results into ``out``: grades.csv, totals.csv, summary.json and report.txt as one machine
    would write them (submissions in student order), and every shard's feedback. Refuses missing, duplicated
    or inconsistent shards, naming them."""
    records, seen = [], {}
    for folder in shard_dirs:
        path = folder / "shard.json"
        if not path.exists():
            raise ValueError(f"{folder}: no shard.json (was it graded with --shard K/N, and did it finish?)")
        record = json.loads(path.read_text())
        k, n = record["shard"]
        if (k, n) in seen:
            raise ValueError(f"shard {k}/{n} given twice: {seen[(k, n)]} and {folder}")
        seen[(k, n)] = folder
        records.append((folder, record))
    counts = {n for _, n in seen}
    if len(counts) != 1:
        raise ValueError(f"the shards were cut differently (N = {sorted(counts)}): {sorted(seen)}")
    (n,) = counts
    missing = sorted(set(range(n)) - {k for k, _ in seen})
    if missing:
        raise ValueError(f"missing shard(s) {', '.join(f'{k}/{n}' for k in missing)} of {n}")
    subs = sorted((_submission_from(s) for _, r in records for s in r["submissions"]),
                  key=lambda s: (s.student, s.assignment))
    per_student = [p for _, r in records for p in r["problems"] if _problem_student(p)]
    whole_run = [p for _, r in records for p in r["problems"] if not _problem_student(p)]
    problems = sorted(per_student, key=_problem_student) + list(dict.fromkeys(whole_run))
    out.mkdir(parents=True, exist_ok=True)
    for folder, _ in records:
        for kept in ("feedback", "autograded"):
            if (folder / kept).is_dir():
                shutil.copytree(folder / kept, out / kept, dirs_exist_ok=True)
    problems += similar_answers(subs)
    write_outputs(subs, problems, out)
    return subs, problems


def merge_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.course.cohort merge",
                                     description="Combine the results of cohort shards (--shard K/N) into one set.")
    parser.add_argument("shards", type=Path, nargs="+", help="the --out folders of every shard")
    parser.add_argument("--out", type=Path, default=Path("cohort-grades"), help="where the merged results go")
    parser.add_argument("--course", type=Path, help="the instructor's nbgrader course: record the results in its "
                                                   "gradebook for formgrader")
    args = parser.parse_args(argv)
    try:
        subs, problems = merge(args.shards, args.out)
    except ValueError as err:
        print(f"cohort merge: {err}", file=sys.stderr)
        return 2
    if args.course:
        for note in record(args.course, subs, args.out / "autograded"):
            print(visible(note, LINE_LIMIT))
    print(f"merged {len(args.shards)} shards: {len(subs)} submissions, {sum(s.graded for s in subs)} graded; "
          f"results in {args.out}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    parser = argparse.ArgumentParser(description="Autograde a cohort's submissions in parallel.",
                                     epilog="Merge shards: python -m specdec.course.cohort merge SHARD_DIR ... --out DIR")
    parser.add_argument("submitted", type=Path, help="folder of <student>/<assignment>/<notebook>.ipynb")
    parser.add_argument("--out", type=Path, default=Path("cohort-grades"), help="where results go (default: cohort-grades/)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="submissions graded at once")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for a whole notebook (default 600)")
    parser.add_argument("--cell-timeout", type=float, default=120, help="seconds for one cell (default 120)")
    parser.add_argument("--memory-mb", type=int, default=8192, help="address-space limit per grading process and its "
                                                                   "kernel, in MB (default 8192)")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="grade without the sandbox, also where it can start (only for submissions you trust: their "
                             "code then runs with the grader's rights and can change its own score)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors (the results are in --out)")
    parser.add_argument("--assignment", action="append", default=[], metavar="SLUG",
                        help="grade only this assignment (repeatable)")
    parser.add_argument("--student", action="append", default=[], metavar="NAME",
                        help="grade only this student's submissions (repeatable; a regrade of one student)")
    parser.add_argument("--course", type=Path, metavar="DIR",
                        help="the instructor's nbgrader course (grader/, or the hub's course folder): due dates, "
                             "extensions and the late penalty come from it, and the results go into its gradebook "
                             "and autograded/ for formgrader")
    parser.add_argument("--changed", action="store_true",
                        help="regrade only what changed since the last run into --out: a submission whose notebook, "
                             "submission time, instructor notebook, due date and the package's code are the same keeps "
                             "its result")
    parser.add_argument("--shard", type=parse_shard, metavar="K/N",
                        help="grade only shard K of N (students split by a hash of their name; 0 <= K < N) and "
                             "write shard.json for merge")
    args = parser.parse_args(argv)
    say = (lambda *a, **k: None) if args.quiet else print
    if not args.submitted.is_dir():
        print(f"cohort: {args.submitted} is not a folder", file=sys.stderr)
        return 2
    if args.workers < 1 or args.timeout <= 0 or args.cell_timeout <= 0 or args.memory_mb < 512:
        parser.error("--workers >= 1, --timeout > 0, --cell-timeout > 0 and --memory-mb >= 512, please")
    if args.course and not (args.course / "gradebook.db").is_file():
        print(f"cohort: --course {args.course}: no gradebook.db there (release the assignments in it first: "
              "nbgrader generate_assignment SLUG)", file=sys.stderr)
        return 2
    subs, problems = find_submissions(args.submitted, assignments())
    if args.assignment or args.student:
        subs = [s for s in subs if (not args.assignment or s.assignment in args.assignment)
                and (not args.student or s.student in args.student)]
        problems = [p for p in problems if not args.student or _problem_student(p) in args.student]
    for index, sub in enumerate(subs):
        sub.index = index
    if args.shard:
        clear_shard(args.out)
        k, n = args.shard
        subs = [s for s in subs if shard_of(s.student, n) == k]
        problems = [p for p in problems if shard_of(_problem_student(p), n) == k]
        if not subs:  # a small cohort can leave a shard empty: still a valid shard for merge
            args.out.mkdir(parents=True, exist_ok=True)
            write_outputs([], problems, args.out)
            write_shard([], problems, args.shard, args.out)
            say(f"shard {k}/{n}: no submissions")
            return 0
    if not subs:
        print(f"cohort: no submissions under {args.submitted} (expected <student>/<assignment>/<notebook>.ipynb)",
              file=sys.stderr)
        return 2
    for sub in subs:
        sub.fingerprint = fingerprint(sub, args.course)
    kept: list[Submission] = []
    if args.changed:
        subs, kept = keep_unchanged(subs, args.out)
        say(f"{len(kept)} submission{'' if len(kept) == 1 else 's'} unchanged since the last run into {args.out}/: "
            "results kept")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specdec-cohort-") as tmp:
        scratch_root = Path(tmp)
        template, release = prepare(sorted({s.assignment for s in subs}), scratch_root, args.course)
        say(f"grading {len(subs)} submissions with {args.workers} workers", flush=True)
        why_not = "asked for" if args.unsafe_no_sandbox else boxes.missing()
        if why_not and not args.unsafe_no_sandbox:
            print(f"cohort: cannot grade untrusted submissions: {why_not}. The sandbox needs Linux, root, bubblewrap, "
                  "util-linux, libseccomp with PyPI's pyseccomp (make setup), and cgroups; for submissions you trust, "
                  "pass --unsafe-no-sandbox", file=sys.stderr)
            return 2
        limits = Limits(args.timeout, args.cell_timeout, args.memory_mb, can_isolate(), sandbox=why_not is None,
                        salt=secrets.token_hex(16), course=args.course.resolve() if args.course else None)
        if why_not:
            problems.append(f"sandbox: off ({why_not}; --unsafe-no-sandbox): submissions ran with the grader's rights")
        builds = {slug: _graded_build(scratch_root / f"build-{slug}", release[slug]) for slug in release} \
            if limits.sandbox else {}
        if not limits.isolate:
            problems.append("isolation: off (it needs root and util-linux's unshare on Linux): a submission's code "
                            "could write to the course's files or another submission's scratch folder")
        args.out.mkdir(parents=True, exist_ok=True)
        protect = [REPO_ROOT, args.submitted.resolve(), args.out.resolve(), scratch_root]
        with ThreadPoolExecutor(args.workers) as pool:
            distinctive = course_ids()
            jobs = [pool.submit(grade_one, s, template, release, args.out, limits, protect, scratch_root, distinctive,
                                builds) for s in subs]
            for done, job in enumerate(jobs, 1):
                s = job.result()
                total = sum(g.score for g in s.grades if not g.written)
                status = f"{total:g} / {sum(g.max_score for g in s.grades if not g.written):g}" if s.graded else "not graded"
                marks = (" (flagged)" if s.flagged else "") + (" (held)" if s.needs_review else "")
                first = f"; {s.messages[0].removeprefix('not graded: ')}" if s.messages else ""
                say(visible(f"[{done}/{len(subs)}] {s.student}/{s.assignment}: {status}{marks}{first}", LINE_LIMIT),
                    flush=True)
    graded_now = len(subs)
    subs = sorted(subs + kept, key=lambda s: (s.student, s.assignment))
    if not args.shard:  # shards: merge compares and records the whole cohort at once
        problems += similar_answers(subs)
        if args.course:
            problems += record(args.course, subs, args.out / "autograded")
    write_outputs(subs, problems, args.out)
    (args.out / RESULTS_FILE).write_text(json.dumps([_submission_record(s) for s in subs]))
    if args.shard:
        write_shard(subs, problems, args.shard, args.out)
    wall = time.perf_counter() - start
    say(f"graded {graded_now} submissions in {wall:.0f} s ({wall / max(graded_now, 1):.1f} s per notebook)"
        + (f", kept {len(kept)} unchanged" if kept else "") + f"; {sum(s.graded for s in subs)} of {len(subs)} graded; "
        f"results in {args.out}/")
    for p in problems:  # what could not be used, and the run's notes (similarity, the gradebook, the sandbox)
        noted = p.startswith(("similarity:", "gradebook:", "sandbox:", "isolation:"))
        say(visible(p if noted else f"skipped {p}", LINE_LIMIT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
