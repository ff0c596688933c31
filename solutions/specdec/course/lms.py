"""Submissions from an LMS: Blackboard Learn's "Download Assignment" archive, read by ``nbgrader zip_collect``.

Blackboard names every file of an attempt ``<assignment>_<username>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file>`` (its
own ``.txt`` beside it holds the attempt's details), the layout nbgrader's documentation takes for its example.
That example's regular expression hands the time to nbgrader as ``2026-12-02-14-30-00``, which dateutil reads as
14:00 at an offset of -30 hours' worth of nothing useful: the minutes are lost (nbgrader.utils.parse_utc gives
2026-12-02 14:00:00). This collector reads the time field by field, in the time zone the LMS writes (Blackboard
uses its server's; ``c.BlackboardCollector.timezone``), and hands nbgrader an unambiguous UTC time, which
``zip_collect`` writes to each student's ``timestamp.txt``: the lateness cohort grading and nbgrader both use.

In ``grader/`` (or the hub's course folder)::

    mkdir -p downloaded/14_frontier/archive && cp gradebook_...zip downloaded/14_frontier/archive/
    nbgrader zip_collect 14_frontier --collector=specdec.course.lms.BlackboardCollector
"""

from __future__ import annotations

import datetime
import os
import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from nbgrader.plugins import FileNameCollectorPlugin
from traitlets import Unicode, default, validate

#: ``<assignment>_<username>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file>``: the username is the text before
#: ``_attempt_`` after the last underscore of the assignment's name part (Blackboard usernames hold no underscore
#: in this layout's reading; a course whose do should set its own named_regexp).
BLACKBOARD = (r".*_(?P<student_id>[^_/\\]+)_attempt_(?P<timestamp>\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)"
              r"_(?P<file_id>[^/\\]+)$")


class BlackboardCollector(FileNameCollectorPlugin):
    """nbgrader's file-name collector for Blackboard Learn's archive, with its attempt time read exactly."""

    timezone = Unicode("UTC", help="The time zone of the LMS's timestamps (an IANA name such as Europe/London)."
                       ).tag(config=True)

    @default("named_regexp")
    def _blackboard(self) -> str:
        return BLACKBOARD

    @validate("timezone")
    def _known_zone(self, proposal):
        try:
            ZoneInfo(proposal["value"])
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"BlackboardCollector.timezone {proposal['value']!r} is not an IANA time zone "
                             "(Europe/London, America/New_York, UTC)") from None
        return proposal["value"]

    def collect(self, submitted_file: str) -> dict | None:
        found = super().collect(os.path.basename(submitted_file))
        if found and found.get("timestamp"):
            found["timestamp"] = attempt_time(found["timestamp"], self.timezone)
        return found


def attempt_time(stamp: str, timezone: str = "UTC") -> str:
    """Blackboard's ``YYYY-MM-DD-HH-MM-SS`` in ``timezone`` -> the same instant as nbgrader's UTC text."""
    fields = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)-(\d\d)-(\d\d)-(\d\d)", stamp)
    if fields is None:
        raise ValueError(f"{stamp!r} is not Blackboard's YYYY-MM-DD-HH-MM-SS")
    local = datetime.datetime(*map(int, fields.groups()), tzinfo=ZoneInfo(timezone))
    return local.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
