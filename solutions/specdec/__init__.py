"""Speculative Decoding course: reference solutions, checks and course machinery.

Each module holds one idea; the notebooks in ``notebooks/`` import from here, so a
learner stuck on one notebook can still do the next.
"""

__version__ = "0.1.0"
