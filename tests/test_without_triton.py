"""Without triton (a Mac: triton publishes Linux wheels only), everything but notebook 08 imports, runs and grades,
and notebook 08 and ``make grade NB=08`` say in one line what they need. The autograde round trip (conftest) runs
every notebook but 08 with triton hidden the same way, so full marks and zero there are proved without it too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import NO_TRITON, WITHOUT_TRITON_BUT_FOR_08, student_path
from specdec.models.devices import TRITON_NEEDED
from specdec.paths import REPO_ROOT

#: The modules that need triton: notebook 08's kernels, their checks and their catalogue of mistakes.
NEED_TRITON = {"specdec.kernels", "specdec.checks.kernels", "specdec.mistakes.kernels"}


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(NO_TRITON), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_triton_is_hidden_in_every_notebook_folder_but_08s(tmp_path):
    probe = ("import importlib.util as u\ntry:\n    print(u.find_spec('triton') is not None)\n"
             "except ImportError:\n    print(False)")
    seen = {}
    for name in ("05_kv_cache_engine", "08_gpu_kernels", "course"):
        (tmp_path / name).mkdir()
        seen[name] = _python(probe, tmp_path / name, WITHOUT_TRITON_BUT_FOR_08).stdout.strip()
    assert seen == {"05_kv_cache_engine": "False", "08_gpu_kernels": "True", "course": "False"}


def test_every_module_but_the_kernels_imports_without_triton(tmp_path):
    walk = """
import importlib, json, pkgutil, specdec
failed = {}
for module in pkgutil.walk_packages(specdec.__path__, "specdec."):
    if module.name.endswith("__main__"):  # entry points run when imported
        continue
    try:
        importlib.import_module(module.name)
    except ImportError as err:
        failed[module.name] = str(err)
print(json.dumps(failed))
"""
    done = _python(walk, tmp_path)
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(failed) == NEED_TRITON, done.stderr[-2000:]
    assert set(failed.values()) == {TRITON_NEEDED}


def test_notebook_08_stops_at_its_first_cell_with_one_line_saying_what_it_needs(tmp_path):
    notebook = json.loads(student_path("08_gpu_kernels").read_text())
    setup = "".join(next(c for c in notebook["cells"] if c["cell_type"] == "code")["source"])
    done = _python(setup, tmp_path)
    assert done.returncode != 0 and done.stderr.strip().splitlines()[-1] == f"ImportError: {TRITON_NEEDED}"


def test_make_grade_of_08_says_what_it_needs_and_grades_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specdec.course.grading", "08", "--report-dir", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(NO_TRITON)})
    assert done.returncode == 0, done.stderr
    assert "08_gpu_kernels: not graded" in done.stdout and "(not graded: 08_gpu_kernels)" in done.stdout
    table_row = next(line for line in done.stdout.splitlines() if line.startswith("08_gpu_kernels  -"))
    assert "Notebook 08's kernels need Triton, which publishes wheels for Linux only" in table_row


def test_the_other_notebooks_checks_find_their_mistakes_without_triton(tmp_path):
    """A check that fails looks its answer up in the catalogue of mistakes, whose notebook 08 part imports the
    kernels: without triton the rest of the catalogue still loads, and a wrong answer still gets its hint."""
    code = """
from specdec.checks import ledger
from specdec.checks.core import CheckFailure
from specdec.mistakes import catalogue, for_exercise
from specdec.mistakes.ledger import MISTAKES
assert catalogue() and not any(m.exercise.endswith("_kernel") for m in catalogue())
wrong = MISTAKES[0]
try:
    getattr(ledger, "check_" + wrong.exercise)(wrong.fn)
except CheckFailure as failure:
    print("caught:", wrong.hint in str(failure))
"""
    done = _python(code, tmp_path)
    assert done.stdout.strip() == "caught: True", done.stderr[-2000:]


def test_every_drill_question_is_drawn_without_triton(tmp_path):
    """The mock interview of notebook 10 draws questions at random; one about the race once imported the kernels."""
    code = """
from specdec.drill import REGISTRY
for name, template in REGISTRY.items():
    for seed in range(3):
        template.question(seed)
print(len(REGISTRY))
"""
    done = _python(code, tmp_path)
    assert done.returncode == 0 and int(done.stdout.split()[-1]) > 50, done.stderr[-2000:]
