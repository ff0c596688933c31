"""Benchmark of cohort grading (not a test): ``python -m specdec.bench.cohort``.

Builds --copies submissions of notebook 02 of five kinds in equal numbers (a correct one, the
blank one, one with a wrong answer, one whose answer cell never ends, one whose kernel exits),
grades them with ``specdec.course.cohort`` using --workers, and checks every student's score against
the score of its kind. Prints the wall time and the seconds per notebook.
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from specdec.course import cohort
from specdec.course.driver import source_notebook
from specdec.paths import NOTEBOOKS_DIR

SLUG = "02_greedy_verify"


def _with(grade_id: str, before: str = "", after: str = "") -> nbformat.NotebookNode:
    nb = nbformat.read(source_notebook(SLUG), as_version=4)
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    cell.source = "\n".join(part for part in (before, cell.source, after) if part)
    return nb


#: kind -> (how to make its notebook, its expected score out of 10)
KINDS = {
    "correct": (lambda: nbformat.read(source_notebook(SLUG), as_version=4), 10.0),
    "blank": (lambda: nbformat.read(NOTEBOOKS_DIR / f"{SLUG}.ipynb", as_version=4), 0.0),
    "wrong_answer": (lambda: _with("round_shapes", after="def round_shapes(P, gamma, k):\n    return None"), 8.0),
    "endless": (lambda: _with("greedy_verify", before="while True:\n    pass"), 5.0),
    "crash": (lambda: _with("greedy_verify_batched", before="import os\nos._exit(1)"), 0.0),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cell-timeout", type=float, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specdec-bench-cohort-") as tmp:
        submitted, out = Path(tmp) / "submitted", Path(tmp) / "out"
        expected = {}
        kinds = list(KINDS.items())
        for i in range(args.copies):
            kind, (make, score) = kinds[i % len(kinds)]
            student = f"{kind}-{i:03d}"
            path = submitted / student / SLUG / f"{SLUG}.ipynb"
            path.parent.mkdir(parents=True)
            nbformat.write(make(), path)
            expected[student] = score
        start = time.perf_counter()
        cohort.main([str(submitted), "--out", str(out), "--workers", str(args.workers),
                     "--cell-timeout", str(args.cell_timeout)])
        wall = time.perf_counter() - start
        totals = {row["student"]: float(row["score"]) for row in csv.DictReader(open(out / "totals.csv"))}
    wrong = {s: (totals.get(s), want) for s, want in expected.items() if totals.get(s) != want}
    print(f"{args.copies} notebooks, {args.workers} workers: {wall:.0f} s in all, {wall / args.copies:.1f} s per notebook; "
          f"scores as expected: {args.copies - len(wrong)} of {args.copies}")
    for student, (got, want) in sorted(wrong.items()):
        print(f"  {student}: got {got}, expected {want}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
