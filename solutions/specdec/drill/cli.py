"""``python -m specdec.drill``: practise alone, in the terminal or with JSON files.

Modes: an interactive drill (the default), a timed mock interview (``--mock``), questions as JSON (``--json``,
``--reveal`` to include answers), grading a JSON of answers (``--check FILE``), and the list of templates
(``--list``). Bad input exits with status 2 and a message naming what was wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from specdec.drill.questions import (
    LETTERS,
    TOPICS,
    ChoiceQuestion,
    DrillInputError,
    NumberQuestion,
    Question,
    build_question,
    parse_number,
    plural,
    show,
)
from specdec.drill.session import Attempt, draw_questions, fresh_seed, mock_interview, report, templates
from specdec.drill.written import Written

EXAMPLES = """\
examples:
  python -m specdec.drill                          10 questions from every notebook, one at a time
  python -m specdec.drill --topic serving          only notebook 11's kind of question (or --topic 11)
  python -m specdec.drill --mock                   a timed mock interview with written answers, then a report
  python -m specdec.drill --seed 1 --count 40 --json > q.json    questions to answer in a file
  python -m specdec.drill --check q.json           grade it (fill in each "answer": a number or a letter)
  python -m specdec.drill --list                   every template, its notebook and its topic
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specdec.drill",
        description="Self-study drill for the speculative decoding course: fresh numbers every time, each answer "
                    "checked at once, with its derivation and the notebook section to revise.",
        epilog=EXAMPLES + "\ntopics: " + ", ".join(TOPICS), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topic", help="a topic (see below) or a notebook number such as 01; default: all")
    parser.add_argument("--seed", type=int, help="draw the same questions again (default: a fresh seed, printed)")
    parser.add_argument("--count", type=int, help="how many questions (default 10)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--mock", action="store_true",
                      help="mock interview: timed numbers, choices and 2-3 written answers, then a report")
    mode.add_argument("--json", action="store_true", help="print the questions as JSON (answers left null)")
    mode.add_argument("--check", metavar="FILE", type=Path,
                      help="grade a JSON file of answers (the --json format with each 'answer' filled in; null "
                           "counts as unanswered); each question is rebuilt from its id")
    mode.add_argument("--list", action="store_true", help="list every question template")
    parser.add_argument("--reveal", action="store_true", help="with --json: include answers and explanations")
    return parser


# -- JSON ----------------------------------------------------------------------------------------------------------


def questions_json(seed: int, count: int, topic: str | None, reveal: bool) -> dict:
    questions = draw_questions(seed, count, topic)
    return {"seed": seed, "count": count, "topic": topic,
            "how_to_answer": "fill in each 'answer' (a number, or a letter for a choice), then run "
                             "python -m specdec.drill --check FILE",
            "questions": [q.to_dict(reveal) for q in questions]}


def _entries(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DrillInputError(f"no such file: {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise DrillInputError(f"cannot read {path}: {err}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DrillInputError(f"{path} is not valid JSON: {err}") from None
    entries = data.get("questions") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise DrillInputError(f"{path} must hold a non-empty list of questions (or an object with a 'questions' list, "
                              "as --json writes it)")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "id" not in entry:
            raise DrillInputError(f"question {i + 1} in {path} has no 'id'")
        if "answer" not in entry:
            raise DrillInputError(f"question {i + 1} ({entry['id']}) has no 'answer' field")
    return entries


def check_file(path: Path, out: TextIO) -> int:
    """Grade a file of answers, regenerating every question from its id; the last line is ``score: X/N``."""
    entries = _entries(path)
    graded = []
    for i, entry in enumerate(entries):
        try:
            question = build_question(entry["id"])
            answer = entry["answer"]
            right = answer is not None and question.is_right(answer)
        except DrillInputError as err:
            raise DrillInputError(f"question {i + 1} ({entry['id']!r}): {err}") from None
        graded.append((question, answer, right))
    for question, answer, right in graded:
        given = "no answer" if answer is None else f"you gave {answer!r}"
        if isinstance(question, NumberQuestion) and isinstance(answer, str):
            given += f" = {show(parse_number(answer))}"  # arithmetic is read, as in the terminal drill
        verdict = "right" if right else f"wrong ({given}; the answer is {question.answer_text()})"
        print(f"{question.id}: {verdict}", file=out)
        if not right:
            print(_wrap(question.explanation, "    "), file=out)
            print(f"    revise: {question.section.link}", file=out)
    print(f"score: {sum(r for *_, r in graded)}/{len(graded)}", file=out)
    return 0


def list_templates(out: TextIO) -> int:
    every = templates()
    print(f"{len(every)} templates (name, kind, topic, notebook / section):", file=out)
    for t in every:
        print(f"  {t.name:38} {t.kind:6} {t.topic:10} {t.section.notebook} / {t.section.title}", file=out)
    return 0


# -- the terminal drill ----------------------------------------------------------------------------------------------


def _wrap(text: str, indent: str = "  ") -> str:
    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=indent)


def _show_question(n: int, total: int, item: Question | Written, out: TextIO) -> None:
    print(f"\n[{n}/{total}] {item.section.notebook} / {item.section.title}  ({item.id})", file=out)
    print(_wrap(item.prompt), file=out)
    if isinstance(item, ChoiceQuestion):
        for letter, option in zip(LETTERS, item.options):
            print(_wrap(f"({letter}) {option}", "    "), file=out)


def _ask(item: Question, read: Callable[[str], str], out: TextIO) -> tuple[object, bool]:
    """Read answers until one parses (EOFError ends the session)."""
    hint = "letter" if isinstance(item, ChoiceQuestion) else f"number{', ' + item.unit if item.unit else ''}"
    while True:
        raw = read(f"your answer ({hint}; q to stop): ").strip()
        if raw.lower() in ("q", "quit", "exit"):
            raise EOFError
        try:
            return raw, item.is_right(raw)
        except DrillInputError as err:
            print(f"  {err}; try again", file=out)


def _ask_written(item: Written, read: Callable[[str], str], out: TextIO) -> tuple[str, float]:
    print("  Type your answer; an empty line ends it.", file=out)
    lines = []
    while True:
        line = read("  > ")
        if not line.strip():
            break
        lines.append(line)
    print("\n  Model answer:", file=out)
    print(_wrap(item.model_answer, "    "), file=out)
    print(f"  Rubric ({item.points:g} point):", file=out)
    for point in item.rubric_points:
        print(_wrap(f"- {point}", "    "), file=out)
    while True:
        raw = read(f"  Your score by the rubric, 0 to {item.points:g}: ").strip()
        try:
            score = float(raw)
        except ValueError:
            score = -1
        if 0 <= score <= item.points:
            return " ".join(lines), score / item.points
        print(f"  a number from 0 to {item.points:g}, please", file=out)


def run_session(items: list[Question | Written], read: Callable[[str], str], out: TextIO,
                clock: Callable[[], float] = time.monotonic, timed: bool = False) -> list[Attempt]:
    """Ask each item in turn, check it at once, show the derivation and the running score."""
    attempts: list[Attempt] = []
    for n, item in enumerate(items, 1):
        _show_question(n, len(items), item, out)
        start = clock()
        try:
            if isinstance(item, Written):
                given, score = _ask_written(item, read, out)
            else:
                given, right = _ask(item, read, out)
                score = float(right)
                print(f"  {'Right.' if right else 'Not quite: the answer is ' + item.answer_text() + '.'}", file=out)
                print(_wrap(item.explanation), file=out)
        except EOFError:
            print("\n  (stopped)", file=out)
            break
        attempts.append(Attempt(item, score, clock() - start, str(given)))
        total = sum(a.score for a in attempts)
        elapsed = f"  {attempts[-1].seconds:.0f} s" if timed else ""
        print(f"  score {total:g}/{len(attempts)}{elapsed}   revise: {item.section.link}", file=out)
    return attempts


def interactive(args: argparse.Namespace, read: Callable[[str], str], out: TextIO,
                clock: Callable[[], float]) -> int:
    seed = args.seed if args.seed is not None else fresh_seed()
    if args.mock:
        items: list = mock_interview(seed, args.count or 10)
        print(f"Mock interview, seed {seed}: {len(items)} questions. Budgets: 2 min a number, 1 min a choice, 5 min a "
              "written answer. Answer as you would aloud; the clock runs.", file=out)
    else:
        items = draw_questions(seed, args.count or 10, args.topic)
        print(f"Drill, seed {seed} (--seed {seed} repeats it): {plural(len(items), 'question')}"
              f"{' on ' + args.topic if args.topic else ''}. Numbers may be arithmetic (3.36 / 1.2).", file=out)
    attempts = run_session(items, read, out, clock, timed=args.mock)
    if attempts:
        print("", file=out)
        for line in report(attempts):
            print(line, file=out)
    return 0


def main(argv: list[str] | None = None, read: Callable[[str], str] = input, out: TextIO | None = None,
         clock: Callable[[], float] = time.monotonic) -> int:
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.reveal and not args.json:
        parser.error("--reveal goes with --json")
    if args.count is not None and args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    if args.mock and args.topic:
        parser.error("--mock mixes every topic; drop --topic")
    try:
        if args.list:
            return list_templates(out)
        if args.check:
            return check_file(args.check, out)
        if args.json:
            seed = args.seed if args.seed is not None else fresh_seed()
            print(json.dumps(questions_json(seed, args.count or 10, args.topic, args.reveal), indent=1), file=out)
            return 0
        return interactive(args, read, out, clock)
    except DrillInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n(stopped)", file=out)
        return 0
