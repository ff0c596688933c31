"""``make release``: regenerate the student notebooks in ``notebooks/`` from ``grader/source/``.

Runs ``nbgrader generate_assignment`` in a scratch course, so the committed course root
gets no gradebook or release folder. Usage: ``python -m specdec.course.release [--check] [SLUG ...]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

from specdec.course.driver import assignments, generate, make_course
from specdec.paths import NOTEBOOKS_DIR


def build_student_notebooks(dest: Path, slugs: list[str] | None = None) -> list[Path]:
    """Generate the student version of each assignment into ``dest/NN_slug.ipynb``."""
    slugs = slugs or assignments()
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="specdec-release-") as tmp:
        root = make_course(Path(tmp), slugs)
        for slug in slugs:
            target = dest / f"{slug}.ipynb"
            shutil.copy(generate(root, slug), target)
            written.append(target)
    return written


def comparable_cells(notebook: Path | nbformat.NotebookNode) -> list[tuple]:
    """What must agree between two student notebooks: cell type, source, nbgrader metadata."""
    nb = nbformat.read(notebook, as_version=4) if isinstance(notebook, Path) else notebook
    return [(c.cell_type, c.source, dict(c.metadata.get("nbgrader", {}))) for c in nb.cells]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slugs", nargs="*", help="assignments to release (default: all)")
    parser.add_argument("--check", action="store_true", help="only report whether notebooks/ is up to date")
    parser.add_argument("--missing", action="store_true", help="only write notebooks that do not exist yet")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.slugs) - set(assignments()))
    if unknown:
        parser.error(f"unknown assignment(s) {unknown}; known: {assignments()}")
    if args.missing:
        args.slugs = [s for s in (args.slugs or assignments()) if not (NOTEBOOKS_DIR / f"{s}.ipynb").exists()]
        if not args.slugs:
            return 0
    if not args.check:
        for path in build_student_notebooks(NOTEBOOKS_DIR, args.slugs or None):
            print(f"wrote {path.relative_to(NOTEBOOKS_DIR.parent)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        stale = [
            p.name for p in build_student_notebooks(Path(tmp), args.slugs or None)
            if not (NOTEBOOKS_DIR / p.name).exists() or comparable_cells(p) != comparable_cells(NOTEBOOKS_DIR / p.name)
        ]
    if stale:
        print(f"out of date: {', '.join(stale)} (run `make release`)", file=sys.stderr)
        return 1
    print("notebooks/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
