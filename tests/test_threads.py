"""The course's thread policy (specdec.models.threads): one torch thread per process unless told otherwise."""

import os
import subprocess
import sys

import pytest

from specdec.models.threads import course_threads

PROBE = "import torch, specdec; print(torch.get_num_threads())"  # torch first: the policy must still apply


def _threads_after_import(**env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SPECDEC_THREADS")}
    return subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True)


@pytest.mark.parametrize(("env", "expected"), [({}, "1"), ({"OMP_NUM_THREADS": "2"}, "2")])
def test_importing_specdec_sets_the_course_thread_count(env, expected):
    assert _threads_after_import(**env).stdout.strip() == expected


def test_a_bad_thread_count_is_named(monkeypatch):
    monkeypatch.setenv("SPECDEC_THREADS", "two")
    with pytest.raises(ValueError, match="SPECDEC_THREADS='two'"):
        course_threads()
