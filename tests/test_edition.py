"""The student edition (issue 52): no answer the instructor has not released, in source, bytecode or wheel, and the
released notebooks run in it with their visible tests passing on a correct answer."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from conftest import read, source_path
from specdec.course import edition

RELEASED = ["01_cost_ledger", "02_greedy_verify", "03_rejection_sampling", "04_chain_verify"]
ANSWERS = ["01_cost_ledger", "02_greedy_verify", "03_rejection_sampling"]  # 04 builds on them


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return edition.build(tmp_path_factory.mktemp("edition") / "course", RELEASED, ANSWERS)


def _references(slug: str) -> dict[str, frozenset[str]]:
    """exercise -> the body of its reference in this repository's package (the lines after the signature)."""
    import importlib
    import pkgutil

    import specdec

    names, found = edition.exercises(slug), {}
    for info in pkgutil.walk_packages(specdec.__path__, "specdec."):
        if info.name.startswith(("specdec.course", "specdec.checks", "specdec.mistakes")) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in names & set(vars(module)):
            fn = getattr(module, name)
            if getattr(fn, "__module__", None) == info.name and inspect.isfunction(getattr(fn, "fn", fn)):
                source = inspect.getsource(getattr(fn, "fn", fn))
                body = {line.strip() for line in source.split('"""')[-1].splitlines() if len(line.strip()) > 20}
                found[name] = frozenset(body)
    return found


def _holds(text: str, body: frozenset[str]) -> bool:
    """Every distinctive line of a reference's body is among the text's lines."""
    return bool(body) and body <= {line.strip() for line in text.splitlines()}


def _texts(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in root.rglob("*")
            if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".json", ".toml", ".txt")}


def test_the_edition_holds_no_answer_that_is_not_released(built, tmp_path):
    assert not list(built.rglob("*.pyc")) and not list(built.rglob("__pycache__"))
    assert not (built / "grader").exists() and not (built / "tests").exists()
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheel_dir), str(built)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheel_dir.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {name: archive.read(name).decode(errors="replace") for name in archive.namelist()}
    assert not [n for n in in_wheel if n.endswith(".pyc")]
    texts = {**_texts(built), **{f"wheel:{k}": v for k, v in in_wheel.items()}}
    withheld = 0
    for slug in ("04_chain_verify", "05_kv_cache_engine", "07_tree_attention", "14_frontier"):
        for name, body in _references(slug).items():
            leaks = [where for where, text in texts.items() if _holds(text, body)]
            assert not leaks, f"{slug}'s {name} is in the student edition: {leaks}"
            assert not [w for w, t in texts.items() if re.search(rf"^def {name}\(", t, re.M) and "specdec/" in w], name
            withheld += 1
    assert withheld >= 15
    kept = _references("01_cost_ledger")
    assert kept and all(any(_holds(text, body) for text in texts.values()) for body in kept.values()), \
        "released answers stay"
    checks = texts["solutions/specdec/checks/chain.py"]
    assert "def check_verify_chain(" not in checks and "hidden_check('check_verify_chain')" in checks
    assert "def expect_equal(" in texts["solutions/specdec/checks/core.py"], "the visible tests' helpers stay"
    assert "Mistake(" not in texts["solutions/specdec/mistakes/chain.py"]
    assert sorted(p.name for p in (built / "notebooks").iterdir()) == [f"{s}.ipynb" for s in RELEASED]


def test_a_notebook_whose_earlier_answers_are_withheld_is_refused_with_what_to_release(tmp_path):
    with pytest.raises(ValueError, match="04_chain_verify builds on 02_greedy_verify, 03_rejection_sampling"):
        edition.build(tmp_path / "x", ["04_chain_verify"], ["01_cost_ledger"])
    slugs = edition.assignments()
    assert [slug for i, slug in enumerate(slugs) if edition.needed_answers([slug], slugs[:i])] == list(
        edition.RUNS_ITS_OWN)
    with pytest.raises(ValueError, match=r"11_serving runs the package's schedule_step \(its engine demo\)"):
        edition.build(tmp_path / "y", slugs[:11], slugs[:10])
    assert edition.build(tmp_path / "z", slugs[:11], slugs[:11]).exists()  # with its own answers it is released


def test_a_wrong_or_unknown_request_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no assignment 99_nothing"):
        edition.build(tmp_path / "x", ["99_nothing"], [])
    (tmp_path / "y").mkdir()
    with pytest.raises(FileExistsError):
        edition.build(tmp_path / "y", RELEASED, [])


def _solved_without_hidden_tests(slug: str) -> nbformat.NotebookNode:
    nb = read(source_path(slug))
    for cell in nb.cells:
        cell.source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", cell.source, flags=re.S)
    return nb


#: Notebooks that run in the edition with their own answers withheld. Not 09 and 11: each runs the package's
#: engine on its own exercise before the exercise's cell (09's first sweep times forwards with measured_costs, 11's
#: engine demo schedules with schedule_step), so their answers must be released with them.
RUNS_WITHHELD = [slug for slug in edition.assignments() if slug not in ("09_benchmark", "11_serving")]


@pytest.mark.cohort
@pytest.mark.parametrize("slug", RUNS_WITHHELD)
def test_a_released_notebook_runs_in_the_edition_with_its_visible_tests(tmp_path, slug):
    """A correct answer in a released notebook, run top to bottom against the edition's package: every cell runs and
    the visible tests pass (its data, its visible helpers, the hidden checks' stand-ins), its own answers withheld
    and the earlier notebooks' released (the package's callers of its exercises run the learner's; the drill asks
    nothing whose answer is withheld)."""
    from nbclient import NotebookClient

    order = edition.assignments()
    built = edition.build(tmp_path / "course", order[:order.index(slug) + 1], order[:order.index(slug)])
    nb = _solved_without_hidden_tests(slug)
    env_setup = nbformat.v4.new_code_cell(f"import sys; sys.path.insert(0, {str(built / 'solutions')!r})\n"
                                          "import specdec; assert specdec.__file__.startswith("
                                          f"{str(built)!r}), specdec.__file__")
    nb.cells.insert(0, env_setup)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors[0]
