"""Grading judges on the CPU on every machine: a GPU neither changes a verdict nor lets the trusted side of cohort
grading hand its sandbox (which has no GPU device) CUDA tensors; and a check that can only judge in Triton's
interpreter refuses a compiled kernel instead of passing it."""

from __future__ import annotations

import pytest
import torch

from specdec import kernels
from specdec.checks import kernels as checks
from specdec.checks.core import CheckFailure
from specdec.course import cohort, driver


def test_nbgrader_and_every_cohort_process_run_with_cuda_hidden(tmp_path):
    assert driver.nbgrader_env()["CUDA_VISIBLE_DEVICES"] == ""
    assert cohort._private_env(tmp_path)["CUDA_VISIBLE_DEVICES"] == ""


def test_the_one_pass_rule_is_not_passed_when_the_kernels_run_compiled(monkeypatch):
    monkeypatch.setattr(checks, "device", lambda: torch.device("cuda"))
    with pytest.raises(CheckFailure, match="only be counted in Triton's interpreter"):
        checks.expect_one_pass(kernels.race_kernel, "race_kernel", "race_kernel", lambda k, t: kernels.race(**t, kernel=k),
                               {"w": torch.rand(2, 8), "e": torch.rand(2, 8)})
