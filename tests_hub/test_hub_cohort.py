"""The instructor's whole workflow on a real JupyterHub (hub.py), with cohort grading in the sandbox: notebook 14
(two written answers) released through nbgrader's exchange; three students fetch it from their own servers and
submit it (correct and blank on time; partial, with one written answer and its notebook renamed, after the due
date); the instructor collects, grades the cohort into the course's gradebook, grades a written answer through
formgrader's API with the rubric beside it, renders the feedback and releases it; each student fetches theirs.
Scores, lateness and written points as expected, and nothing left running. Run as root by `make test-hub`."""

from __future__ import annotations

import csv
import datetime
import json
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub import Hub, running_hub

from specdec.course import boxes
from specdec.paths import REPO_ROOT

SLUG = "14_frontier"
COURSE_ID = "speculative-decoding"
NOTEBOOK = f"{SLUG}/{SLUG}.ipynb"
RENAMED = f"{SLUG}/{SLUG}-Copy1.ipynb"
WRITTEN = "written_moe_long_context"
STUDENTS = ["correct", "blank", "partial"]


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="specdec-hub-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def course(tmp_path: Path) -> Path:
    path = tmp_path / "course"
    shutil.copytree(REPO_ROOT / "grader" / "source" / SLUG, path / "source" / SLUG)
    shutil.copy2(REPO_ROOT / "grader" / "nbgrader_config.py", path)
    with open(path / "nbgrader_config.py", "a") as f:
        f.write("\nc.LateSubmissionPlugin.penalty_method = 'zero'  # a late submission scores 0 (nbgrader's)\n")
    return path


def _cells(nb: dict) -> dict[str, dict]:
    return {c["metadata"]["nbgrader"]["grade_id"]: c for c in nb["cells"] if "grade_id" in c["metadata"].get("nbgrader", {})}


def _answered(released: bytes, solved: str) -> bytes:
    """The released notebook with every code answer typed in from the instructor's (``solved="all"``), or the first
    one and the first written answer (``"some"``)."""
    nb = json.loads(released)
    source = _cells(json.loads((REPO_ROOT / "grader" / "source" / SLUG / f"{SLUG}.ipynb").read_text()))
    answers = [gid for gid, c in _cells(nb).items() if c["metadata"]["nbgrader"].get("solution") and c["cell_type"] == "code"]
    for gid in answers if solved == "all" else answers[:1]:
        lines = source[gid]["source"]
        _cells(nb)[gid]["source"] = [line for line in lines if "SOLUTION" not in line]
    written = [gid for gid, c in _cells(nb).items() if c["metadata"]["nbgrader"].get("solution") and c["cell_type"] == "markdown"]
    for gid in written if solved == "all" else []:
        _cells(nb)[gid]["source"] = source[gid]["source"]
    if solved == "some":
        _cells(nb)[WRITTEN]["source"] = "The experts the gamma + 1 tokens touch are a union that grows with gamma."
    return json.dumps(nb, indent=1).encode()


def _grade_cohort(hub: Hub, out: Path) -> None:
    unsafe = [] if boxes.missing() is None else ["--unsafe-no-sandbox"]
    proc = subprocess.run([sys.executable, "-m", "specdec.course.cohort", str(hub.course_dir / "submitted"), "--course",
                           str(hub.course_dir), "--out", str(out), "--workers", "2", "--quiet", *unsafe],
                          capture_output=True, text=True, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_release_submit_grade_written_feedback_on_a_hub(root: Path, course: Path, tmp_path: Path) -> None:
    with running_hub(root, COURSE_ID, course, "teacher", STUDENTS) as hub:
        account = hub.accounts
        for user in ["teacher", *STUDENTS]:
            hub.spawn(user)
        hub.nbgrader("generate_assignment", SLUG)
        hub.nbgrader("release_assignment", SLUG)
        for user in ["teacher", *STUDENTS]:
            hub.wait_ready(user)

        for user in STUDENTS:
            hub.fetch(user, SLUG)
        released = hub.get_file("correct", NOTEBOOK)
        hub.put_file("correct", NOTEBOOK, _answered(released, "all"))
        for user in ("correct", "blank"):
            hub.submit(user, SLUG)
        due = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) + datetime.timedelta(seconds=2)
        hub.nbgrader("db", "assignment", "add", SLUG, f"--duedate={due:%Y-%m-%d %H:%M:%S} UTC")  # between them
        time.sleep(max(0.0, (due - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) + 1)
        hub.put_file("partial", RENAMED, _answered(released, "some"))
        hub.api("partial", "DELETE", f"api/contents/{NOTEBOOK}")
        hub.submit("partial", SLUG)

        hub.nbgrader("collect", SLUG)
        out = tmp_path / "cohort"
        _grade_cohort(hub, out)
        totals = {r["student"]: r for r in csv.DictReader(open(out / "totals.csv"))}
        assert {u: (totals[account[u]]["score"], totals[account[u]]["written_points_to_grade"],
                    totals[account[u]]["late_penalty"]) for u in STUDENTS} == {
            "correct": ("26", "2", "0"), "blank": ("0", "0", "0"), "partial": ("1", "1", "1")}
        assert float(totals[account["partial"]]["seconds_late"]) > 0
        assert float(totals[account["correct"]]["seconds_late"]) == 0
        assert "renamed: the folder's one notebook, 14_frontier-Copy1.ipynb" in totals[account["partial"]]["messages"]

        # formgrader reads the one gradebook: every submission, its automatic score, written answers to grade
        listed = {s["student"]: s for s in hub.formgrader("GET", f"submissions/{SLUG}")}
        assert {u: (listed[account[u]]["score"], listed[account[u]]["needs_manual_grade"]) for u in STUDENTS} == {
            "correct": (26, True), "blank": (0, False), "partial": (1, True)}
        (notebook,) = [n for n in hub.formgrader("GET", f"submitted_notebooks/{SLUG}/{SLUG}")
                       if n["student"] == account["correct"]]
        grade = next(g for g in hub.formgrader("GET", f"grades?submission_id={notebook['id']}") if g["name"] == WRITTEN)
        assert (grade["auto_score"], grade["needs_manual_grade"]) == (None, True)
        assert hub.formgrader("PUT", f"grade/{grade['id']}", {"manual_score": 1})["manual_score"] == 1
        page = hub.api("teacher", "GET", f"formgrader/submissions/{notebook['id']}/").text  # the grading page
        at = page.index(f'id="{WRITTEN}"') if f'id="{WRITTEN}"' in page else page.index(WRITTEN)
        assert "Rubric:" in page[at:] and "Model answer:" in page[at:]

        # feedback with the written score, rendered as the instructor and released through the exchange
        rendered = hub.run_as("teacher", hub.python, "-m", "specdec.course.gradebook", "feedback", SLUG, "--course",
                              str(hub.course_dir), cwd=hub.course_dir)
        assert rendered.returncode == 0, rendered.stdout + rendered.stderr
        hub.nbgrader("release_feedback", SLUG)
        for user, header in (("correct", "(Score: 27 / 27 so far; 1 written point awaiting the instructor)"),
                             ("partial", "(Score: 1 / 27 so far; 1 written point awaiting the instructor)"),
                             ("blank", "(Score: 0.0 / 28.0)")):
            listing = hub.fetch_feedback(user, SLUG)
            (submission,) = [s for a in listing if a["status"] == "submitted" for s in a["submissions"]]
            assert submission["has_local_feedback"], (user, submission)
            folder = submission["local_feedback_path"]
            names = [n["name"] for n in json.loads(hub.api(user, "GET", f"api/contents/{folder}").text)["content"]]
            got = hub.get_file(user, f"{folder}/{names[0]}").decode()
            assert header in got, (user, re.findall(r"\(Score: [^)]*\)", got)[:1])
            assert "Rubric:" not in got and "trusted.py" not in got

        totals_csv = hub.run_as("teacher", hub.python, "-m", "specdec.course.gradebook", "totals", SLUG, "--course",
                                str(hub.course_dir), cwd=hub.course_dir).stdout
        rows = {r["student"]: r for r in csv.DictReader(totals_csv.splitlines())}
        assert (rows[account["correct"]]["total"], rows[account["partial"]]["total"]) == ("27", "0")
        assert {r["max_score"] for r in rows.values()} == {"28"}

        left = hub.stop()
        assert not left, left
    for name in hub.accounts.values():
        with pytest.raises(KeyError):
            pwd.getpwnam(name)
