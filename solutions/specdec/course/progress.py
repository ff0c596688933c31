"""Which cell ``nbgrader autograde`` is running, shown while ``make grade`` waits.

nbgrader executes a notebook with nbclient, which calls ``on_cell_execute`` before each cell. The scratch
course's config points that hook at :func:`record_cell`, which appends a line to the file named by
``SPECDEC_PROGRESS_FILE``; :class:`CellWatch` reads the file from the grading process and prints.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

PROGRESS_ENV = "SPECDEC_PROGRESS_FILE"

#: Appended to the scratch course's nbgrader_config.py by ``make grade`` (never to grader/'s own).
HOOK_CONFIG = """
# make grade: report each cell as it starts (specdec.course.progress)
from specdec.course.progress import record_cell

c.Execute.on_cell_execute = record_cell
"""


def record_cell(cell, cell_index: int, **_) -> None:
    """nbclient's hook: one JSON line per cell started, to the file in $SPECDEC_PROGRESS_FILE (if set)."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"index": cell_index, "grade_id": grade_id, "time": time.time()}) + "\n")


class CellWatch:
    """While autograde runs: a live line on a terminal, else one line per cell that runs longer than
    ``slow_s`` seconds (repeated every ``repeat_s``). Use as a context manager around the autograde call."""

    def __init__(self, path: Path, label: str, n_cells: int, out: TextIO = sys.stdout, slow_s: float = 5.0,
                 repeat_s: float = 30.0, poll_s: float = 0.5):
        self.path, self.label, self.n_cells, self.out = path, label, n_cells, out
        self.slow_s, self.repeat_s, self.poll_s = slow_s, repeat_s, poll_s
        self.live = out.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CellWatch:
        self.path.write_text("")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.live:
            self.out.write("\r\033[K")
            self.out.flush()

    def current(self) -> tuple[int, str | None, float] | None:
        """(cell number from 1, its grade_id, when it started) of the cell running now, or None before the first."""
        lines = self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []
        if not lines:
            return None
        last = json.loads(lines[-1])
        return last["index"] + 1, last["grade_id"], last["time"]

    def describe(self, number: int, grade_id: str | None, seconds: float) -> str:
        name = f" ({grade_id})" if grade_id else ""
        return f"  {self.label}: cell {number} of {self.n_cells}{name}, {seconds:.0f} s"

    def _run(self) -> None:
        reported: dict[int, float] = {}  # cell number -> seconds at its last report
        while not self._stop.wait(self.poll_s):
            now = self.current()
            if now is None:
                continue
            number, grade_id, started = now
            seconds = time.time() - started
            if self.live:
                self.out.write("\r\033[K" + self.describe(number, grade_id, seconds))
                self.out.flush()
            elif seconds >= self.slow_s and seconds - reported.get(number, -self.repeat_s) >= self.repeat_s:
                reported[number] = seconds
                self.out.write(self.describe(number, grade_id, seconds) + " and still running\n")
                self.out.flush()
