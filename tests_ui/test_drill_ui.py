"""The drill widget in a real browser: JupyterLab (as in test_lab.py) runs a scratch notebook whose one cell is
``from specdec.drill import drill_widget; drill_widget(seed=3)``; the test answers the first question right and the
second wrong, and checks the feedback and the explanation. Screenshots: artifacts/ui/drill_right.png and
artifacts/ui/drill_wrong.png. The right answers come from the package: the same seed draws the same questions."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from test_lab import CHROMIUM, SHOTS, TOKEN, _errors, _free_port, _run_all, browser  # noqa: F401 (a fixture)

from specdec.drill.questions import LETTERS, ChoiceQuestion, Question
from specdec.drill.session import draw_questions

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")

CELL = "from specdec.drill import drill_widget; drill_widget(seed=3)"


@pytest.fixture(scope="module")
def drill_lab(tmp_path_factory):
    """JupyterLab on a free loopback port serving one scratch notebook with the drill cell."""
    root = tmp_path_factory.mktemp("drill")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, root / "drill.ipynb")
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "IPYTHONDIR": str(home / "ipython")}
    port = _free_port()
    cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", f"--ServerApp.root_dir={root}",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", f"--IdentityProvider.token={TOKEN}", "--no-browser",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(home / "lab.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        server.kill()
        pytest.fail("JupyterLab did not start:\n" + (home / "lab.log").read_text()[-2000:])
    yield base
    server.terminate()
    server.wait(timeout=30)


def _answer(page, question: Question, right: bool) -> None:
    """Give the question's right answer, or a wrong one, and press Check."""
    if isinstance(question, ChoiceQuestion):
        letter = question.answer if right else next(x for x in LETTERS if x != question.answer)
        # by its text: the radio group may render an (empty) description label before its options
        page.locator(".specdec-drill-answer label", has_text=re.compile(rf"^\s*\({letter}\) ")).click()
    else:
        value = question.answer if right else question.answer * 2 + 1
        page.locator(".specdec-drill-answer input").fill(f"{value:.6g}")
    page.locator(".specdec-drill-check").click()


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_drill_widget_checks_a_right_and_a_wrong_answer(drill_lab, browser):  # noqa: F811 (the imported fixture)
    first, second = draw_questions(3, 5)[:2]
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{drill_lab}/lab/workspaces/drill/tree/drill.ipynb?token={TOKEN}&reset")
    _run_all(page, "drill", timeout_s=180)
    assert _errors(page) == []
    widget = page.locator(".specdec-drill")
    widget.wait_for(timeout=60_000)
    header = page.locator(".specdec-drill-header")
    assert "question 1 of 5" in header.inner_text() and first.section.title in header.inner_text()
    assert _flat(first.prompt)[:60] in _flat(page.locator(".specdec-drill-question").inner_text())

    _answer(page, first, right=True)
    feedback, explanation = page.locator(".specdec-drill-feedback"), page.locator(".specdec-drill-explanation")
    feedback.filter(has_text="Right").wait_for(timeout=15_000)
    assert _flat(first.explanation)[:60] in _flat(explanation.inner_text())
    assert "Revise" in explanation.inner_text() and "Score 1/1" in page.locator(".specdec-drill-score").inner_text()
    widget.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "drill_right.png"), full_page=False)

    page.locator(".specdec-drill-next").click()
    header.filter(has_text="question 2 of 5").wait_for(timeout=15_000)
    assert explanation.inner_text().strip() == "", "the next question starts without the last explanation"
    _answer(page, second, right=False)
    feedback.filter(has_text="Not quite").wait_for(timeout=15_000)
    assert _flat(second.answer_text()) in _flat(feedback.inner_text())
    assert _flat(second.explanation)[:60] in _flat(explanation.inner_text())
    assert "Score 1/2" in page.locator(".specdec-drill-score").inner_text()
    widget.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "drill_wrong.png"), full_page=False)
    assert _errors(page) == []
    page.close()
