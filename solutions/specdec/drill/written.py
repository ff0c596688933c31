"""Written interview questions, with their model answers and rubrics, read from the instructor notebooks.

The course keeps one copy of each: the written-answer cells of notebooks 10, 12, 13, 14 and 15 in ``grader/source/``
(an nbgrader cell with ``grade: true, solution: true`` whose text holds "**Model answer.**" and "**Rubric
(N point).**"; the question is the markdown cell just above it). This module parses them, so an edit to a notebook
shows up in the drill, and adds where to revise each one.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from specdec.drill.questions import Section
from specdec.paths import SOURCE_DIR

#: Where to revise each written question (by its nbgrader grade_id); others point at the drill that holds them.
REVISE = {
    "written_lossless": Section("03_rejection_sampling", "2. Why the output is exactly `p`"),
    "written_when_not": Section("01_cost_ledger", "7. When it stops paying: batching"),
    "written_gamma": Section("01_cost_ledger", "6. Choosing the draft length"),
    "written_kv_cache": Section("05_kv_cache_engine", "4. The rollback"),
    "written_proposers": Section("12_self_drafting", "1. What each drafter reads"),
    "written_params": Section("04_chain_verify", "6. A whole round at a temperature"),
    "written_batching": Section("11_serving", "4. Committing a ragged round, with stops inside the drafts"),
    "written_self_drafters": Section("12_self_drafting", "3. EAGLE: drafting features, with the token shifted by one"),
    "written_small_draft": Section("05_kv_cache_engine", "8. Choosing a draft"),
    "written_production_features": Section("13_production", "1. Prefix caching with speculation"),
    "written_agent_drafting": Section("13_production", "3. Suffix decoding"),
    "written_moe_long_context": Section("14_frontier", "1. MoE targets: verification reads the union of experts"),
    "written_ranks_rollouts": Section("14_frontier", "5. Ranks, rollouts and disaggregation"),
    "written_parallel_hybrid": Section("15_parallel_state_drift", "2. Targets with state: rolling back a recurrent layer"),
    "written_rl_drafter": Section("15_parallel_state_drift", "3. A drafter across its target's life"),
}


@dataclass(frozen=True)
class Written:
    """A written question: the learner types an answer, then sees the model answer and the rubric."""

    id: str  # the notebook cell's grade_id
    prompt: str
    model_answer: str
    rubric: str
    points: float
    section: Section  # where to revise

    kind = "written"

    @property
    def rubric_points(self) -> list[str]:
        """The rubric split into its items ("0.5: ...; 0.5: ..." becomes two)."""
        parts = re.split(r";\s+(?=\d(?:\.\d+)?:)|(?<=\.)\s+(?=\d(?:\.\d+)?:)", self.rubric)
        return [p.strip() for p in parts if p.strip()]


def _text(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _parse_answer(text: str) -> tuple[str, str, float] | None:
    text = text.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", "")
    match = re.search(r"\*\*Model answer\.\*\*(.*?)\*\*Rubric \(([\d.]+) points?\)\.\*\*(.*)", text, re.S)
    if not match:
        return None
    return _flat(match.group(1)), _flat(match.group(3)), float(match.group(2))


def _parse_prompt(text: str) -> str:
    text = _flat(text)
    return re.sub(r"^\*\*\d+\.\s*(.*?)\*\*", r"\1", text).replace("**", "").strip()


def read_notebook(path: Path) -> list[Written]:
    """The written questions of one instructor notebook, in order."""
    cells = json.loads(path.read_text())["cells"]
    notebook = path.stem
    heading = ""
    found = []
    for i, cell in enumerate(cells):
        text = _text(cell)
        if cell["cell_type"] != "markdown":
            continue
        for line in text.splitlines():
            if line.startswith("## "):
                heading = line[3:].strip()
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not (meta.get("grade") and meta.get("solution")) or i == 0:
            continue
        parsed = _parse_answer(text)
        if parsed is None:
            continue
        model_answer, rubric, points = parsed
        grade_id = meta.get("grade_id", f"{notebook}_{i}")
        section = REVISE.get(grade_id, Section(notebook, heading))
        found.append(Written(grade_id, _parse_prompt(_text(cells[i - 1])), model_answer, rubric, points, section))
    return found


@functools.cache
def written_questions(source_dir: Path = SOURCE_DIR) -> tuple[Written, ...]:
    """Every written question of the instructor notebooks (empty when ``grader/source`` is not there)."""
    found: list[Written] = []
    for path in sorted(source_dir.glob("*/*.ipynb")):
        found += read_notebook(path)
    return tuple(found)
