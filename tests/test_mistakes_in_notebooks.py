"""Every catalogued mistake, pasted into a notebook's solution, makes that exercise's
test cell (visible and hidden tests) fail, and the reference makes it pass.

The cells run in-process (no kernel): the set-up and solution cells before an exercise's test
cell run once, then for each mistake the mistake replaces the function it targets while the
test cell runs (the reference is put back afterwards).
"""

from __future__ import annotations

import ast
import contextlib
import functools
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
    production,
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
    "13_production": production.MISTAKES,
}


@functools.cache
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


_PREPARED: dict[tuple[str, str], tuple[dict, str]] = {}


def _prepared(slug: str, exercise: str) -> tuple[dict, str]:
    """The namespace after the cells before ``exercise``'s test cell ran (once per exercise), and that test cell."""
    if (slug, exercise) not in _PREPARED:
        cells, test = _exercises(slug)[exercise]
        namespace: dict = {}
        with contextlib.redirect_stdout(io.StringIO()):
            for source in cells:
                exec(compile(source, "<cell>", "exec"), namespace)
        _PREPARED[slug, exercise] = namespace, test
    return _PREPARED[slug, exercise]


def _run_test_cell(slug: str, exercise: str, replacement=None) -> None:
    """Run ``exercise``'s test cell, with ``replacement`` standing in for the function while it runs."""
    namespace, test = _prepared(slug, exercise)
    reference = namespace[exercise]
    if replacement is not None:
        namespace[exercise] = replacement  # the same globals the notebook's later functions see
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(test, "<test cell>", "exec"), namespace)
    finally:
        namespace[exercise] = reference


CASES = [(slug, m) for slug, mistakes in CATALOGUES.items() for m in mistakes]


@pytest.mark.parametrize("slug", sorted(CATALOGUES))
def test_reference_passes_every_test_cell(slug):
    for name in _exercises(slug):
        _run_test_cell(slug, name)


@pytest.mark.parametrize("slug, mistake", CASES, ids=[f"{s}-{m.exercise}-{m.name}" for s, m in CASES])
def test_mistake_loses_the_points_of_its_exercise(slug, mistake):
    assert mistake.exercise in _exercises(slug), f"{mistake.exercise} is not an exercise of {slug}"
    with pytest.raises(Exception):
        _run_test_cell(slug, mistake.exercise, mistake.fn)
