"""The suite's own shape: each lane's CPU time, recorded by this run, against tests/budget.json.

`make test` has two lanes on two cores: the in-process tests, and the background jobs (nbgrader's round trip and the
other pipeline work) beside them. CPU time, not wall time, is compared, so a busy machine does not make this fail;
a lane that grows past its budget by more than half does. After a deliberate change, rewrite the budget with
`make test PYTEST_ARGS=--write-budget` (whole suite, passing run).
"""

from __future__ import annotations

import json

import pytest

from conftest import BUDGET_FILE, lane_cpu, slowest, wait_for_background_jobs

GROWTH = 1.5  # a lane may take up to half again its budget


@pytest.mark.budget
def test_each_lane_stays_within_its_budget(request):
    if not request.config.whole_suite:
        pytest.skip("only a run of the whole suite is compared with its budget")
    wait_for_background_jobs()
    budget = json.loads(BUDGET_FILE.read_text())
    lanes = lane_cpu()
    table = "\n".join(f"  {cpu:7.1f} s  {name}" for name, cpu in slowest(20))
    over = [f"{lane} {cpu:.0f} s of CPU (budget {budget['lanes'][lane]} s)" for lane, cpu in lanes.items()
            if cpu > GROWTH * budget["lanes"][lane]]
    assert not over, (f"the suite grew past its budget by more than half: {'; '.join(over)}. The slowest 20 tests "
                      f"and background jobs (CPU seconds):\n{table}")
    tests = len(request.session.items)
    assert tests >= budget["tests"], (f"{budget['tests'] - tests} fewer tests than {BUDGET_FILE.name} records: a test "
                                      "was dropped (if on purpose, rewrite the budget with PYTEST_ARGS=--write-budget)")
