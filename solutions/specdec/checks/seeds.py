"""The seeds the checks draw their hidden inputs from, salted by a secret of the grading run.

Every random input of a hidden test comes from a seed written in ``specdec.checks``, which every student can read:
with those seeds alone, a table of the hidden cases and their answers would score full marks. Cohort grading sets
``SPECDEC_CHECK_SALT`` to a secret drawn per run, in the grader's environment only (the learner's kernel never sees
it), and :func:`salted` mixes it into every seed, so the hidden inputs of one run are known to nobody. Without a salt
(self-grading, the test suite) every seed is the one written, and the checks are exactly reproducible.
"""

from __future__ import annotations

import hashlib
import os

SALT_VARIABLE = "SPECDEC_CHECK_SALT"


def salted(seed: int) -> int:
    """``seed`` itself when no salt is set; else a 62-bit seed drawn from the salt and ``seed`` together."""
    salt = os.environ.get(SALT_VARIABLE, "")
    if not salt:
        return seed
    digest = hashlib.blake2b(f"{salt}:{int(seed)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2
