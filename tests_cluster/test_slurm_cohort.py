"""grader/cluster/ on a real Slurm (a private one-node cluster, conftest.py): a small cohort graded by the array
script, one shard per task, and merged by a dependent job gives what one machine gives; a shard cancelled while it
grades, then resubmitted, leaves the merge unchanged; no process a job started outlives it. Run by `make test-cluster`."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from conftest import Slurm
from specdec.course import cohort
from specdec.paths import NOTEBOOKS_DIR, REPO_ROOT, SOURCE_DIR

SLUG = "01_cost_ledger"
CLUSTER = REPO_ROOT / "grader" / "cluster"
SHARDS = 3
CANCELLED = "chen"  # the student whose shard is cancelled while grading them, then resubmitted


def _wrong_speedup() -> nbformat.NotebookNode:
    nb = nbformat.read(SOURCE_DIR / SLUG / f"{SLUG}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "speedup":
            cell.source = "def speedup(a, gamma, c):\n    return expected_tokens_per_round(a, gamma)"
    return nb


def make_cohort(submitted: Path) -> None:
    """A correct, a blank and a wrong answer (one per shard of three), a broken notebook and a folder that is not an
    assignment."""
    notebooks = {"ada": nbformat.read(SOURCE_DIR / SLUG / f"{SLUG}.ipynb", as_version=4),
                 "bo": nbformat.read(NOTEBOOKS_DIR / f"{SLUG}.ipynb", as_version=4),
                 "chen": _wrong_speedup()}
    for student, nb in notebooks.items():
        path = submitted / student / SLUG / f"{SLUG}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    (submitted / "gus" / SLUG).mkdir(parents=True)
    (submitted / "gus" / SLUG / f"{SLUG}.ipynb").write_text('{"cells": [')
    (submitted / "hal" / "99_unknown").mkdir(parents=True)


def outputs(folder: Path) -> dict:
    """What a grading wrote, timings aside: the three tables, the report and which feedback files exist."""
    with open(folder / "totals.csv") as f:
        totals = [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]
    return {"grades.csv": (folder / "grades.csv").read_text(), "totals.csv": totals,
            "summary.json": json.loads((folder / "summary.json").read_text()),
            "report.txt": (folder / "report.txt").read_text(),
            "feedback": sorted(p.relative_to(folder).as_posix() for p in (folder / "feedback").rglob("*") if p.is_file())}


@dataclass
class Cohort:
    """The cohort on the cluster: its submissions, the cluster's results (shard-K/ and all/) and the one-machine
    grading, and how the instructor submits grader/cluster/'s scripts."""

    slurm: Slurm
    submitted: Path
    results: Path
    one: Path

    def export(self, **extra: str) -> str:
        """sbatch's --export: the submitter's environment, the folders the scripts read, and a TMPDIR inside the
        cluster's folder (so that whatever a job leaves running names that folder)."""
        names = {"SUBMITTED": self.submitted, "RESULTS": self.results, "COURSE": REPO_ROOT, "PYTHON": sys.executable,
                 "TMPDIR": self.slurm.root / "tmp", **extra}
        return "--export=ALL," + ",".join(f"{k}={v}" for k, v in names.items())

    def submit_shards(self, array: str, **extra: str) -> str:
        """The array script for the tasks in ``array`` (one CPU each: the whole node has two)."""
        return self.slurm.sbatch(f"--array={array}", "--cpus-per-task=1", "--mem=2G", self.export(**extra),
                                 f"--output={self.slurm.root}/jobs/cohort-%A_%a.log", str(CLUSTER / "cohort-array.sbatch"))

    def submit_merge(self, after: str) -> str:
        return self.slurm.sbatch(f"--dependency=afterok:{after}", self.export(),
                                 f"--output={self.slurm.root}/jobs/merge-%j.log", str(CLUSTER / "merge.sh"))


@pytest.fixture(scope="module")
def graded(slurm) -> Cohort:
    """The cohort graded twice: by the array of three shards and the merge on the cluster, and on one machine."""
    root = slurm.root / "cohort"
    graded = Cohort(slurm, root / "submitted", root / "results", root / "one")
    make_cohort(graded.submitted)
    array = graded.submit_shards(f"0-{SHARDS - 1}")  # the script's own --array is 0-7
    merge = graded.submit_merge(after=array)
    one = subprocess.Popen([sys.executable, "-m", "specdec.course.cohort", str(graded.submitted), "--out", str(graded.one),
                            "--workers", "2", "--quiet"], stderr=subprocess.PIPE, text=True)  # meanwhile, on the same cores
    try:
        assert slurm.wait(array, timeout_s=400) == {str(k): "COMPLETED" for k in range(SHARDS)}, slurm.logs()
        assert slurm.wait(merge, timeout_s=60) == {merge: "COMPLETED"}, slurm.logs()
        assert one.wait(timeout=400) == 0, one.stderr.read()
    finally:
        one.kill()  # no-op once it has ended
        one.wait()
    return graded


def test_array_and_merge_equal_one_machine(graded):
    shards = [json.loads((graded.results / f"shard-{k}" / "shard.json").read_text()) for k in range(SHARDS)]
    assert [sorted(s["student"] for s in shard["submissions"]) for shard in shards] == [["ada"], ["chen"], ["bo", "gus"]]
    merged = outputs(graded.results / "all")
    assert merged == outputs(graded.one)
    assert {r["student"]: r["score"] for r in merged["totals.csv"]} == {"ada": "10", "bo": "0", "chen": "7", "gus": "0"}


def _eventually(done: Callable[[], object], failure: Callable[[], str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, failure()
        time.sleep(0.5)


def test_cancelled_shard_resubmitted_leaves_merge_unchanged(slurm, graded):
    shard = cohort.shard_of(CANCELLED, SHARDS)
    folder, before = graded.results / f"shard-{shard}", outputs(graded.results / "all")
    # Rerun one shard as an instructor would after a failed task: --array=K alone, so N comes from SHARDS.
    rerun = graded.submit_shards(str(shard), SHARDS=str(SHARDS))
    merge = graded.submit_merge(after=rerun)
    _eventually(lambda: slurm.run("squeue", "-h", "-j", f"{rerun}_{shard}", "-o", "%T").stdout.strip() == "RUNNING"
                and any("autograde" in cmd and f"--student={CANCELLED}" in cmd for cmd in slurm.strays().values()),
                lambda: f"task {rerun}_{shard} did not start grading {CANCELLED}\n{slurm.logs()}", timeout_s=120)
    time.sleep(2)  # well inside nbgrader's run of the notebook
    ran = slurm.run("squeue", "-h", "-j", f"{rerun}_{shard}", "-o", "%M").stdout.strip()
    slurm.run("scancel", f"{rerun}_{shard}")
    assert slurm.wait(rerun, timeout_s=60) == {str(shard): "CANCELLED"}
    slurm.wait_for_no_strays()
    left = sorted(p.name for p in folder.iterdir())
    print(f"task {rerun}_{shard} cancelled after {ran} running, while grading {CANCELLED}; then shard-{shard}/ held "
          f"{left} and TMPDIR {sorted(p.name for p in (slurm.root / 'tmp').iterdir())}")  # shown by pytest -rP
    # The half-done rerun left no shard.json, so merge refuses the shard rather than take the previous run's results;
    # the dependent merge can never start (afterok), and is cancelled as README says.
    assert "shard.json" not in left, left
    refused = subprocess.run([sys.executable, "-m", "specdec.course.cohort", "merge",
                              *map(str, sorted(graded.results.glob("shard-*"))), "--out", str(graded.results / "all")],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and f"shard-{shard}: no shard.json" in refused.stderr, refused.stderr
    _eventually(lambda: slurm.run("squeue", "-h", "-j", merge, "-o", "%r").stdout.strip() == "DependencyNeverSatisfied",
                lambda: f"merge job {merge}: {slurm.run('scontrol', 'show', 'job', merge).stdout}", timeout_s=30)
    slurm.run("scancel", merge)

    resubmitted = graded.submit_shards(str(shard), SHARDS=str(SHARDS))
    merge = graded.submit_merge(after=resubmitted)
    assert slurm.wait(resubmitted, timeout_s=120) == {str(shard): "COMPLETED"}, slurm.logs()
    assert slurm.wait(merge, timeout_s=60) == {merge: "COMPLETED"}, slurm.logs()
    assert outputs(graded.results / "all") == before  # nobody lost, nobody counted twice


def test_no_job_process_outlives_its_job(slurm, graded):
    slurm.wait_for_no_strays(timeout_s=5)
