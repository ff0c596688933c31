"""Every catalogued mistake, pasted into a notebook's solution, makes that exercise's
test cell (visible and hidden tests) fail, and the reference makes it pass.

The cells run in-process (no kernel): set-up and solution cells in order, then the
mistake replaces the function it targets, then the exercise's test cell.
"""

from __future__ import annotations

import ast
import contextlib
import io

import pytest

from conftest import nbgrader_meta, read, source_path
from specdec.mistakes import (
    analysis,
    chain,
    drafters,
    engine,
    greedy,
    kernels,
    ledger,
    lookup,
    pitfalls,
    rejection,
    serving,
    tree,
)

CATALOGUES = {
    "01_cost_ledger": ledger.MISTAKES,
    "02_greedy_verify": greedy.MISTAKES,
    "03_rejection_sampling": rejection.MISTAKES,
    "04_chain_verify": chain.MISTAKES,
    "05_kv_cache_engine": engine.MISTAKES,
    "06_prompt_lookup": lookup.MISTAKES,
    "07_tree_attention": tree.MISTAKES,
    "08_gpu_kernels": kernels.MISTAKES,
    "09_benchmark": analysis.MISTAKES,
    "10_pitfalls_interview": pitfalls.MISTAKES,
    "11_serving": serving.MISTAKES,
    "12_self_drafting": drafters.MISTAKES,
}


def _exercises(slug: str) -> dict[str, tuple[list[str], str]]:
    """function name -> (cells to run before its test, its test cell)."""
    prefix: list[str] = []
    pending: list[str] = []
    found = {}
    for cell in read(source_path(slug)).cells:
        meta = nbgrader_meta(cell)
        if cell.cell_type != "code" or not meta:
            continue
        if meta.get("grade"):
            for name in pending:
                found[name] = (list(prefix), cell.source)
            pending = []
        else:
            prefix.append(cell.source)
            if meta.get("solution"):
                pending += [n.name for n in ast.parse(cell.source).body if isinstance(n, ast.FunctionDef)]
    return found


def _run(cells: list[str], test: str, replace: dict | None = None) -> None:
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for source in cells:
            exec(compile(source, "<cell>", "exec"), namespace)
        namespace.update(replace or {})
        exec(compile(test, "<test cell>", "exec"), namespace)


CASES = [(slug, m) for slug, mistakes in CATALOGUES.items() for m in mistakes]


@pytest.mark.parametrize("slug", sorted(CATALOGUES))
def test_reference_passes_every_test_cell(slug):
    for name, (cells, test) in _exercises(slug).items():
        _run(cells, test)


@pytest.mark.parametrize("slug, mistake", CASES, ids=[f"{s}-{m.exercise}-{m.name}" for s, m in CASES])
def test_mistake_loses_the_points_of_its_exercise(slug, mistake):
    exercises = _exercises(slug)
    assert mistake.exercise in exercises, f"{mistake.exercise} is not an exercise of {slug}"
    cells, test = exercises[mistake.exercise]
    with pytest.raises(Exception):
        _run(cells, test, {mistake.exercise: mistake.fn})
