"""A drill session: which questions to ask (by topic, seed and count), the mock interview's mix, and the report.

The terminal drill and the notebook widget both use this module, so they ask the same questions for the same seed
and grade them the same way.
"""

from __future__ import annotations

import random
import sys
import types
from dataclasses import dataclass

from specdec.drill.questions import NOTEBOOKS, REGISTRY, TOPICS, DrillInputError, Question, Section, Template
from specdec.drill.written import Written, written_questions

#: A mock interview's time budget per question, in seconds (the report flags questions that ran over).
BUDGET_S = {"number": 120, "choice": 60, "written": 300}

Item = Question | Written


def _withheld(template: Template) -> bool:
    """True when the template's answer comes from an exercise whose reference this package does not hold (a student
    edition before that notebook's answers are released, or a grading sandbox): its module, or a course module it
    imports whole, holds a stand-in (specdec.course.withheld)."""
    module = sys.modules.get(template.draw.__module__)
    if module is None:
        return False
    used = [module] + [v for v in vars(module).values()  # and the course's modules it imports whole
                       if isinstance(v, types.ModuleType) and v.__name__.startswith("specdec.")]
    return any(getattr(value, "__withheld__", False) is True for m in used for value in vars(m).values())


def templates(topic: str | None = None) -> list[Template]:
    """The templates of a topic (``ledger``, ``kv`` ...), of a notebook (``01``, ``1`` or ``01_cost_ledger``), or all."""
    every = sorted((t for t in REGISTRY.values() if not _withheld(t)), key=lambda t: (t.section.notebook, t.name))
    if topic is None or topic == "all":
        return every
    key = topic.strip().lower()
    if key.isdigit() and f"{int(key):02d}" in NOTEBOOKS:
        key = NOTEBOOKS[f"{int(key):02d}"]
    chosen = [t for t in every if key in (t.topic, t.section.notebook)]
    if not chosen:
        raise DrillInputError(f"unknown topic {topic!r}: choose one of {', '.join(TOPICS)}, or a notebook number "
                              f"(01-14) that has questions")
    return chosen


def fresh_seed() -> int:
    """A seed for a session the learner did not seed (shown, so the session can be replayed)."""
    return random.SystemRandom().randrange(1, 10**6)


def draw_questions(seed: int, count: int, topic: str | None = None, kinds: tuple[str, ...] = ("number", "choice"),
                   ) -> list[Question]:
    """``count`` questions for ``seed``: the templates in a seeded order, each once before any repeats."""
    if count < 1:
        raise DrillInputError(f"count must be at least 1, got {count}")
    pool = [t for t in templates(topic) if t.kind in kinds]
    if not pool:
        raise DrillInputError(f"no {' or '.join(kinds)} questions for topic {topic!r}")
    rng = random.Random(seed)
    order: list[Template] = []
    while len(order) < count:
        batch = list(pool)
        rng.shuffle(batch)
        order += batch
    return [t.question(rng.randrange(1, 10**9)) for t in order[:count]]


def mock_interview(seed: int, count: int = 10) -> list[Item]:
    """A mixed set: 2 written questions (3 from 12 items on), a quarter choices, the rest numbers, in a seeded order
    with the written ones spread out (the last one last)."""
    if count < 4:
        raise DrillInputError(f"a mock interview needs at least 4 questions, got {count}")
    rng = random.Random(seed)
    written = list(written_questions())
    n_written = min(len(written), 3 if count >= 12 else 2)
    n_choice = max(1, count // 4)
    asked: list[Item] = draw_questions(rng.randrange(10**9), count - n_written - n_choice, kinds=("number",))
    asked += draw_questions(rng.randrange(10**9), n_choice, kinds=("choice",))
    rng.shuffle(asked)
    for i, question in enumerate(rng.sample(written, n_written)):
        at = len(asked) if i == n_written - 1 else (i + 1) * len(asked) // n_written
        asked.insert(at, question)
    return asked


@dataclass
class Attempt:
    """One answered item: the score it earned (0 to 1), the time it took, and what the learner gave."""

    item: Item
    score: float
    seconds: float
    given: str = ""

    @property
    def over_budget(self) -> bool:
        return self.seconds > BUDGET_S[self.item.kind]


def revision_list(attempts: list[Attempt]) -> list[Section]:
    """The sections behind every item not fully right or answered over its time budget (an interview is timed: a
    slow right answer still needs practice), once each, in course order."""
    sections = {a.item.section for a in attempts if a.score < 1 or a.over_budget}
    return sorted(sections, key=lambda s: (s.notebook, s.title))


def report(attempts: list[Attempt]) -> list[str]:
    """The end-of-session report: score, time per question, and what to revise with links."""
    total = sum(a.score for a in attempts)
    lines = [f"Score: {total:g} / {len(attempts)}   time: {sum(a.seconds for a in attempts) / 60:.1f} min"]
    for i, a in enumerate(attempts, 1):
        verdict = "right" if a.score == 1 else "wrong" if a.score == 0 else f"{a.score:g}"
        over = f"  (over the {BUDGET_S[a.item.kind] // 60} min budget)" if a.over_budget else ""
        lines.append(f"  {i:2d}. {a.item.kind:7} {verdict:6} {a.seconds:6.0f} s  {a.item.id}{over}")
    revise = revision_list(attempts)
    if revise:
        lines.append("Revise:")
        lines += [f"  - {s.notebook}: {s.title}  ({s.link})" for s in revise]
    else:
        lines.append("Nothing to revise: every answer was right, and within its time budget.")
    return lines
