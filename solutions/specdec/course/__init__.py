"""Course machinery around nbgrader: what ``make release``, ``make grade`` and cohort grading run.

- :mod:`~specdec.course.driver`: scratch course folders, ``generate_assignment``, autograde, the gradebook;
- :mod:`~specdec.course.release`: ``make release``, the student notebooks from ``grader/source``;
- :mod:`~specdec.course.grading`: ``make grade``, a learner grading their own notebooks;
- :mod:`~specdec.course.cohort`: ``make grade-cohort``, an instructor grading many submissions in parallel.
"""
