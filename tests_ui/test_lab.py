"""The course in a real browser: JupyterLab (as `make lab` starts it) driven by Playwright in Debian's
Chromium. Run with `make test-ui`; screenshots go to artifacts/ui/.

The notebooks are run with the reference answers filled in (the instructor versions, copied under
the learners' file names into a scratch folder), since a blank notebook raises
NotImplementedError by design."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from specdec import ledger
from specdec.paths import REPO_ROOT, SOURCE_DIR

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
SHOTS = REPO_ROOT / "artifacts" / "ui"
TOKEN = "course-ui-test-token"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a free loopback port with a token, serving copies of the solved notebooks."""
    root = tmp_path_factory.mktemp("notebooks")
    for slug in ("01_cost_ledger", "04_chain_verify"):
        shutil.copy(SOURCE_DIR / slug / f"{slug}.ipynb", root / f"{slug}.ipynb")
    port = _free_port()
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "IPYTHONDIR": str(home / "ipython")}
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')  # render every cell
    cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", f"--LabApp.user_settings_dir={home / 'settings'}",
           f"--ServerApp.root_dir={root}", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", f"--IdentityProvider.token={TOKEN}", "--no-browser",
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


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        yield chromium
        chromium.close()


def _run_all(page, notebook: str, timeout_s: float) -> None:
    """Open a notebook, run all cells from the Run menu, wait until every cell has finished."""
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle")).wait_for(timeout=90_000)  # the kernel is up
    no_news = page.get_by_role("button", name="No", exact=True)
    if no_news.count():  # JupyterLab asks once whether to fetch news: it must not, offline
        no_news.first.click()
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
    deadline = time.time() + timeout_s
    time.sleep(2)
    SHOTS.mkdir(parents=True, exist_ok=True)
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    code_cells = panel.locator(".jp-CodeCell").count()
    while time.time() < deadline:
        done = panel.locator(".jp-CodeCell .jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).count()
        if done == code_cells and panel.locator(".jp-InputPrompt", has_text="[*]").count() == 0:
            return
        time.sleep(1)
    page.screenshot(path=str(SHOTS / f"{notebook}_stuck.png"))
    pytest.fail(f"{notebook}: cells still running after {timeout_s:.0f} s")


def _errors(page) -> list[str]:
    outputs = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    return [outputs.nth(i).inner_text()[:300] for i in range(outputs.count())]


def test_unauthenticated_access_is_refused(lab):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{lab}/api/contents", timeout=5)
    assert refused.value.code == 403


def test_notebook_01_runs_and_its_simulator_reacts(lab, browser):
    """Move gamma from 4 to 7 with the keyboard: once the kernel is idle and the render has landed, the line under
    the sliders and the panels (the caption drawn with them) describe gamma 7, with the same numbers."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(f"{lab}/lab/workspaces/ui01/tree/01_cost_ledger.ipynb?token={TOKEN}&reset")
    _run_all(page, "01_cost_ledger", timeout_s=180)
    assert _errors(page) == []
    readout = page.locator(".widget-html-content", has_text="tokens/round").first
    readout.scroll_into_view_if_needed()
    assert page.locator(".widget-slider").count() >= 5, "the simulator's sliders did not render"
    assert page.locator("img.widget-image").count() == 1, "the simulator's panels were not drawn"
    caption = page.locator(".widget-html-content", has_text="panels for").first
    before = readout.inner_text()
    page.screenshot(path=str(SHOTS / "01_simulator_before.png"), full_page=False)
    gamma = page.locator(".widget-slider", has_text="draft length gamma")
    gamma.locator(".noUi-handle, .ui-slider-handle").first.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    released = time.time()
    page.get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle")).wait_for(timeout=30_000)
    assert gamma.locator(".widget-readout").inner_text().strip() == "7", "the slider did not move to gamma 7"
    page.wait_for_function("el => el.innerText.includes('gamma = 7,')", arg=caption.element_handle(), timeout=15_000)
    latency = time.time() - released
    page.screenshot(path=str(SHOTS / "01_simulator_after.png"), full_page=False)
    line, drawn = readout.inner_text(), caption.inner_text()
    speedup = ledger.speedup(0.8, 7, 0.05)
    assert line != before, f"moving gamma did not change the line: {before!r}"
    assert f"speedup {speedup:.2f}x" in line and f"E = {ledger.expected_tokens_per_round(0.8, 7):.2f}" in line, (
        f"the line does not describe gamma 7: {line!r}")
    assert drawn.strip().endswith(f"speedup {speedup:.2f}x"), f"panels and line disagree: {drawn!r} against {line!r}"
    assert latency < 10, f"the panels took {latency:.1f} s to follow the slider"
    page.close()


def test_notebook_04_runs_clean(lab, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(f"{lab}/lab/workspaces/ui04/tree/04_chain_verify.ipynb?token={TOKEN}&reset")
    _run_all(page, "04_chain_verify", timeout_s=240)
    page.screenshot(path=str(SHOTS / "04_chain_verify.png"), full_page=False)
    assert _errors(page) == []
    page.close()


def _accepts_connections(port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


def test_make_lab_serves_the_course_on_loopback_with_a_token(tmp_path):
    """`make lab` as a learner runs it: loopback only, a token required, the notebooks in course order."""
    port = _free_port()
    env = {**os.environ, "HOME": str(tmp_path), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log = tmp_path / "lab.log"
    lab = subprocess.Popen(["make", "-s", "lab", f"PORT={port}", "BROWSER=no", f"BIN={Path(sys.executable).parent}"],
                           cwd=REPO_ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        token = None
        for _ in range(120):
            match = re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=(\w+)", log.read_text())
            if match:
                token = match.group(1)
                break
            time.sleep(0.5)
        assert token, "make lab printed no loopback URL with a token:\n" + log.read_text()[-2000:]
        # Jupyter prints its URL before its event loop binds the port: wait for the bind, not for the print.
        assert _accepts_connections(port, seconds=60), "make lab printed its URL but never listened:\n" + log.read_text()[-2000:]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=5)
        assert refused.value.code == 403
        listing = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=5).read())
        names = sorted(item["name"] for item in listing["content"] if item["name"].endswith(".ipynb"))
        assert names[:3] == ["01_cost_ledger.ipynb", "02_greedy_verify.ipynb", "03_rejection_sampling.ipynb"]
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)
