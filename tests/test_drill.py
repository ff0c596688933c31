"""The interview drills of notebooks 12, 13 and 14: each check accepts the answer (rounded as a person would write
it), rejects every catalogued wrong answer and names its slip, and the notebooks' test cells do the same."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import re

import pytest

from conftest import nbgrader_meta, read, source_path
from specdec.checks import CheckFailure, drill
from specdec.mistakes.drill import WRONG_ANSWERS, for_question

SLUGS = ("12_self_drafting", "13_production", "14_frontier", "15_parallel_state_drift")
NUMBERS = drill.numbers()
CHOICES = drill.choices()


def _rounded(x: float, digits: int = 3) -> float:
    """x to ``digits`` significant figures."""
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_number_accepts_the_answer_rounded(name):
    question = NUMBERS[name]
    drill.check_number({name: question.answer}, name)
    if question.rel:
        drill.check_number({name: _rounded(question.answer)}, name)
    else:
        assert question.answer == int(question.answer), f"{name}: a count must be a whole number"
        drill.check_number({name: int(question.answer)}, name)


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_number_rejects_what_is_not_a_number(name):
    for wrong in (None, True, str(NUMBERS[name].answer)):
        with pytest.raises(CheckFailure, match=name):
            drill.check_number({name: wrong}, name)
    with pytest.raises(CheckFailure, match="ANSWERS must be a dict"):
        drill.check_number([NUMBERS[name].answer], name)


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_number_has_two_catalogued_slips_and_a_derivation(name):
    wrong = [w.value for w in for_question(name)]
    assert len(wrong) >= 2, f"{name}: catalogue at least two typical wrong answers"
    assert all(isinstance(v, int | float) for v in wrong)
    assert re.search(r"\d", NUMBERS[name].why), f"{name}: the failure message should show the derivation"


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_choice_catalogues_every_wrong_letter(name):
    assert {w.value for w in for_question(name)} == {"a", "b", "c", "d"} - {CHOICES[name].answer}
    drill.check_choice({name: CHOICES[name].answer}, name)
    for wrong in ("B", None, 2):
        with pytest.raises(CheckFailure, match=name):
            drill.check_choice({name: wrong}, name)


def test_catalogue_names_only_drill_questions():
    unknown = {w.question for w in WRONG_ANSWERS} - set(NUMBERS) - set(CHOICES)
    assert not unknown, f"catalogued answers to unknown questions: {unknown}"


@pytest.mark.parametrize("wrong", WRONG_ANSWERS, ids=lambda w: f"{w.question}-{w.value}")
def test_check_rejects_the_catalogued_answer_and_names_its_slip(wrong):
    check = drill.check_number if wrong.question in NUMBERS else drill.check_choice
    with pytest.raises(CheckFailure) as failure:
        check({wrong.question: wrong.value}, wrong.question)
    message = str(failure.value)
    assert wrong.question in message and wrong.hint in message, message
    if wrong.question in NUMBERS:
        assert NUMBERS[wrong.question].why in message, message


# -- the notebooks' drill cells ---------------------------------------------------------------------------------


@functools.cache
def _drill_cells(slug: str) -> tuple[dict[str, str], dict[str, str]]:
    """(cells that set the drill up, by grade_id; test cells, by the question they grade)."""
    setup, tests = {}, {}
    for cell in read(source_path(slug)).cells:
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id", "")
        if cell.cell_type != "code" or not grade_id.startswith("drill_"):
            continue
        if meta.get("grade"):
            question = re.search(r'drill\.check_(?:number|choice)\((?:ANSWERS|CHOICES), "(\w+)"\)', cell.source)
            assert question, f"{slug}/{grade_id}: the hidden test should be one call to a drill check"
            tests[question.group(1)] = cell.source
        else:
            setup[grade_id] = cell.source
    return setup, tests


def _namespace(slug: str) -> dict:
    namespace: dict = {}
    setup, _ = _drill_cells(slug)
    for grade_id in ("drill_setup", "drill_numbers", "drill_choices"):
        exec(compile(setup[grade_id], grade_id, "exec"), namespace)
    return namespace


def _run(slug: str, question: str, namespace: dict) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(_drill_cells(slug)[1][question], f"test of {question}", "exec"), namespace)


@pytest.mark.parametrize("slug", SLUGS)
def test_notebook_grades_each_of_its_questions_once(slug):
    setup, tests = _drill_cells(slug)
    assert set(tests) == set(drill.numbers(slug)) | set(drill.choices(slug))
    namespace = _namespace(slug)
    assert set(namespace["ANSWERS"]) == set(drill.numbers(slug)) and set(namespace["CHOICES"]) == set(drill.choices(slug))
    for question in tests:
        _run(slug, question, namespace)  # the instructor's answers pass


@pytest.mark.parametrize("slug", SLUGS)
def test_notebook_test_cells_fail_on_the_skeleton(slug):
    blank: dict = {}
    setup, tests = _drill_cells(slug)
    for grade_id in ("drill_setup", "drill_numbers", "drill_choices"):
        exec(compile(setup[grade_id].split("### BEGIN SOLUTION")[0], grade_id, "exec"), blank)
    for question in tests:
        with pytest.raises(AssertionError):
            _run(slug, question, blank)


CASES = [(slug, w) for slug in SLUGS for w in WRONG_ANSWERS if w.question in _drill_cells(slug)[1]]


@pytest.mark.parametrize("slug, wrong", CASES, ids=[f"{s}-{w.question}-{w.value}" for s, w in CASES])
def test_catalogued_answer_loses_the_point_in_the_notebook(slug, wrong):
    namespace = _namespace(slug)
    answers = "ANSWERS" if wrong.question in NUMBERS else "CHOICES"
    namespace[answers] = {**namespace[answers], wrong.question: wrong.value}
    with pytest.raises(CheckFailure, match=wrong.question):
        _run(slug, wrong.question, namespace)
