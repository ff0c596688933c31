"""The student edition: ``python -m specdec.course.edition --out DIR --release 01 02 [--answers 01]``.

What a cohort's students install (or a hub image holds), built from this repository, which is the self-study
edition and stays as it is. It holds the released student notebooks, ``data/``, and the package with:

- the reference of every exercise whose answers are not released (``--answers``: by default none) cut out, source
  and bytecode: the package's own code that calls one runs the learner's function of that name instead
  (``specdec.course.withheld.LearnersOwn``, the mechanism of cohort grading's graded build);
- the hidden checks left out (every ``check_*`` of ``specdec.checks`` says so when called), the visible helpers
  the notebooks' own tests use (``expect_equal``, ``expect_kernel``, ...) kept;
- the catalogue of mistakes empty (its wrong answers and hints are the hidden tests' explanations).

No ``grader/`` (the instructor notebooks hold the answers) and no ``tests/``. ``pip install DIR`` (or the wheel
``pip wheel --no-deps DIR`` builds) installs it; ``jupyter lab DIR/notebooks`` opens it. Grading stays with the
instructor (cohort grading, or nbgrader's exchange).
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
from pathlib import Path

import nbformat

from specdec.course.driver import assignments, source_notebook
from specdec.course.reference_calls import parse, parse_cell
from specdec.course.sandbox import PACKAGE, cut_references
from specdec.paths import DATA_DIR, NOTEBOOKS_DIR, REPO_ROOT

_HIDDEN_CHECK = ("{name} = __import__('specdec.checks.core', fromlist=['hidden_check']).hidden_check({name!r})"
                 "  # a hidden test: your instructor's\n")
_DRILL_CHECKS = ('"""Left out of the student edition: the drill questions\' answers are your instructor\'s."""\n\n'
                 + "".join(_HIDDEN_CHECK.format(name=name) for name in ("check_number", "check_choice")))
_NO_MISTAKES = '"""Left out of the student edition: the catalogue explains the hidden tests."""\n\nMISTAKES: list = []\n'
README = """# Speculative decoding: the student edition

Released notebooks: {released}.

```bash
python -m venv .venv && .venv/bin/pip install -e .
.venv/bin/jupyter lab notebooks
```

Each notebook runs top to bottom and checks your answers with its visible tests. The hidden tests are your
instructor's: submit your notebook as your course says, and the grade comes back with feedback. Until an
exercise's answers are released, the course's package has no answer to it: where the package itself uses that
function, it runs yours.
"""


def exercises(slug: str) -> set[str]:
    """The functions a notebook's answer cells define."""
    nb = nbformat.read(source_notebook(slug), as_version=4)
    return {node.name for cell in nb.cells if cell.get("metadata", {}).get("nbgrader", {}).get("solution")
            for node in (getattr(parse_cell(cell.source), "body", None) or []) if isinstance(node, ast.FunctionDef)}


def build(dest: Path, released: list[str], answers: list[str]) -> Path:
    """The student edition at ``dest`` (which must not exist): ``released`` notebooks, ``answers`` references."""
    slugs = assignments()
    unknown = sorted((set(released) | set(answers)) - set(slugs))
    if unknown:
        raise ValueError(f"no assignment {', '.join(unknown)} (the course has {', '.join(slugs)})")
    if dest.exists():
        raise FileExistsError(f"{dest} exists: the edition is built into a new folder")
    needs = needed_answers(released, answers)
    if needs:
        raise ValueError("; ".join(needs) + ": release those answers with it (--answers), or the notebook finds "
                         "only the stand-in it imports")
    package = dest / "solutions" / "specdec"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    withheld = set().union(*(exercises(slug) for slug in slugs if slug not in answers))
    kept = set().union(*(exercises(slug) for slug in answers)) if answers else set()
    cut_references(package, withheld - kept)
    for path in (package / "checks").glob("*.py"):
        _leave_out_checks(path)
    (package / "checks" / "drill.py").write_text(_DRILL_CHECKS)  # its table of answers is the drill's answer key
    for path in (package / "mistakes").glob("*.py"):
        if path.name not in ("__init__.py", "drill.py"):  # the drill's own explanations of its questions stay
            path.write_text(_NO_MISTAKES)
    shutil.copytree(DATA_DIR, dest / "data", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "notebooks").mkdir()
    for slug in released:
        shutil.copy(NOTEBOOKS_DIR / f"{slug}.ipynb", dest / "notebooks" / f"{slug}.ipynb")
    shutil.copy(REPO_ROOT / "pyproject.toml", dest / "pyproject.toml")
    (dest / "README.md").write_text(README.format(released=", ".join(released) or "none yet"))
    return dest


def needed_answers(released: list[str], answers: list[str]) -> list[str]:
    """For each released notebook whose answers are not: the earlier notebooks whose answers are not released either.
    A notebook builds on the ones before it, directly (notebook 04 imports notebook 03's residual_distribution) and
    through the package (notebook 04's engine calls notebook 02's greedy_verify_batched): with an earlier answer
    withheld, its cells would find a stand-in with nothing of the learner's behind it."""
    order = assignments()
    found = []
    for slug in released:
        if slug in answers:
            continue
        missing = [earlier for earlier in order[:order.index(slug)] if earlier not in answers]
        if missing:
            found.append(f"{slug} builds on {', '.join(missing)}, whose answers are not released")
        if slug in RUNS_ITS_OWN:
            found.append(f"{slug} runs the package's {RUNS_ITS_OWN[slug]} before the cell that asks for it")
    return found


#: Notebooks whose demos run one of their own exercises through the package before the learner has written it:
#: in the edition they need their own answers (so they suit self-study, not a graded release, until reordered).
RUNS_ITS_OWN = {"09_benchmark": "measured_costs (its first sweep)", "11_serving": "schedule_step (its engine demo)"}


def _leave_out_checks(path: Path) -> None:
    """Every top-level ``check_*`` function of a checks module replaced by a stub that says it is hidden."""
    lines = path.read_text().splitlines(keepends=True)
    hidden = [n for n in parse("".join(lines)).body if isinstance(n, ast.FunctionDef) and n.name.startswith("check_")]
    for node in sorted(hidden, key=lambda n: n.lineno, reverse=True):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        lines[first:node.end_lineno] = [_HIDDEN_CHECK.format(name=node.name)]
    path.write_text("".join(lines))


def _slugs(names: list[str]) -> list[str]:
    known = assignments()
    out = []
    for name in names:
        found = [s for s in known if s == name or s.split("_")[0] == name.zfill(2)]
        out.append(found[0] if found else name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the student edition of the course.")
    parser.add_argument("--out", type=Path, required=True, help="a new folder")
    parser.add_argument("--release", nargs="*", default=[], help="notebooks released to students (01 or 01_cost_ledger)")
    parser.add_argument("--answers", nargs="*", default=[],
                        help="notebooks whose answers are released: their references stay in the package")
    args = parser.parse_args(argv)
    try:
        build(args.out, _slugs(args.release), _slugs(args.answers))
    except (ValueError, FileExistsError) as err:
        print(f"edition: {err}", file=sys.stderr)
        return 2
    print(f"student edition in {args.out}: notebooks {', '.join(_slugs(args.release)) or 'none'}; answers of "
          f"{', '.join(_slugs(args.answers)) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
