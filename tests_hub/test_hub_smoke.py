"""nbgrader's whole exchange on a real JupyterHub (hub.py): the instructor generates and releases notebook 01, two
students list, fetch and submit it from their own single-user servers through the REST API JupyterLab's Assignments
tab calls (one after editing the notebook through the contents API), the instructor collects, autogrades and sets a
manual score through formgrader's API, releases feedback, and the students fetch it the same way. Nothing the hub
started is left running, and the accounts are gone. Run as root by `make test-hub`."""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub import Hub, running_hub

from specdec.paths import REPO_ROOT

SLUG = "01_cost_ledger"
COURSE_ID = "speculative-decoding"  # grader/nbgrader_config.py's: the instructor's commands read it in the course folder
NOTEBOOK = f"{SLUG}/{SLUG}.ipynb"
ANSWERED = "count_params"  # the solution cell alice answers; its test cell is worth 2 points
STUDENTS = ["alice", "bob"]


@pytest.fixture
def root() -> Iterator[Path]:
    """A folder every account can traverse to (pytest's tmp_path is under a folder only root may enter)."""
    path = Path(tempfile.mkdtemp(prefix="specdec-hub-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def course(tmp_path: Path) -> Path:
    """A copy of grader/ with notebook 01's source only."""
    path = tmp_path / "course"
    shutil.copytree(REPO_ROOT / "grader" / "source" / SLUG, path / "source" / SLUG)
    shutil.copy2(REPO_ROOT / "grader" / "nbgrader_config.py", path)
    return path


def _cell(nb: dict, grade_id: str) -> dict:
    return next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def _answer(released: bytes, source: Path) -> bytes:
    """The released notebook with the instructor's solution in the ``ANSWERED`` cell, as a student would type it."""
    nb = json.loads(released)
    solution = _cell(json.loads(source.read_text()), ANSWERED)["source"]
    _cell(nb, ANSWERED)["source"] = [line for line in solution if "SOLUTION" not in line]
    return json.dumps(nb, indent=1).encode()


def _submission(hub: Hub, user: str) -> dict:
    """``user``'s submission of SLUG as formgrader's gradebook has it."""
    return hub.formgrader("GET", f"submission/{SLUG}/{hub.accounts[user]}")


def test_exchange_round_trip(root: Path, course: Path) -> None:
    with running_hub(root, COURSE_ID, course, "teacher", STUDENTS) as hub:
        for user in ["teacher", *STUDENTS]:
            hub.login(user)  # the password works on the login form too
            hub.spawn(user)
        hub.nbgrader("generate_assignment", SLUG)
        hub.nbgrader("release_assignment", SLUG)
        for user in ["teacher", *STUDENTS]:
            hub.wait_ready(user)

        for user in STUDENTS:
            (listed,) = hub.list_assignments(user)
            assert (listed["assignment_id"], listed["status"]) == (SLUG, "released")
            hub.fetch(user, SLUG)
        released = hub.get_file("alice", NOTEBOOK)
        assert "NotImplementedError" in "".join(_cell(json.loads(released), ANSWERED)["source"])
        hub.put_file("alice", NOTEBOOK, _answer(released, course / "source" / SLUG / f"{SLUG}.ipynb"))
        for user in STUDENTS:
            listing = hub.submit(user, SLUG)
            assert [a["status"] for a in listing if a["assignment_id"] == SLUG] == ["fetched", "submitted"], listing

        hub.nbgrader("collect", SLUG)
        submitted = {user: hub.course_dir / "submitted" / hub.accounts[user] / SLUG for user in STUDENTS}
        for user, folder in submitted.items():
            assert (folder / "timestamp.txt").read_text().strip()
            answer = "".join(_cell(json.loads((folder / f"{SLUG}.ipynb").read_text()), ANSWERED)["source"])
            assert ("NotImplementedError" in answer) == (user == "bob"), answer

        assert [a["name"] for a in hub.formgrader("GET", "assignments")] == [SLUG]
        for user in STUDENTS:
            hub.formgrader("POST", f"submission/{SLUG}/{hub.accounts[user]}/autograde")
        assert {user: _submission(hub, user)["score"] for user in STUDENTS} == {"alice": 2, "bob": 0}
        (notebook,) = [n for n in hub.formgrader("GET", f"submitted_notebooks/{SLUG}/{SLUG}")
                       if n["student"] == hub.accounts["bob"]]
        grade = next(g for g in hub.formgrader("GET", f"grades?submission_id={notebook['id']}")
                     if g["name"] == f"{ANSWERED}_test")
        assert (grade["auto_score"], grade["max_score"]) == (0, 2), grade
        assert hub.formgrader("PUT", f"grade/{grade['id']}", {"manual_score": 1.5})["manual_score"] == 1.5
        assert _submission(hub, "bob")["score"] == 1.5

        html = {user: f"<html><body>feedback for {user}</body></html>".encode() for user in STUDENTS}
        for user, folder in submitted.items():
            feedback = hub.course_dir / "feedback" / hub.accounts[user] / SLUG
            feedback.mkdir(parents=True)
            for name in ("timestamp.txt", "submission_secret.txt"):  # what generate_feedback would copy
                shutil.copy2(folder / name, feedback / name)
            (feedback / f"{SLUG}.html").write_bytes(html[user])
        subprocess.run(["chown", "-R", f"{hub.accounts['teacher']}:", hub.course_dir / "feedback"], check=True)
        hub.nbgrader("release_feedback", SLUG)
        for user in STUDENTS:
            listing = hub.fetch_feedback(user, SLUG)
            (submission,) = [s for a in listing if a["status"] == "submitted" for s in a["submissions"]]
            assert submission["has_local_feedback"], submission
            path = f"{submission['local_feedback_path']}/{SLUG}.html"
            assert hub.get_file(user, path) == html[user]

        left = hub.stop()
        assert not left, left
    for name in hub.accounts.values():
        with pytest.raises(KeyError):
            pwd.getpwnam(name)
