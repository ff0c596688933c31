"""The checks accept the reference, reject every catalogued mistake, and say why."""

from __future__ import annotations

import pytest

from specdec import ledger
from specdec.checks import CheckFailure
from specdec.checks import ledger as ledger_checks
from specdec.mistakes import ledger as ledger_mistakes

# exercise name -> how to run its check on one implementation of that function
RUN_CHECK = {
    "count_params": ledger_checks.check_count_params,
    "decode_step_floor_s": lambda fn: ledger_checks.check_decode_floor(fn, ledger.tokens_per_s_cap),
    "tokens_per_s_cap": lambda fn: ledger_checks.check_decode_floor(ledger.decode_step_floor_s, fn),
    "kv_bytes_per_token": ledger_checks.check_kv_bytes_per_token,
    "expected_tokens_per_round": ledger_checks.check_expected_tokens_per_round,
    "speedup": ledger_checks.check_speedup,
    "best_gamma": ledger_checks.check_best_gamma,
    "roofline_step_time_s": ledger_checks.check_roofline_step_time_s,
}
MISTAKES = ledger_mistakes.MISTAKES


@pytest.mark.parametrize("exercise", sorted(RUN_CHECK))
def test_reference_passes(exercise):
    RUN_CHECK[exercise](getattr(ledger, exercise))


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: f"{m.exercise}-{m.name}")
def test_every_catalogued_mistake_fails_its_check(mistake):
    with pytest.raises(CheckFailure) as failure:
        RUN_CHECK[mistake.exercise](mistake.fn)
    message = str(failure.value)
    assert mistake.exercise in message or "raised" in message, message


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: f"{m.exercise}-{m.name}")
def test_failure_message_names_the_likely_mistake(mistake):
    """When a wrong answer reproduces a catalogued mistake, the learner reads its hint."""
    with pytest.raises(CheckFailure) as failure:
        RUN_CHECK[mistake.exercise](mistake.fn)
    message = str(failure.value)
    if "raised" not in message:  # a crash is reported as such, with the input
        assert "expected" in message and "got" in message, message
        assert any(m.hint in message for m in ledger_mistakes.for_exercise(mistake.exercise)), message


@pytest.mark.parametrize("exercise", sorted(RUN_CHECK))
def test_every_exercise_has_mistakes(exercise):
    assert ledger_mistakes.for_exercise(exercise), f"no catalogued mistake for {exercise}"


@pytest.mark.parametrize("exercise", sorted(RUN_CHECK))
def test_skeleton_fails_with_not_implemented_message(exercise):
    def skeleton(*args):
        raise NotImplementedError()

    skeleton.__name__ = exercise
    with pytest.raises(CheckFailure, match="not implemented yet"):
        RUN_CHECK[exercise](skeleton)


def test_wrong_type_is_reported():
    with pytest.raises(CheckFailure, match="return an int"):
        ledger_checks.check_count_params(lambda cfg: float(ledger.count_params(cfg)))
    with pytest.raises(CheckFailure, match="expected 1, got None"):
        ledger_checks.check_best_gamma(lambda a, c, max_gamma=32: None)


def test_message_shows_the_input():
    def off_by_one(cfg):
        return ledger.count_params(cfg) + 1

    with pytest.raises(CheckFailure, match=r"count_params\(llama-2-7b: vocab 32000, d_model 4096.*expected 6,738,415,616, got 6,738,415,617"):
        ledger_checks.check_count_params(off_by_one)
