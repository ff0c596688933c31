"""Every catalogued mistake, pasted into a notebook's solution, makes that exercise's
test cell (visible and hidden tests) fail with a readable message that names the exercise (and, where the
check is exact, the mistake's own hint), and the reference makes it pass. Each mistake is checked once, here:
the hidden part of a test cell is the exercise's check (tests/test_checks.py runs the checks' other behaviour).

The cells run without a Jupyter kernel, in one subprocess on the background lane's core (a background job, like
nbgrader's round trip): the set-up and solution cells before an exercise's test cell run once, then for each
mistake the mistake replaces the function it targets while the test cell runs (the reference is put back
afterwards). The job records each run's outcome; the tests below judge them.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from conftest import background_job, background_result, nbgrader_meta, read, selected_nodeids, source_path
from specdec.checks import CheckFailure
from specdec.mistakes import (
    analysis,
    chain,
    drafters,
    engine,
    frontier,
    greedy,
    kernels,
    ledger,
    lookup,
    pitfalls,
    production,
    questions2026,
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
    "14_frontier": frontier.MISTAKES,
    "15_parallel_state_drift": questions2026.MISTAKES,
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


def _named(fn, name: str):
    """``fn`` under the exercise's name, as a learner's function has it (the visible tests look its hints up by
    name); a Triton kernel is passed as it is."""
    if not isinstance(fn, types.FunctionType):
        return fn

    @functools.wraps(fn)
    def named(*args, **kwargs):
        return fn(*args, **kwargs)

    named.__name__ = named.__qualname__ = name
    return named


def _run_test_cell(slug: str, exercise: str, replacement=None) -> None:
    """Run ``exercise``'s test cell, with ``replacement`` standing in for the function while it runs."""
    namespace, test = _prepared(slug, exercise)
    reference = namespace[exercise]
    if replacement is not None:
        namespace[exercise] = _named(replacement, exercise)  # the same globals the notebook's later functions see
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(test, "<test cell>", "exec"), namespace)
    finally:
        namespace[exercise] = reference


pytestmark = pytest.mark.pipeline  # they wait for the background job: after the in-process tests

CASES = [(slug, m) for slug, mistakes in CATALOGUES.items() for m in mistakes]
CASE_IDS = [f"{s}-{m.exercise}-{m.name}" for s, m in CASES]


def outcome(slug: str, exercise: str, replacement=None) -> tuple[str, str]:
    """(the exception's type name, or "" when the test cell passed; its message)."""
    try:
        _run_test_cell(slug, exercise, replacement)
    except Exception as error:  # noqa: BLE001 (any failure is an outcome, judged by the tests)
        return type(error).__name__, str(error)
    return "", ""


def hint_to_find(mistake) -> str | None:
    """The words a failure must show for this mistake: its hint where the check is exact, "Python loop" for a loop."""
    if mistake.name == "python_loop":
        return "Python loop"
    return None if mistake.exercise in NOT_EXACT else mistake.hint


def run_cells(wanted: set[str]) -> dict[str, tuple[str, str, str]]:
    """The outcome of every wanted run: "reference-<slug>-<exercise>" and "<slug>-<exercise>-<mistake>", as (kind,
    message, the check's own message). The check (the test cell's hidden part) is run by itself only for a mistake
    whose cell failed before reaching it without naming the mistake: a visible test failed first."""
    import torch

    from test_checks import RUN_CHECK

    torch.set_num_threads(1)
    results = {}
    for slug in sorted(CATALOGUES):
        if f"reference-{slug}" in wanted:
            for name in _exercises(slug):
                results[f"reference-{slug}-{name}"] = (*outcome(slug, name), "")
    for case, (slug, mistake) in zip(CASE_IDS, CASES):
        if case in wanted:
            kind, message = outcome(slug, mistake.exercise, mistake.fn)
            check = ""
            words = hint_to_find(mistake)
            if kind and words and words not in message and "raised" not in message and "NaN" not in message:
                try:
                    RUN_CHECK[mistake.exercise][1](mistake.fn)
                except CheckFailure as failure:
                    check = str(failure)
            results[case] = (kind, message, check)
    return results


@background_job("mistake_cells", lane="cells")  # beside nbgrader's jobs: 3 processes, 2 cores
def _mistake_cells(scratch: Path) -> dict[str, tuple[str, str, str]]:
    """The selected tests' runs, in a subprocess of this file (see ``__main__`` below)."""
    wanted = {node.split("[", 1)[1][:-1] for node in selected_nodeids() if Path(__file__).name in node and "[" in node}
    wanted = {w if w in CASE_IDS else f"reference-{w}" for w in wanted}
    (scratch / "wanted.json").write_text(json.dumps(sorted(wanted)))
    proc = subprocess.run([sys.executable, __file__, str(scratch / "wanted.json"), str(scratch / "outcomes.json")],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"the cell runs stopped (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return {case: tuple(result) for case, result in json.loads((scratch / "outcomes.json").read_text()).items()}


@pytest.fixture(scope="module")
def cells() -> dict[str, tuple[str, str, str]]:
    return background_result("mistake_cells")


@pytest.mark.parametrize("slug", sorted(CATALOGUES))
def test_reference_passes_every_test_cell(cells, slug):
    failures = {case: result for case, result in cells.items() if case.startswith(f"reference-{slug}-") and result[0]}
    assert not failures, failures
    assert {f"reference-{slug}-{name}" for name in _exercises(slug)} <= set(cells)


# Exercises whose check is exact (not Monte Carlo): a matching mistake must be named by its own hint.
NOT_EXACT = {
    # notebooks 03-04: sampling checks (seeded Monte Carlo)
    "verify_token", "verify_chain", "verify_chain_batched", "speculative_round",
    # notebooks 05-06: the checks replay recorded forwards and explain in their own words
    "target_only_generate", "propose", "rollback", "speculative_generate", "propose_ngram", "find_match_vectorised",
    "lookup_generate", "verify_tree_sampling", "compact_cache", "generate_until_stop",
    # notebook 10: sampling checks (seeded Monte Carlo), host syncs and recorded forwards
    "draft_propose", "accepted_counts", "correction_token", "bonus_token", "verify_logits",
    # notebook 13: a sampling check (seeded Monte Carlo) after the greedy cases
    "constrained_round",
    # notebook 14: a sampling check (seeded Monte Carlo against the enumerated law)
    "block_verify",
    # notebook 15: the checks say what went wrong in their own words (the cache's length, q's shape, the forwards
    # counted, the first token that differs from target-only decoding), then seeded Monte Carlo
    "parallel_propose", "hybrid_speculative_generate"}


@pytest.mark.parametrize("slug, mistake", CASES, ids=CASE_IDS)
def test_mistake_loses_the_points_of_its_exercise(cells, slug, mistake):
    assert mistake.exercise in _exercises(slug), f"{mistake.exercise} is not an exercise of {slug}"
    kind, message, check = cells[f"{slug}-{mistake.exercise}-{mistake.name}"]
    assert kind, "the test cell passed"
    assert message.strip(), f"the test cell raised {kind} with no message: a learner would not know what is wrong"
    words = hint_to_find(mistake)
    # a crash or a NaN is named as such (the check says where), not by the hint
    if words and not any(w in text for w in ("raised", "NaN") for text in (message, check)):
        assert words in message or words in check, (
            f"expected the hint of {mistake.name}, got: {message}" + (f" (and from the check: {check})" if check else ""))


if __name__ == "__main__":  # the background job's subprocess: python this_file wanted.json outcomes.json
    Path(sys.argv[2]).write_text(json.dumps(run_cells(set(json.loads(Path(sys.argv[1]).read_text())))))
