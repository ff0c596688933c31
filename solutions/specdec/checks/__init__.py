"""Checks that judge a learner's function: the hidden tests call these.

Every check raises :class:`CheckFailure` (an ``AssertionError``) with a message that
says what was expected, on which input, and the likely mistake. Nothing here prints
to stderr, so a passing check never costs points in nbgrader.
"""

from specdec.checks.core import CheckFailure, expect_close, expect_equal

__all__ = ["CheckFailure", "expect_close", "expect_equal"]
