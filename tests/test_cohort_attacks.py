"""Cohort grading against hostile submissions (issue 39): each attack on notebook 01, graded in one cohort beside
honest students, with the sandbox on. Every attack scores no more than its honest part deserves, every honest
student scores what it scores alone, and nothing of any submission outlives the run."""

from __future__ import annotations

import copy
import csv
import os
import time
from pathlib import Path

import nbformat
import pytest

from conftest import background_job, background_result, read, source_path, student_path
from specdec.course import boxes, cohort, sandbox

SLUG = "01_cost_ledger"
FULL = 10.0
MARKER = "/tmp/specdec-attack-survivor"  # written on the host only if a survivor escaped its sandbox

pytestmark = [pytest.mark.pipeline,
              pytest.mark.skipif(boxes.missing() is not None, reason=f"no sandbox: {boxes.missing()}")]


def _first_answer(nb):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))


def _blank_with(code: str) -> nbformat.NotebookNode:
    """The blank notebook with ``code`` after its first answer cell's skeleton: an attack with no honest answer."""
    nb = copy.deepcopy(read(student_path(SLUG)))
    cell = _first_answer(nb)
    cell.source = cell.source.replace("raise NotImplementedError()", "pass") + "\n" + code
    return nb


def _correct_with(code: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(read(source_path(SLUG)))
    cell = _first_answer(nb)
    cell.source = code + "\n" + cell.source
    return nb


def _answer_table() -> nbformat.NotebookNode:
    """Issue 51: every hidden case of notebook 01, recorded from the reference with the seeds written in the checks
    (which any student can read), and answers that look them up: full marks while the seeds were public."""
    from test_checks import RUN_CHECK
    from test_mistakes_in_notebooks import _exercises

    table: dict[str, dict[str, object]] = {}
    for exercise in _exercises(SLUG):
        reference, check = RUN_CHECK[exercise]

        def recorded(*args, _name=exercise, _reference=reference, **kwargs):
            out = _reference(*args, **kwargs)
            table.setdefault(_name, {})[repr((args, sorted(kwargs.items())))] = out
            return out

        recorded.__name__ = exercise
        check(recorded)
    nb = copy.deepcopy(read(student_path(SLUG)))
    lookups = "".join(f"def {name}(*args, **kwargs):\n    return _TABLE[{name!r}][repr((args, sorted(kwargs.items())))]\n"
                      for name in table)
    for n, cell in enumerate(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")):
        cell.source = (f"_TABLE = {table!r}\n" if n == 0 else "") + cell.source + "\n" + lookups
    return nb


#: class -> (submission, the most it may score): an attack on a blank notebook deserves 0.
ATTACKS = {
    "gradebook_rewrite": (_blank_with(
        "import glob, sqlite3\n"
        "for db in glob.glob('/tmp/**/gradebook.db', recursive=True) + glob.glob('/work/**/gradebook.db', recursive=True):\n"
        "    c = sqlite3.connect(db); c.execute('update grade set auto_score = max_score, extra_credit = 700'); "
        "c.commit()"), 0),
    "kill_every_process": (_blank_with(
        "import os, signal\n"
        "for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    if pid != os.getpid():\n"
        "        try: os.kill(pid, signal.SIGKILL)\n"
        "        except OSError: pass"), 0),
    "hijack_other_kernels": (_blank_with(
        "import glob, json\n"
        "from jupyter_client import BlockingKernelClient\n"
        "for f in glob.glob('/tmp/**/kernel*.json', recursive=True) + glob.glob('/root/**/kernel*.json', recursive=True):\n"
        "    try:\n"
        "        k = BlockingKernelClient(); k.load_connection_info(json.load(open(f))); k.start_channels()\n"
        "        k.execute('import builtins; builtins.round = lambda *a: 0')\n"
        "    except Exception: pass"), 0),
    "checks_switched_off": (_blank_with(
        "import specdec.checks as _c, specdec.checks.core as _core\n"
        "_c.__dict__.update({k: (lambda *a, **kw: None) for k in dir(_c) if k.startswith('check_')})\n"
        "globals().update({k: (lambda *a, **kw: None) for k in ('expect_equal', 'expect_close')})\n"
        "_core.expect_equal = _core.expect_close = lambda *a, **kw: None"), 0),
    "input_transformer": (_blank_with(
        "ip = get_ipython()\n"
        "ip.input_transformers_post.append(lambda lines: ['pass\\n'])"), 0),
    "lying_int": (_blank_with(
        "import math\n"
        "class Liar(int):\n"
        "    def __ne__(self, other): return False\n"
        "    def __eq__(self, other): return True\n"
        "math.isclose = lambda *a, **k: True\n"
        "def count_params(cfg): return Liar(0)\n"
        "def kv_bytes_per_token(cfg, b=2): return Liar(0)"), 0),
    "read_the_answers": (_blank_with(
        "import glob, importlib, json\n"
        "found = [f for d in ('/tmp', '/work', '/root') for f in glob.glob(d + '/**/01_cost_ledger.ipynb', recursive=True)]\n"
        "for f in found:\n"
        "    for c in json.load(open(f))['cells']:\n"
        "        if 'BEGIN SOLUTION' in ''.join(c['source']): exec(''.join(c['source']).replace('### BEGIN SOLUTION', '')"
        ".replace('### END SOLUTION', ''))\n"
        "ref = importlib.import_module('specdec.ledger')\n"
        "count_params = ref.count_params"), 0),
    "survivor": (_blank_with(
        "import subprocess\n"
        f"subprocess.Popen(['sh', '-c', 'sleep 20; touch {MARKER}'], start_new_session=True)"), 0),
    "writes_everywhere": (_blank_with(
        "import os, sys\n"
        "for d in ('/tmp', '/dev/shm', '/root', '/etc', os.path.dirname(os.__file__), sys.prefix):\n"
        "    try: open(os.path.join(d, 'specdec-attack'), 'w').write('x')\n"
        "    except OSError: pass"), 0),
    "false_note": (_correct_with("print('DeadKernelError: the kernel died')"), FULL),
    # issue 51: the kernel's helper describes count_params as a "function of the course's package" that is really
    # os.popen, reached through specdec.paths' own import: the grader called it with the visible test's argument, in
    # its own process (as root, outside the sandbox); with arguments of the submission's choosing, a shell command
    "named_function": (_blank_with(
        "import json\n"
        "_describe = __specdec_grader__.describe\n"
        "def _forged(request):\n"
        "    answer = json.loads(_describe(request))\n"
        "    answer['answer']['count_params'] = {'kind': 'value', 'value': {'fn': 'specdec.paths:os.popen'}}\n"
        "    return json.dumps(answer)\n"
        "__specdec_grader__.describe = _forged\n"), 0),
    # issue 51's review: the answer described as a value naming the reference itself (the grader's checks load
    # specdec.ledger, so the name resolved there, and the test cell ran the reference: 10/10, not held)
    "reference_by_name": (_blank_with(
        "import json\n"
        "_describe = __specdec_grader__.describe\n"
        "def _forged(request):\n"
        "    answer = json.loads(_describe(request))\n"
        "    for _name in ('count_params', 'kv_bytes_per_token', 'speedup', 'best_gamma'):\n"
        "        answer['answer'][_name] = {'kind': 'value', 'value': {'fn': f'specdec.ledger:{_name}'}}\n"
        "    return json.dumps(answer)\n"
        "__specdec_grader__.describe = _forged\n"), 0),
    # issue 51: names the tests take from the grader, bound by a for loop, a tuple and a walrus: the test cells ran
    # with the submission's checks and expect_* (10/10 with no answer, not flagged)
    "shadow_names": (_blank_with(
        "class _Pass:\n"
        "    def __getattr__(self, name): return lambda *a, **k: None\n"
        "    def __call__(self, *a, **k): return None\n"
        "for checks in [_Pass()]: pass\n"
        "expect_equal, expect_close = _Pass(), _Pass()\n"
        "if (CheckFailure := _Pass()): pass"), 0),
    # issue 51: the hidden cases looked up in a table recorded with the public seeds (the run's salt makes it miss)
    "answer_table": (_answer_table(), 0),
    # issue 51: the reference dug out of what stands in its place (a wrapper's closure held it)
    "dig_the_reference": (_blank_with(
        "import inspect, specdec.ledger as _ledger\n"
        "_found = getattr(_ledger.count_params, '__wrapped__', None)\n"
        "for _cell in getattr(_ledger.count_params, '__closure__', None) or ():\n"
        "    _found = _found or _cell.cell_contents\n"
        "_source = inspect.getsource(_ledger)\n"
        "if 'def count_params(' in _source:\n"
        "    exec(_source[_source.index('def count_params('):].split('\\n\\n\\n')[0])\n"
        "elif _found is not None:\n"
        "    count_params = _found"), 0),
    # issue 51: processes up to the limits, spinning beside honest students (they starved them: 0/10, silently)
    "fork_bomb": (_blank_with(
        "import os, time\n"
        "for _ in range(150):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            _end = time.time() + 15\n"
        "            while time.time() < _end: pass\n"
        "            os._exit(0)\n"
        "    except OSError: break"), 0),
    # issue 51: a secret left in the kernel keyring of the sandbox's uid, shared by every sandbox and outliving them
    "keyring": (_blank_with(
        "import ctypes\n"
        "_libc = ctypes.CDLL(None, use_errno=True)\n"
        "_libc.syscall(248, b'user', b'specdec-attack', b'secret', 6, -4)  # add_key to the user keyring"), 0),
    "helper_replaced": (_blank_with(
        "import socket, types\n"
        "def _forged_session(path):\n"
        "    s = socket.socket(socket.AF_UNIX); s.connect(path)\n"
        "    s.sendall((9).to_bytes(8, 'big') + b'{\"a\": 1}')  # an answer of its own, unasked\n"
        "__specdec_grader__ = types.SimpleNamespace(session=_forged_session)"), 0),
}


HONEST = {f"honest_{n}": (read(source_path(SLUG)), FULL) for n in range(3)} | {"honest_blank": (read(student_path(SLUG)), 0)}


def _sandboxed_processes() -> list[str]:
    """Processes of a grader's uid (specdec.course.boxes.UID_BASE and up) or of nobody, the kernels' uid inside."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            continue
        if uid >= boxes.UID_BASE or uid == sandbox.UID:
            found.append(f"{pid} (uid {uid})")
    return found


@background_job("attacked")
def _grade_attacks(root):
    submitted, out = root / "submitted", root / "out"
    for student, (nb, _) in {**ATTACKS, **HONEST}.items():
        path = submitted / student / SLUG / f"{SLUG}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    link = submitted / "symlinked" / SLUG
    link.mkdir(parents=True)
    (link / f"{SLUG}.ipynb").symlink_to(source_path(SLUG))
    start = time.perf_counter()
    assert cohort.main([str(submitted), "--out", str(out), "--workers", "2", "--cell-timeout", "60",
                        "--timeout", "300", "--quiet"]) == 0
    seconds = time.perf_counter() - start
    time.sleep(1)
    survivors = _sandboxed_processes()
    totals = {row["student"]: row for row in csv.DictReader(open(out / "totals.csv"))}
    return totals, out, survivors, seconds


@pytest.fixture(scope="module")
def attacked():
    return background_result("attacked")


@pytest.mark.cohort
def test_no_attack_scores_more_than_its_honest_part(attacked):
    totals, *_ = attacked
    table = {name: (float(totals[name]["score"]), most) for name, (_, most) in ATTACKS.items()}
    gained = {name: got for name, (got, most) in table.items() if got > most}
    assert not gained, f"attacks that gained points: {gained} (table: {table})"


@pytest.mark.cohort
def test_honest_students_beside_attackers_score_as_alone(attacked):
    totals, *_ = attacked
    for name, (_, expected) in HONEST.items():
        assert float(totals[name]["score"]) == expected, (name, totals[name])
        assert totals[name]["needs_review"] == "False" and totals[name]["flagged"] == "False", totals[name]


@pytest.mark.cohort
def test_a_linked_notebook_is_refused_and_held(attacked):
    totals, *_ = attacked
    row = totals["symlinked"]
    assert row["graded"] == "False" and row["needs_review"] == "True" and "is a link" in row["messages"], row


@pytest.mark.cohort
def test_nothing_outlives_the_run_or_escapes_the_sandbox(attacked):
    _, _, survivors, _ = attacked
    assert not survivors, f"processes of the sandbox's uid still running: {survivors}"
    for leftover in ("/tmp/specdec-attack", "/dev/shm/specdec-attack", "/root/specdec-attack", "/etc/specdec-attack"):
        assert not os.path.exists(leftover), f"a submission wrote {leftover} on the host"
    assert not os.path.exists(MARKER), "a submission's process outlived its sandbox"


@pytest.mark.cohort
def test_no_cgroup_or_grader_uid_outlives_the_run(attacked):
    students = set(ATTACKS) | set(HONEST)  # a cgroup is named after its scratch folder, "<student>-<random>"
    leftovers = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{boxes.PARENT}/*")
                 if p.is_dir() and p.name.rsplit("-", 1)[0] in students]
    assert not leftovers, f"cgroups of submissions left behind: {leftovers}"


@pytest.mark.cohort
def test_a_replaced_grader_helper_is_held_for_review(attacked):
    totals, *_ = attacked
    row = totals["helper_replaced"]
    assert row["needs_review"] == "True" and "replaced the grader's helper" in row["messages"], row


@pytest.mark.cohort
def test_a_reference_call_is_evidence_not_silence(attacked):
    totals, *_ = attacked
    row = totals["read_the_answers"]
    assert row["needs_review"] == "True" and "withheld" in row["messages"], row
    assert "kernel died" not in totals["false_note"]["messages"] or totals["false_note"]["score"] == f"{FULL:g}"


@pytest.mark.cohort
def test_the_grader_never_runs_a_function_a_kernel_names(attacked):
    """Before issue 51's fix the grader resolved specdec.paths:os.popen and called it ("invalid cmd type")."""
    _, out, *_ = attacked
    rows = [r for r in csv.DictReader(open(out / "grades.csv"))
            if r["student"] == "named_function" and r["exercise"].startswith("count_params")]
    assert rows and all("cmd" not in r["message"] and "Opaque" in r["message"] for r in rows), rows


@pytest.mark.cohort
def test_names_the_tests_take_from_the_grader_cannot_be_shadowed_and_trying_is_held(attacked):
    totals, *_ = attacked
    row = totals["shadow_names"]
    assert float(row["score"]) == 0 and row["needs_review"] == "True", row
    assert "rebinds names the tests take from the grader" in row["messages"] and "expect_equal" in row["messages"], row


@pytest.mark.cohort
def test_an_answer_described_as_a_name_of_the_package_is_held(attacked):
    totals, *_ = attacked
    for name in ("reference_by_name", "named_function"):
        row = totals[name]
        assert row["needs_review"] == "True" and "not a function it defined" in row["messages"], row
