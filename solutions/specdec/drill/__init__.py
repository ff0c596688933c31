"""Self-study drill: interview questions with fresh numbers every time (``python -m specdec.drill``).

Each question template (``templates_*.py``, one module per group of notebooks) draws its parameters from a seed
and computes its answer with the package's own functions, so the drill and the notebooks cannot disagree. A
question's id (``"<template>:<seed>"``) rebuilds it, which is how ``--check`` grades a file of answers.

- :mod:`~specdec.drill.questions`: question types, tolerances, the template registry, ids;
- :mod:`~specdec.drill.session`: choosing questions by topic and seed, the mock interview, the report;
- :mod:`~specdec.drill.written`: written questions with model answers and rubrics, read from the instructor notebooks;
- :mod:`~specdec.drill.cli`: the terminal drill, the mock interview, JSON out and ``--check``;
- :mod:`~specdec.drill.widget`: the same drill in a notebook (``drill_widget()``, ``mock_interview_widget()``).
"""

from __future__ import annotations

from specdec.drill import (  # noqa: F401  (importing a template module registers its templates)
    templates_acceptance,
    templates_drafters,
    templates_frontier,
    templates_kernels,
    templates_kv,
    templates_ledger,
    templates_parallel_state,
    templates_pitfalls,
    templates_production,
    templates_serving,
    templates_tree,
    templates_verify,
)
from specdec.drill.questions import REGISTRY, build_question
from specdec.drill.session import draw_questions, mock_interview


def drill_widget(topic: str | None = None, seed: int | None = None, count: int = 5):
    """A drill in a notebook: one question at a time, a Check button, the derivation, a running score."""
    from specdec.drill.widget import drill_widget as build

    return build(topic=topic, seed=seed, count=count)


def mock_interview_widget(seed: int | None = None, count: int = 8):
    """A timed mock interview in a notebook: numbers, choices and written answers, then a report."""
    from specdec.drill.widget import mock_interview_widget as build

    return build(seed=seed, count=count)


__all__ = ["REGISTRY", "build_question", "draw_questions", "drill_widget", "mock_interview", "mock_interview_widget"]
