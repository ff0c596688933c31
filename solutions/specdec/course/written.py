"""Model answers for self-study: after ``make grade``, each written answer the learner attempted is shown
beside the course's model answer and rubric (read from the instructor notebook by
:mod:`specdec.drill.written`, the one parser of written questions).

Only self-grading shows them (``make grade``; ``MODEL_ANSWERS=no`` turns it off, for an instructor grading a
learner's machine); cohort grading never does.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import nbformat

from specdec.course.driver import source_notebook
from specdec.drill.written import Written, read_notebook

#: What nbgrader leaves in a written answer cell of the student notebook (grader/nbgrader_config.py).
SKELETON = "YOUR ANSWER HERE"


@dataclass(frozen=True)
class WrittenAnswer:
    question: Written  # the question, its model answer, rubric and where to revise
    answer: str  # the learner's


def attempted(answer: str) -> bool:
    """True once the learner has written something other than the skeleton."""
    return answer.strip() not in ("", SKELETON)


def written_answers(slug: str, submission: nbformat.NotebookNode) -> list[WrittenAnswer]:
    """The written answers of ``submission`` that are attempted, in the course's order."""
    questions = {q.id: q for q in read_notebook(source_notebook(slug))}
    return [WrittenAnswer(questions[grade_id], cell.source.strip()) for cell in submission.cells
            if (grade_id := cell.metadata.get("nbgrader", {}).get("grade_id")) in questions and attempted(cell.source)]


def format_model_answers(slug: str, answers: list[WrittenAnswer], width: int = 110) -> str:
    """Each attempted answer, then the model answer and the rubric, for the learner to mark their own."""

    def block(text: str, indent: str = "    ", then: str = "    ") -> str:
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=then)

    lines = [f"== {slug}: your written answers beside the model answers (mark them yourself with the rubric) =="]
    for item in answers:
        q = item.question
        lines += ["", f"{q.prompt} ({q.points:g} point{'s' if q.points != 1 else ''})", "  yours:", block(item.answer),
                  "  model answer:", block(q.model_answer), "  rubric:"]
        lines += [block(point, "    - ", "      ") for point in q.rubric_points]
        lines.append(f"  revise: notebooks/{q.section.notebook}.ipynb, section \"{q.section.title}\"")
    return "\n".join(lines)
