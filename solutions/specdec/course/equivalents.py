"""The package's helpers that compute what an exercise asks for (found by running each exercise's check on every
public function of the package with as many required arguments; ``tests/test_equivalents.py`` finds them again and
fails when this table is out of date). An answer that calls one is flagged for review, and in the sandbox the helper
refuses to run inside the learner's function of that exercise (``specdec.course.withheld.watch``)."""

from __future__ import annotations

#: exercise -> the helpers ("module:function") that pass its check
EQUIVALENTS: dict[str, tuple[str, ...]] = {
    "bonus_token": ("specdec.sampling:sample", "specdec.sampling:sample_from_weights"),
}
