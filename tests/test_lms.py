"""Submissions from an LMS: a Blackboard archive through `nbgrader zip_collect` with the course's collector, into
the layout cohort grading reads, with each attempt's time exact (lateness) and a renamed notebook kept."""

from __future__ import annotations

import zipfile

import pytest

from conftest import read, student_path
from specdec.course import cohort, gradebook, lms
from specdec.course.driver import generate, make_course, run_nbgrader

SLUG = "01_cost_ledger"


def test_attempt_times_keep_their_minutes_and_zone():
    from nbgrader.utils import parse_utc

    assert str(parse_utc("2026-12-02-14-30-00")) == "2026-12-02 14:00:00"  # why the course has its own collector
    assert lms.attempt_time("2026-12-02-14-30-00") == "2026-12-02 14:30:00.000000 UTC"
    assert lms.attempt_time("2026-07-02-14-30-05", "Europe/London") == "2026-07-02 13:30:05.000000 UTC"  # BST
    with pytest.raises(ValueError, match="YYYY-MM-DD-HH-MM-SS"):
        lms.attempt_time("2026-12-02 14:30")


def test_a_blackboard_archive_lands_as_cohort_grading_reads_it(tmp_path):
    course = make_course(tmp_path / "course", [SLUG])
    generate(course, SLUG)
    blank = student_path(SLUG).read_bytes()
    archive = course / "downloaded" / SLUG / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / f"gradebook_SPECDEC_{SLUG}_2026-12-03-09-00-00.zip", "w") as z:
        for user, stamp, name in (("alice", "2026-12-01-11-59-00", f"{SLUG}.ipynb"),
                                  ("bob", "2026-12-02-14-30-00", f"{SLUG}-Copy1.ipynb"),
                                  ("carol", "2026-12-01-09-00-00", f"{SLUG}.ipynb"),
                                  ("carol", "2026-12-01-10-15-00", f"{SLUG}.ipynb")):  # two attempts: the later counts
            base = f"Cost ledger_{user}_attempt_{stamp}"
            z.writestr(f"{base}_{name}", blank)
            z.writestr(f"{base}.txt", f"Name: {user}\nDate Submitted: {stamp}\n")
    run_nbgrader(course, "zip_collect", SLUG, "--collector=specdec.course.lms.BlackboardCollector")
    submitted = course / "submitted"
    assert sorted(p.name for p in submitted.iterdir()) == ["alice", "bob", "carol"]
    assert gradebook.read_timestamp(submitted / "bob" / SLUG)[0] == "2026-12-02 14:30:00.000000 UTC"
    assert gradebook.read_timestamp(submitted / "carol" / SLUG)[0] == "2026-12-01 10:15:00.000000 UTC"
    subs, problems = cohort.find_submissions(submitted, [SLUG])
    assert problems == [] and [s.student for s in subs] == ["alice", "bob", "carol"]
    bob = subs[1]
    assert bob.timestamp == "2026-12-02 14:30:00.000000 UTC"
    assert bob.messages == [f"renamed: the folder's one notebook, {SLUG}-Copy1.ipynb, was graded as {SLUG}.ipynb"]
    assert read(bob.path).cells  # a notebook, read as cohort grading reads it


def test_a_time_zone_that_does_not_exist_is_refused_by_name():
    with pytest.raises(Exception, match="not an IANA time zone"):
        lms.BlackboardCollector(timezone="Mars/Olympus")
