"""nbgrader configuration for the course (this folder is the nbgrader course root).

Instructors run nbgrader here (``cd grader && nbgrader generate_assignment 01_cost_ledger``);
``make release`` and ``make grade`` run it in a scratch copy so this folder stays clean.
"""

c = get_config()  # noqa: F821 (injected by traitlets)

c.CourseDirectory.course_id = "speculative-decoding"

# Every notebook's kernelspec is "python3": the kernel of the Python that runs nbgrader
# (the course's .venv), so submissions are graded against the installed `specdec`.
c.Execute.kernel_name = "python3"

# Per-cell limit. The slowest cell of any notebook takes a few seconds on a 2-core CPU;
# 120 s leaves room for a loaded machine without letting a stuck cell hang a cohort run.
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True

# nbgrader scores a test cell 0 if it writes anything to stderr. The course's own cells
# are silent; these patterns drop the known harmless messages from outside the course
# that a correct answer could trigger, and nothing else. (Autograde only.)
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = (
    r"Matplotlib is building the font cache"
    r"|.*UserWarning: FigureCanvasAgg is non-interactive"
)

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
