"""Model answers for self-study: after ``make grade``, each written answer the learner attempted is shown
beside the course's model answer and rubric (the solution region of the instructor notebook's cell).

Only self-grading shows them (``make grade``; ``MODEL_ANSWERS=no`` turns it off, for an instructor grading a
learner's machine); cohort grading never does.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

import nbformat

from specdec.course.driver import source_notebook

#: What nbgrader leaves in a written answer cell of the student notebook (grader/nbgrader_config.py).
SKELETON = "YOUR ANSWER HERE"


@dataclass(frozen=True)
class WrittenAnswer:
    grade_id: str
    question: str  # the bold first line of the markdown cell above
    answer: str  # the learner's
    model_answer: str  # the model answer and rubric, from the instructor notebook


def _solution_region(source: str) -> str:
    match = re.search(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S)
    return (match.group(1) if match else source).strip()


def _question(markdown: str) -> str:
    first = next((line for line in markdown.splitlines() if line.strip()), "")
    return first.replace("**", "").strip()


def attempted(answer: str) -> bool:
    """True once the learner has written something other than the skeleton."""
    return answer.strip() not in ("", SKELETON)


def written_answers(slug: str, submission: nbformat.NotebookNode) -> list[WrittenAnswer]:
    """The written answers of ``submission`` that are attempted, in the course's order, with their model answers."""
    source = nbformat.read(source_notebook(slug), as_version=4)
    models, questions = {}, {}
    for above, cell in zip([None, *source.cells], source.cells):
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and meta.get("solution") and cell.cell_type == "markdown":
            models[meta["grade_id"]] = _solution_region(cell.source)
            questions[meta["grade_id"]] = _question(above.source) if above is not None else meta["grade_id"]
    found = []
    for cell in submission.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in models and attempted(cell.source):
            found.append(WrittenAnswer(grade_id, questions[grade_id], cell.source.strip(), models[grade_id]))
    return found


def format_model_answers(slug: str, answers: list[WrittenAnswer], width: int = 110) -> str:
    """Each attempted answer, then the model answer and rubric, for the learner to mark their own."""
    blocks = [f"== {slug}: your written answers beside the model answers (mark them yourself with the rubric) =="]
    for item in answers:
        yours = textwrap.indent(textwrap.fill(" ".join(item.answer.split()), width - 4), "    ")
        model = "\n".join(textwrap.indent(textwrap.fill(" ".join(par.split()), width - 4), "    ")
                          for par in item.model_answer.split("\n\n"))
        blocks.append(f"\n{item.question}\n  yours:\n{yours}\n  model answer and rubric:\n{model}")
    return "\n".join(blocks)
