"""A cohort graded as shards on a cluster equals the one-machine run: three shards run as separate processes by
grader/cluster/cohort-array.sbatch (as Slurm would start them), merged by grader/cluster/merge.sh, give the same
grades.csv, totals.csv (timings aside), summary.json, report.txt and feedback as one `cohort` run."""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import nbformat
import pytest
import yaml

from conftest import background_job, background_result, source_path, student_path
from specdec.course import cohort
from specdec.paths import REPO_ROOT

SLUG = "01_cost_ledger"
CLUSTER = REPO_ROOT / "grader" / "cluster"
SHARDS = 3


def _wrong_speedup() -> nbformat.NotebookNode:
    nb = copy.deepcopy(nbformat.read(source_path(SLUG), as_version=4))
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "speedup":
            cell.source = "def speedup(a, gamma, c):\n    return expected_tokens_per_round(a, gamma)"
    return nb


def _cohort(root: Path) -> Path:
    """Three students (correct, blank, a wrong answer; one per shard), a broken notebook and a folder that is not
    an assignment."""
    submitted = root / "submitted"
    makers = {"ada": lambda: nbformat.read(source_path(SLUG), as_version=4),
              "bo": lambda: nbformat.read(student_path(SLUG), as_version=4),
              "chen": _wrong_speedup}
    for student, make in makers.items():
        path = submitted / student / SLUG / f"{SLUG}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(make(), path)
    (submitted / "gus" / SLUG).mkdir(parents=True)
    (submitted / "gus" / SLUG / f"{SLUG}.ipynb").write_text('{"cells": [')
    (submitted / "hal" / "99_unknown").mkdir(parents=True)
    return submitted


@background_job("sharded")
def _grade_sharded(root):
    submitted = _cohort(root)
    assert cohort.main([str(submitted), "--out", str(root / "one"), "--workers", "2", "--quiet"]) == 0
    env = {**os.environ, "SUBMITTED": str(submitted), "RESULTS": str(root / "results"), "COURSE": str(REPO_ROOT),
           "PYTHON": sys.executable, "SLURM_ARRAY_TASK_COUNT": str(SHARDS), "SLURM_CPUS_PER_TASK": "1"}
    tasks = [subprocess.Popen(["bash", str(CLUSTER / "cohort-array.sbatch")], env={**env, "SLURM_ARRAY_TASK_ID": str(k)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in range(SHARDS)]
    logs = [task.communicate(timeout=900)[0] for task in tasks]
    assert all(task.returncode == 0 for task in tasks), logs
    merged = subprocess.run(["bash", str(CLUSTER / "merge.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    return root


@pytest.fixture(scope="module")
def sharded():
    return background_result("sharded")


def _table(path: Path, drop: str | None = None) -> list[dict]:
    return [{k: v for k, v in row.items() if k != drop} for row in csv.DictReader(open(path))]


@pytest.mark.cohort
@pytest.mark.pipeline
def test_three_shards_merged_equal_one_machine(sharded):
    one, merged = sharded / "one", sharded / "results" / "all"
    shard_students = [sorted({r["student"] for r in _table(sharded / "results" / f"shard-{k}" / "totals.csv")})
                      for k in range(SHARDS)]
    assert shard_students == [["ada"], ["chen"], ["bo", "gus"]], shard_students  # crc32 of the name, mod 3
    assert (merged / "grades.csv").read_text() == (one / "grades.csv").read_text()
    assert _table(merged / "totals.csv", drop="seconds") == _table(one / "totals.csv", drop="seconds")
    assert json.loads((merged / "summary.json").read_text()) == json.loads((one / "summary.json").read_text())
    assert (merged / "report.txt").read_text() == (one / "report.txt").read_text()
    assert sorted(p.relative_to(merged).as_posix() for p in (merged / "feedback").rglob("*.html")) == sorted(
        p.relative_to(one).as_posix() for p in (one / "feedback").rglob("*.html"))
    scores = {r["student"]: r["score"] for r in _table(merged / "totals.csv")}
    assert scores["ada"] == "10" and scores["bo"] == "0" and scores["chen"] == "7"  # speedup and best_gamma lost


def test_shards_partition_students_stably():
    names = [f"student{i}" for i in range(200)]
    for n in (1, 2, 5):
        parts = [[s for s in names if cohort.shard_of(s, n) == k] for k in range(n)]
        assert sorted(sum(parts, [])) == sorted(names) and all(parts)
    assert [cohort.shard_of(s, 3) for s in ("ada", "bo", "chen")] == [0, 2, 1]  # crc32: the same on every machine
    with pytest.raises(Exception, match="need 0 <= K < N"):
        cohort.parse_shard("3/3")
    with pytest.raises(Exception, match="expected K/N"):
        cohort.parse_shard("one")


def test_merge_names_missing_duplicated_and_foreign_shards(tmp_path, capsys):
    for k, n in ((0, 3), (2, 3)):
        folder = tmp_path / f"s{k}"
        folder.mkdir()
        cohort.write_shard([], [], (k, n), folder)
    assert cohort.main(["merge", str(tmp_path / "s0"), str(tmp_path / "s2"), "--out", str(tmp_path / "m")]) == 2
    assert "missing shard(s) 1/3 of 3" in capsys.readouterr().err
    assert cohort.main(["merge", str(tmp_path / "s0"), str(tmp_path / "s0"), "--out", str(tmp_path / "m")]) == 2
    assert "shard 0/3 given twice" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    assert cohort.main(["merge", str(tmp_path / "plain"), "--out", str(tmp_path / "m")]) == 2
    assert "no shard.json" in capsys.readouterr().err


def test_rerun_of_a_shard_replaces_its_folder(tmp_path, monkeypatch, capsys):
    """A shard's rerun first removes what its earlier run wrote: stopped half-way (a cancelled task), it leaves a
    shard that merge refuses; finished, the folder holds its own results only."""
    folder, others = tmp_path / "shard-1", [tmp_path / "shard-0", tmp_path / "shard-2"]
    for k, shard in enumerate([others[0], folder, others[1]]):
        shard.mkdir()
        cohort.write_outputs([], [], shard)
        cohort.write_shard([], [f"zed/{SLUG}: from the earlier run"] if k == 1 else [], (k, SHARDS), shard)
    (folder / "feedback" / "zed").mkdir(parents=True)
    (folder / "feedback" / "zed" / f"{SLUG}.html").write_text("earlier run")
    submitted = tmp_path / "submitted"
    (submitted / "chen" / SLUG).mkdir(parents=True)  # chen is in shard 1 of 3
    (submitted / "chen" / SLUG / f"{SLUG}.ipynb").write_text("{}")

    def cancelled(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cohort, "prepare", cancelled)
    with pytest.raises(KeyboardInterrupt):
        cohort.main([str(submitted), "--shard", f"1/{SHARDS}", "--out", str(folder), "--quiet"])
    assert sorted(p.name for p in folder.iterdir()) == []
    assert cohort.main(["merge", str(others[0]), str(folder), str(others[1]), "--out", str(tmp_path / "all")]) == 2
    assert "shard-1: no shard.json" in capsys.readouterr().err

    (submitted / "chen").rename(submitted / "ada")  # shard 0: shard 1 now has nobody to grade, and finishes at once
    assert cohort.main([str(submitted), "--shard", f"1/{SHARDS}", "--out", str(folder), "--quiet"]) == 0
    assert not (folder / "feedback").exists()
    assert json.loads((folder / "shard.json").read_text()) == {"shard": [1, SHARDS], "problems": [], "submissions": []}


def test_cluster_manifests_run_one_shard_per_index():
    job, merge_job = (yaml.safe_load((CLUSTER / name).read_text()) for name in ("indexed-job.yaml", "merge-job.yaml"))
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["SHARDS"]) == spec["completions"] == spec["parallelism"]
    assert '--shard "$JOB_COMPLETION_INDEX/$SHARDS"' in container["args"][0]
    assert "specdec.course.cohort merge" in merge_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    sbatch = (CLUSTER / "cohort-array.sbatch").read_text()
    assert "#SBATCH --array=0-" in sbatch and '--shard "$K/$N"' in sbatch


#: Kubernetes versions the manifests must be valid for: 1.30 (their backoffLimitPerIndex is beta from 1.29, where
#: it is on by default; 1.27's schemas reject it) and the newest schemas the validator bundles.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


@pytest.mark.parametrize("manifest", ["indexed-job.yaml", "merge-job.yaml"])
def test_cluster_manifests_are_valid_kubernetes(manifest):
    """Each manifest against Kubernetes' own OpenAPI schemas (offline, strict: an unknown field is an error)."""
    resource = yaml.safe_load((CLUSTER / manifest).read_text())
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(resource, version, strict=True)


def test_manifest_validation_catches_a_misspelt_field_and_a_wrong_type():
    job = yaml.safe_load((CLUSTER / "indexed-job.yaml").read_text())
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["completionMod"] = misspelt["spec"].pop("completionMode")
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["parallelism"] = "three"
    for broken, why in ((misspelt, "'completionMod' was unexpected"), (wrong_type, "'three' is not of type")):
        with pytest.raises(kubernetes_validate.ValidationError, match=why):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)
