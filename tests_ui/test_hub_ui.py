"""nbgrader on a real JupyterHub (tests_hub/hub.py) as its users see it, in Debian's Chromium: a student logs in on
the hub's login page, lands in JupyterLab, opens the Assignments tab from the Nbgrader menu, fetches notebook 14 and
submits it with a written answer; the instructor collects it and grades the cohort in the sandbox into the course's
gradebook (as tests_hub/test_hub_cohort.py does), logs in, opens the submission in formgrader, sees the written answer
with its model answer and rubric right after it, and scores it there. Nothing is left running.

Root only (the hub makes local accounts). Screenshots in artifacts/ui/: hub_login.png, hub_assignments_released.png,
hub_assignments_fetched.png, hub_submitted.png, formgrader_rubric.png; on a failure hub_failure_<user>.png, with the
end of the hub's logs in the test's output (hub.running_hub prints them)."""

from __future__ import annotations

import json
import os
import pwd
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Error as PlaywrightError, Page, expect
from test_lab import CHROMIUM, SHOTS, browser  # noqa: F401 (a fixture)

from specdec.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests_hub"))  # hub.py and the cohort test's fixtures
from hub import Hub, running_hub  # noqa: E402
from test_hub_cohort import COURSE_ID, NOTEBOOK, SLUG, WRITTEN, _grade_cohort, course, root  # noqa: E402, F401 (fixtures)

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the hub makes local accounts and spawns servers as them: run as root"),
]

STUDENT, INSTRUCTOR = "alice", "teacher"
ANSWER = "Verifying gamma + 1 tokens reads the union of the experts they route to, which grows with gamma."
VIEWPORT = {"width": 1400, "height": 1000}
#: Milliseconds for any one wait in the browser, and for a login that starts the user's server (a busy 2-core machine).
STEP_MS, SPAWN_MS = 60_000, 180_000


def _written(released: bytes) -> bytes:
    """The released notebook with ``ANSWER`` typed into the written answer ``WRITTEN``."""
    nb = json.loads(released)
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == WRITTEN)
    cell["source"] = ANSWER
    return json.dumps(nb, indent=1).encode()


def _never_ask_for_news(hub: Hub, user: str) -> None:
    """Set ``user``'s JupyterLab never to fetch news, so it does not ask in a toast over the page (the host is
    offline); as the user, before their server reads its settings."""
    home = Path(pwd.getpwnam(hub.accounts[user]).pw_dir)
    settings = home / ".jupyter/lab/user-settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    write = "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True); p.write_text(sys.argv[2])"
    hub.run_as(user, hub.python, "-c", write, settings, json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def _log_in(chromium: Browser, hub: Hub, user: str, shot: str | None = None) -> Page:
    """A fresh browser session of ``user``, logged in on the hub's login page (screenshot ``shot`` before sending it)
    and landed in their JupyterLab, which the hub starts if it is not running."""
    page = chromium.new_context(viewport=VIEWPORT).new_page()
    page.set_default_timeout(STEP_MS)
    page.goto(f"{hub.url}/hub/login")
    page.locator("#username_input").fill(hub.accounts[user])
    page.locator("#password_input").fill(hub.passwords[user])
    if shot:
        page.screenshot(path=SHOTS / shot)
    page.locator("#login_submit").click()
    page.wait_for_url(re.compile(rf"/user/{hub.accounts[user]}/lab"), timeout=SPAWN_MS)
    return page


@contextmanager
def _screenshots_on_failure(pages: dict[str, Page]) -> Iterator[None]:
    """On a failure inside, a screenshot of each user's page as it was: artifacts/ui/hub_failure_<user>.png."""
    try:
        yield
    except BaseException:
        for user, page in pages.items():
            with suppress(PlaywrightError):
                page.screenshot(path=SHOTS / f"hub_failure_{user}.png", timeout=10_000)
        raise


def _submit_in_lab(page: Page, hub: Hub) -> None:
    """In the student's JupyterLab: the Assignments tab, Fetch, the written answer saved, Submit."""
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=SPAWN_MS)
    page.get_by_role("menuitem", name="Nbgrader", exact=True).click()
    page.get_by_role("menuitem", name="Assignment List", exact=True).click()
    released = page.locator("#released_assignments_list > .list_item", has_text=SLUG)
    expect(released).to_be_visible()
    page.screenshot(path=SHOTS / "hub_assignments_released.png")

    released.get_by_role("button", name="Fetch", exact=True).click()
    fetched = page.locator("#fetched_assignments_list > .list_item", has_text=SLUG)
    expect(fetched).to_be_visible()
    expect(page.locator("#released_assignments_list > .list_item")).to_have_count(0)
    fetched.locator(".assignment-notebooks-link").click()  # unfold the assignment's notebooks
    expect(fetched.locator(".collapse.in", has_text=SLUG)).to_be_visible()
    page.screenshot(path=SHOTS / "hub_assignments_fetched.png")

    hub.put_file(STUDENT, NOTEBOOK, _written(hub.get_file(STUDENT, NOTEBOOK)))  # as the editor would save it
    fetched.get_by_role("button", name="Submit", exact=True).click()
    expect(page.locator("#submitted_assignments_list > .list_item", has_text=SLUG)).to_be_visible()
    page.screenshot(path=SHOTS / "hub_submitted.png")


def _grade_in_formgrader(page: Page, hub: Hub, submission_id: str) -> dict:
    """In the instructor's browser: formgrader's list of the notebook's submissions, then the submission; checks that
    the written answer shows with the model answer and rubric right after it, and scores it 1 (full credit).
    Returns the grade formgrader's save answered with."""
    page.goto(f"{hub.url}/user/{hub.accounts[INSTRUCTOR]}/formgrader/gradebook/{SLUG}/{SLUG}")
    page.locator(f"a.name-hidden[href$='/formgrader/submissions/{submission_id}']").click()
    page.wait_for_url(re.compile(rf"/formgrader/submissions/{submission_id}/?$"))

    score = page.locator(f"input.score#{WRITTEN}")
    expect(score).to_have_class(re.compile(r"\bneeds_manual_grade\b"))  # formgrader has loaded its grades
    answer = page.locator("#notebook-container > .cell", has=score)
    rubric = answer.locator("xpath=following-sibling::div[contains(@class, 'cell')][1]")
    expect(answer.get_by_text(ANSWER)).to_be_visible()
    expect(rubric).to_contain_text(re.compile(r"Model answer:.+Rubric:", re.DOTALL))
    answer.evaluate("cell => { cell.scrollIntoView({block: 'start'}); window.scrollBy(0, -110); }")  # below the navbar
    expect(answer.get_by_text(ANSWER)).to_be_in_viewport(ratio=1)
    expect(rubric.get_by_text("Rubric:")).to_be_in_viewport(ratio=1)
    page.screenshot(path=SHOTS / "formgrader_rubric.png")

    with page.expect_response(lambda r: "/formgrader/api/grade/" in r.url and r.request.method == "PUT") as saved:
        score.fill("1")
        score.press("Tab")  # formgrader saves a score when it loses the focus
    assert saved.value.ok, saved.value.status
    return saved.value.json()


def test_student_submits_in_lab_and_instructor_grades_the_written_answer_in_formgrader(
        browser: Browser, root: Path, course: Path, tmp_path: Path) -> None:  # noqa: F811 (the imported fixtures)
    SHOTS.mkdir(parents=True, exist_ok=True)
    pages: dict[str, Page] = {}
    with running_hub(root, COURSE_ID, course, INSTRUCTOR, [STUDENT]) as hub, _screenshots_on_failure(pages):
        for user in (INSTRUCTOR, STUDENT):
            _never_ask_for_news(hub, user)
        hub.spawn(INSTRUCTOR)  # formgrader's API serves the checks; the student's server starts at their login
        hub.nbgrader("generate_assignment", SLUG)
        hub.nbgrader("release_assignment", SLUG)

        pages[STUDENT] = _log_in(browser, hub, STUDENT, shot="hub_login.png")
        _submit_in_lab(pages[STUDENT], hub)
        (listed,) = [a for a in hub.list_assignments(STUDENT) if a["status"] == "submitted"]
        assert (listed["assignment_id"], len(listed["submissions"])) == (SLUG, 1), listed

        hub.nbgrader("collect", SLUG)
        _grade_cohort(hub, tmp_path / "cohort")
        hub.wait_ready(INSTRUCTOR)
        (notebook,) = hub.formgrader("GET", f"submitted_notebooks/{SLUG}/{SLUG}")
        assert notebook["student"] == hub.accounts[STUDENT], notebook

        pages[INSTRUCTOR] = _log_in(browser, hub, INSTRUCTOR)
        saved = _grade_in_formgrader(pages[INSTRUCTOR], hub, notebook["id"])
        (grade,) = [g for g in hub.formgrader("GET", f"grades?submission_id={notebook['id']}") if g["name"] == WRITTEN]
        assert (grade["id"], grade["manual_score"], grade["needs_manual_grade"]) == (saved["id"], 1, False), grade

        for page in pages.values():
            page.context.close()
        left = hub.stop()
        assert left == [], left
