"""How many CPU threads the course's PyTorch uses, set once, deliberately.

The course's models are small (a few million parameters): splitting one of their matrix products
over threads saves little on a quiet machine, and on a busy one each thread waits for the others at
every operation, so a notebook slows down 15-20x when two other CPU-bound processes share two cores.
One thread per process keeps a busy machine's slowdown near its fair share of the cores.

Importing ``specdec`` applies it: to torch directly when torch is already imported, otherwise through
``OMP_NUM_THREADS``, which torch reads when it loads (and which the kernels ``make grade`` starts inherit).
``SPECDEC_THREADS=n`` chooses another count; an ``OMP_NUM_THREADS`` the user set is respected.
Benchmarks set their own count (``--threads``).
"""

from __future__ import annotations

import os
import sys

#: Threads per process for the course's small models (see the module docstring for why one).
COURSE_THREADS = 1


def course_threads() -> int:
    """The thread count in force: ``SPECDEC_THREADS``, else a user's ``OMP_NUM_THREADS``, else COURSE_THREADS."""
    for name in ("SPECDEC_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{name}={value!r}: it must be a whole number of threads >= 1")
            return int(value)
    return COURSE_THREADS


def use_course_threads() -> int:
    """Apply course_threads() to this process and to the processes it starts; returns the count."""
    threads = course_threads()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def all_cores() -> int:
    """The cores this process may run on (a benchmark's default thread count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
