"""The drill's question types, the registry of question templates, and ids that regenerate a question.

A **template** draws fresh parameters from a seeded ``random.Random`` and computes its answer with the package's
own functions (``specdec.ledger``, ``specdec.metrics``, ``specdec.tree``, ``specdec.serving`` ...), so the drill and
the notebooks share one source of truth. A **question** is one draw: its id, ``"<template>:<seed>"``, is all it
takes to build it again, which is how ``--check`` grades a file without trusting anything else in it.

Numeric answers are graded with a relative tolerance that accepts correct rounding (1% by default, so three
significant figures pass) and refuses a 10% error; counts must be exact. A template never produces the answer 0,
since a relative tolerance cannot tell 0 from a 10% slip of it.
"""

from __future__ import annotations

import ast
import math
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass, field

#: The course's notebooks, by number.
NOTEBOOKS = {
    "01": "01_cost_ledger", "02": "02_greedy_verify", "03": "03_rejection_sampling", "04": "04_chain_verify",
    "05": "05_kv_cache_engine", "06": "06_prompt_lookup", "07": "07_tree_attention", "08": "08_gpu_kernels",
    "09": "09_benchmark", "10": "10_pitfalls_interview", "11": "11_serving", "12": "12_self_drafting",
    "13": "13_production", "14": "14_frontier", "15": "15_parallel_state_drift",
}

#: Topics a learner can pick with ``--topic``, and what each covers.
TOPICS = {
    "ledger": "parameter bytes, step-time floors, E(alpha, gamma), speedup, best gamma, the batch crossover",
    "kv": "KV bytes per token and per block, the caches after a round, rollback",
    "verify": "greedy and chain verification, stops inside a round, choosing gamma from measurements",
    "rejection": "one-position rejection sampling: acceptance, residual, the classic wrong rule",
    "lookup": "prompt lookup: the latest earlier match, one-hot verification",
    "tree": "tree attention: paths, masks, Medusa's Cartesian tree, EAGLE-2's dynamic tree",
    "kernels": "the fused verifier's bytes and floors, the exponential race",
    "acceptance": "alpha, the draft acceptance rate and tau, and the conversions between them",
    "pitfalls": "the classic bugs and what breaks first",
    "serving": "lookahead slots, blocks, the slot mapping, gamma by batch size",
    "drafters": "what Medusa, EAGLE and EAGLE-2 cost in weights and KV",
    "production": "prefix caching, grammars, suffix decoding, K per batch size, CUDA-graph padding",
    "frontier": "MoE expert unions, the KV term at long context, self-speculation, block verification, ranks and rollouts",
    "parallel": "parallel drafting's best gamma and training tokens, a hybrid's recurrent-state memory and rollback, "
                "acceptance after the target moves",
}

LETTERS = "abcd"


class DrillInputError(ValueError):
    """Input the drill cannot use (an unknown id or topic, an answer of the wrong kind): the message says what."""


@dataclass(frozen=True)
class Section:
    """Where to revise: a notebook and one of its section headings (as written in the notebook)."""

    notebook: str
    title: str

    @property
    def anchor(self) -> str:
        """JupyterLab's id for the heading: its text, with spaces as dashes."""
        return self.title.replace("`", "").replace(" ", "-")

    @property
    def link(self) -> str:
        """The section from the repository root: ``notebooks/<slug>.ipynb#<anchor>``."""
        return f"notebooks/{self.notebook}.ipynb#{self.anchor}"

    def __str__(self) -> str:
        return f"{self.notebook} / {self.title}"


# -- what a template returns ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """A numeric question as a template draws it. ``rel = 0`` for counts, which must be exact."""

    prompt: str
    answer: float
    explanation: str
    unit: str = ""
    rel: float = 0.01


@dataclass(frozen=True)
class Choice:
    """A multiple-choice question as a template draws it: the right option and three wrong ones."""

    prompt: str
    right: str
    wrong: tuple[str, str, str]
    explanation: str


# -- questions -----------------------------------------------------------------------------------------------------


#: Units that are counted nouns: "1 block", not "1 blocks".
SINGULAR = {"blocks": "block", "tokens": "token", "entries": "entry", "drafts": "draft", "positions": "position",
            "nodes": "node", "requests": "request", "forwards": "forward", "rounds": "round", "slots": "slot",
            "parameters": "parameter", "rows": "row", "steps": "step"}


def show(x: float) -> str:
    """A number as explanations print it: ints with thousands separators, other values to 4 significant figures."""
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def plural(n: int, word: str) -> str:
    """``3 drafts``, ``1 draft``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError("not arithmetic")


def parse_number(raw: object) -> float:
    """A learner's numeric answer: a JSON number, or text holding a number or plain arithmetic (``3.36 / 1.2``,
    ``6,738``); anything else raises DrillInputError."""
    if isinstance(raw, bool):
        raise DrillInputError(f"expected a number, got {raw!r}")
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        text = raw.strip().replace(",", "").replace("_", "")
        try:
            value = _evaluate(ast.parse(text, mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
            raise DrillInputError(f"expected a number, got {raw!r}") from None
    else:
        raise DrillInputError(f"expected a number, got {raw!r}")
    if not math.isfinite(value):
        raise DrillInputError(f"expected a finite number, got {raw!r}")
    return value


@dataclass(frozen=True)
class Question:
    """One drawn question. ``id`` rebuilds it: ``build_question(question.id) == question``."""

    id: str
    template: str
    topic: str
    section: Section
    prompt: str
    explanation: str

    kind = "question"

    def parse(self, raw: object) -> object:
        raise NotImplementedError

    def is_right(self, raw: object) -> bool:
        """Whether a learner's answer is right (DrillInputError if it is not an answer of this kind)."""
        raise NotImplementedError

    def answer_text(self) -> str:
        raise NotImplementedError

    def to_dict(self, reveal: bool = False) -> dict:
        """The question as ``--json`` prints it; ``reveal`` adds the answer and the explanation."""
        out = {"id": self.id, "template": self.template, "kind": self.kind, "topic": self.topic,
               "notebook": self.section.notebook, "section": self.section.title, "link": self.section.link,
               "question": self.prompt}
        return out


@dataclass(frozen=True)
class NumberQuestion(Question):
    answer: int | float = 1
    unit: str = ""
    rel: float = 0.01

    kind = "number"

    def parse(self, raw: object) -> float:
        return parse_number(raw)

    def is_right(self, raw: object) -> bool:
        given = self.parse(raw)
        if self.rel == 0:
            return given == self.answer
        return abs(given - self.answer) <= self.rel * abs(self.answer)

    def tolerance_text(self) -> str:
        return "exact" if self.rel == 0 else f"within {self.rel:.0%}"

    def answer_text(self) -> str:
        unit = SINGULAR.get(self.unit, self.unit) if self.answer == 1 else self.unit
        return f"{show(self.answer)} {unit}".strip()

    def to_dict(self, reveal: bool = False) -> dict:
        out = super().to_dict()
        out["unit"] = self.unit
        out["tolerance"] = self.tolerance_text()
        out["answer"] = self.answer if reveal else None
        if reveal:
            out["explanation"] = self.explanation
        return out


@dataclass(frozen=True)
class ChoiceQuestion(Question):
    options: tuple[str, ...] = ()
    answer: str = "a"

    kind = "choice"

    def parse(self, raw: object) -> str:
        if isinstance(raw, str):
            text = raw.strip().lower().strip("() .")
            if text and text in LETTERS[: len(self.options)]:
                return text
            for letter, option in zip(LETTERS, self.options):
                if raw.strip().lower() == option.lower():
                    return letter
        letters = ", ".join(LETTERS[: len(self.options)])
        raise DrillInputError(f"expected one of the letters {letters}, got {raw!r}")

    def is_right(self, raw: object) -> bool:
        return self.parse(raw) == self.answer

    def answer_text(self) -> str:
        return f"({self.answer}) {self.options[LETTERS.index(self.answer)]}"

    def to_dict(self, reveal: bool = False) -> dict:
        out = super().to_dict()
        out["options"] = dict(zip(LETTERS, self.options))
        out["answer"] = self.answer if reveal else None
        if reveal:
            out["explanation"] = self.explanation
        return out


# -- templates and the registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A question with fresh parameters per seed: ``draw(rng)`` returns a Number or a Choice."""

    name: str
    kind: str  # "number" or "choice"
    topic: str
    section: Section
    draw: Callable[[random.Random], Number | Choice] = field(repr=False, compare=False)

    def question(self, seed: int) -> Question:
        """The question this template asks for ``seed`` (the same seed, the same question)."""
        rng = random.Random(f"{self.name}:{seed}")
        drawn = self.draw(rng)
        common = dict(id=f"{self.name}:{seed}", template=self.name, topic=self.topic, section=self.section,
                      prompt=drawn.prompt, explanation=drawn.explanation)
        if isinstance(drawn, Number):
            answer = float(drawn.answer)
            if answer.is_integer():
                answer = int(answer)  # counts read as counts, in JSON too
            if not math.isfinite(answer) or answer == 0:
                raise RuntimeError(f"template {self.name} drew the answer {answer!r} for seed {seed}: answers must be "
                                   f"finite and nonzero")
            return NumberQuestion(**common, answer=answer, unit=drawn.unit, rel=drawn.rel)
        options = [drawn.right, *drawn.wrong]
        if len(set(options)) != 4:
            raise RuntimeError(f"template {self.name} drew repeated options for seed {seed}: {options}")
        rng.shuffle(options)
        return ChoiceQuestion(**common, options=tuple(options), answer=LETTERS[options.index(drawn.right)])


REGISTRY: dict[str, Template] = {}


def _register(kind: str, name: str, topic: str, notebook: str, section: str):
    if topic not in TOPICS:
        raise ValueError(f"template {name}: unknown topic {topic!r}")
    if notebook not in NOTEBOOKS.values():
        raise ValueError(f"template {name}: unknown notebook {notebook!r}")

    def decorate(draw: Callable[[random.Random], Number | Choice]):
        if name in REGISTRY:
            raise ValueError(f"two templates are named {name!r}")
        REGISTRY[name] = Template(name, kind, topic, Section(notebook, section), draw)
        return draw

    return decorate


def number(name: str, *, topic: str, notebook: str, section: str):
    """Register a numeric template: ``@number("ledger_speedup", topic=..., notebook=..., section=...)``."""
    return _register("number", name, topic, notebook, section)


def choice(name: str, *, topic: str, notebook: str, section: str):
    """Register a multiple-choice template (its options are shuffled by the seed)."""
    return _register("choice", name, topic, notebook, section)


def build_question(question_id: object) -> Question:
    """The question an id names (``"<template>:<seed>"``), built again from scratch."""
    if not isinstance(question_id, str) or ":" not in question_id:
        raise DrillInputError(f"a question id looks like 'ledger_speedup:1234', got {question_id!r}")
    name, _, seed = question_id.rpartition(":")
    if name not in REGISTRY:
        raise DrillInputError(f"unknown question id {question_id!r}: no template named {name!r} "
                              "(python -m specdec.drill --list shows them)")
    if not seed.isdigit():
        raise DrillInputError(f"unknown question id {question_id!r}: the part after ':' must be a seed (digits)")
    return REGISTRY[name].question(int(seed))
