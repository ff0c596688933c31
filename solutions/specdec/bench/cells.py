"""Time every graded test cell of the instructor notebooks (a benchmark, not a test).

``python -m specdec.bench.cells [SLUG ...]`` (``make bench-cells``) runs each source notebook in
its own process with one torch thread (the cohort grader's setting), every code cell in order,
and prints the seconds each graded test cell took (its visible and hidden tests), slowest first,
with the notebook's total. The budget is 10 s per graded cell on a quiet machine, well inside
nbgrader's per-cell limit (``grader/nbgrader_config.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time

import nbformat

from specdec.course.driver import assignments, source_notebook

BUDGET_S = 10.0


def time_notebook(slug: str) -> list[dict]:
    """Run one source notebook's code cells in this process; the seconds of each graded cell."""
    import matplotlib

    matplotlib.use("Agg")
    import torch

    torch.set_num_threads(1)
    path = source_notebook(slug)
    os.chdir(path.parent)
    namespace: dict = {"__name__": "__main__"}
    times = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(cell.source, f"<{slug}>", "exec"), namespace)
        seconds = time.perf_counter() - start
        if meta.get("grade") and not meta.get("solution"):
            times.append({"notebook": slug, "cell": meta["grade_id"], "seconds": round(seconds, 2)})
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slugs", nargs="*", help="notebooks (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one notebook, JSON out
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(time_notebook(args.one)))
        return 0
    slugs = [s for s in assignments() if not args.slugs or any(s.startswith(a.zfill(2)) or s == a for a in args.slugs)]
    rows = []
    for slug in slugs:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "specdec.bench.cells", "--one", slug], capture_output=True,
                              text=True, env=env)
        if done.returncode != 0:
            print(f"{slug}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            return 1
        cells = json.loads(done.stdout.strip().splitlines()[-1])
        rows += cells
        print(f"{slug}: {len(cells)} graded cells, {sum(c['seconds'] for c in cells):.1f} s in all, slowest "
              f"{max(cells, key=lambda c: c['seconds'])['cell']} ({max(c['seconds'] for c in cells):.1f} s)")
    print("\nslowest graded cells (one thread):")
    for row in sorted(rows, key=lambda r: -r["seconds"])[:15]:
        flag = "  OVER BUDGET" if row["seconds"] > BUDGET_S else ""
        print(f"  {row['seconds']:6.2f} s  {row['notebook']} / {row['cell']}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
