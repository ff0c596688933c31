"""``make release``: regenerate the student notebooks in ``notebooks/`` from ``grader/source/``.

Runs ``nbgrader generate_assignment`` in a scratch course, so the committed course root
gets no gradebook or release folder. Usage: ``python -m specdec.course.release [--check] [SLUG ...]``.
A learner starts a notebook again with ``--reset NN`` (``make reset NB=NN``): the current file is kept in
``notebooks/.backup/`` first, never overwritten.
"""

from __future__ import annotations

import argparse
import datetime
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


def _slug(name: str) -> str:
    """'12', '12_self_drafting' or '12_self_drafting.ipynb' -> '12_self_drafting'."""
    stem = Path(name).stem
    found = [s for s in assignments() if s == stem or (stem.isdigit() and s.startswith(f"{int(stem):02d}_"))]
    if len(found) != 1:
        raise SystemExit(f"{name!r} names no notebook of this course; known: {', '.join(assignments())}")
    return found[0]


def reset(names: list[str]) -> list[Path]:
    """A fresh student notebook for each name, the current one moved to notebooks/.backup/ first."""
    if not names:
        raise SystemExit("name the notebook to start again, e.g. make reset NB=05 (your work is kept in a backup)")
    slugs = [_slug(n) for n in names]
    backups = NOTEBOOKS_DIR / ".backup"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    kept = []
    for slug in slugs:
        current = NOTEBOOKS_DIR / f"{slug}.ipynb"
        if current.exists():
            backups.mkdir(exist_ok=True)
            backup = backups / f"{slug}-{stamp}.ipynb"
            n = 1
            while backup.exists():  # two resets in one second: never overwrite a backup
                backup, n = backups / f"{slug}-{stamp}-{n}.ipynb", n + 1
            shutil.copy2(current, backup)
            kept.append(backup)
    build_student_notebooks(NOTEBOOKS_DIR, slugs)
    return kept


def comparable_cells(notebook: Path | nbformat.NotebookNode) -> list[tuple]:
    """What must agree between two student notebooks: cell type, source, nbgrader metadata."""
    nb = nbformat.read(notebook, as_version=4) if isinstance(notebook, Path) else notebook
    return [(c.cell_type, c.source, dict(c.metadata.get("nbgrader", {}))) for c in nb.cells]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slugs", nargs="*", help="assignments to release (default: all)")
    parser.add_argument("--check", action="store_true", help="only report whether notebooks/ is up to date")
    parser.add_argument("--missing", action="store_true", help="only write notebooks that do not exist yet")
    parser.add_argument("--reset", nargs="*", metavar="NB",
                        help="start these notebooks again (12 or 12_self_drafting); the current files go to "
                             "notebooks/.backup/ first")
    args = parser.parse_args(argv)
    if args.reset is not None:
        for backup in reset(args.reset):
            print(f"your previous version is kept as {backup.relative_to(NOTEBOOKS_DIR.parent)}")
        print("fresh: " + ", ".join(f"notebooks/{_slug(n)}.ipynb" for n in args.reset))
        return 0
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
