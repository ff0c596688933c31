"""The self-study drill (``specdec.drill``): every template over many seeds, the JSON round trip (40/40 right, 0/40
after a 10% slip or another letter), the CLI's errors, the terminal drill and mock interview with scripted input,
the written questions read from the notebooks, the widget without a browser, and the import graph."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import read, student_path
from specdec.drill import REGISTRY, build_question
from specdec.drill.cli import main
from specdec.drill.questions import NOTEBOOKS, TOPICS, ChoiceQuestion, DrillInputError, NumberQuestion, show
from specdec.drill.session import draw_questions, mock_interview, templates
from specdec.drill.written import REVISE, written_questions
from specdec.paths import REPO_ROOT
from test_layout import PACKAGE, UPPER, find_cycle, import_graph

SEEDS = range(10)
NAMES = sorted(REGISTRY)


def _headings(notebook: str) -> set[str]:
    nb = read(student_path(notebook))
    return {line[3:].strip() for cell in nb.cells if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if line.startswith("## ")}


def _significant(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits - 1}e}")


def _run(argv: list[str], answers: list[str] | None = None) -> tuple[int, str]:
    out, script = io.StringIO(), iter(answers or [])

    def read_line(prompt: str) -> str:
        try:
            return next(script)
        except StopIteration:
            raise EOFError from None

    return main(argv, read=read_line, out=out, clock=iter(range(0, 10**6, 7)).__next__), out.getvalue()


# -- the templates ---------------------------------------------------------------------------------------------------


def test_at_least_30_templates_across_every_notebook_each_naming_a_real_section():
    assert len(REGISTRY) >= 30
    assert {t.section.notebook for t in REGISTRY.values()} == set(NOTEBOOKS.values())
    assert {t.kind for t in REGISTRY.values()} == {"number", "choice"}
    for t in REGISTRY.values():
        assert t.topic in TOPICS, t.name
        assert t.section.title in _headings(t.section.notebook), f"{t.name}: no section {t.section.title!r}"


@pytest.mark.parametrize("name", NAMES)
def test_template_over_many_seeds(name):
    template = REGISTRY[name]
    prompts = set()
    for seed in SEEDS:
        q = template.question(seed)
        assert q == template.question(seed), "the same seed must give the same question"
        assert build_question(q.id) == q
        assert q.section.notebook in NOTEBOOKS.values() and q.prompt and q.explanation
        prompts.add(q.prompt + repr(getattr(q, "options", "")))
        if isinstance(q, NumberQuestion):
            assert math.isfinite(q.answer) and q.answer != 0
            assert show(q.answer) in q.explanation, f"{q.id}: the explanation never states {show(q.answer)}"
            assert q.is_right(q.answer) and q.is_right(str(q.answer))
            assert q.is_right(_significant(q.answer)), f"{q.id}: {q.answer} rounded to 3 figures is refused"
            assert not q.is_right(q.answer * 1.1) and not q.is_right(q.answer * 0.9), f"{q.id}: a 10% error passes"
            assert q.rel <= 0.02
        else:
            assert isinstance(q, ChoiceQuestion) and len(set(q.options)) == 4
            assert q.is_right(q.answer) and q.is_right(q.answer.upper())
            assert [q.is_right(letter) for letter in "abcd"].count(True) == 1
    assert len(prompts) >= len(SEEDS) // 2, f"{name}: {len(prompts)} distinct questions over {len(SEEDS)} seeds"


def test_choice_order_is_shuffled_by_the_seed():
    for name in (n for n in NAMES if REGISTRY[n].kind == "choice"):
        letters = {REGISTRY[name].question(seed).answer for seed in SEEDS}
        assert len(letters) >= 2, f"{name}: the right option is always ({letters.pop()})"


def test_answers_parse_as_numbers_or_arithmetic_and_nothing_else():
    q = REGISTRY["ledger_speedup"].question(1)
    assert q.is_right(f"{q.answer:.5f}") and q.is_right(f"{q.answer * 3} / 3")
    for bad in ("fast", "", "1e999", "__import__('os')", True, None, [1]):
        with pytest.raises(DrillInputError):
            q.is_right(bad)
    c = REGISTRY["pitfalls_temperatures"].question(1)
    assert c.is_right(f"({c.answer})") and c.is_right(c.options["abcd".index(c.answer)])
    with pytest.raises(DrillInputError):
        c.is_right("e")


def test_topics_and_notebook_numbers_select_templates():
    assert {t.topic for t in templates("serving")} == {"serving"}
    assert {t.section.notebook for t in templates("1")} == {"01_cost_ledger"} == {t.section.notebook for t in
                                                                                   templates("01")}
    with pytest.raises(DrillInputError, match="unknown topic"):
        templates("quantum")
    questions = draw_questions(4, 2 * len(REGISTRY))
    assert {q.template for q in questions} == set(REGISTRY), "every template comes once before any repeats"


# -- JSON and --check ------------------------------------------------------------------------------------------------


def _revealed(tmp_path: Path, seed: int = 1, count: int = 40) -> tuple[dict, Path]:
    rc, text = _run(["--seed", str(seed), "--count", str(count), "--json", "--reveal"])
    assert rc == 0
    path = tmp_path / f"q{seed}.json"
    path.write_text(text)
    return json.loads(text), path


def test_revealed_answers_score_40_of_40_through_the_module(tmp_path):
    """The acceptance test of the issue: ``--seed 1 --count 40 --json --reveal > q.json``, then ``python -m
    specdec.drill --check q.json`` (one run through the module's entry point; the same main() writes the file)."""
    _revealed(tmp_path)
    check = subprocess.run([sys.executable, "-m", "specdec.drill", "--check", "q1.json"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines()[-1] == "score: 40/40"


def test_slipped_answers_score_0_of_40(tmp_path):
    data, _ = _revealed(tmp_path)
    for q in data["questions"]:
        if q["kind"] == "number":
            q["answer"] *= 1.1
        else:
            q["answer"] = next(letter for letter in q["options"] if letter != q["answer"])
    path = tmp_path / "slipped.json"
    path.write_text(json.dumps(data))
    rc, text = _run(["--check", str(path)])
    assert rc == 0 and text.splitlines()[-1] == "score: 0/40"
    assert text.count(": wrong (") == 40


def test_check_regenerates_questions_and_trusts_nothing_else_in_the_file(tmp_path):
    data, _ = _revealed(tmp_path, count=6)
    for q in data["questions"]:
        q["question"], q["tolerance"], q["explanation"] = "edited", "any", "edited"
        q["answer"] = None if q["kind"] == "number" else q["answer"]  # numbers unanswered, choices right
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data["questions"]))  # a bare list works too
    rc, text = _run(["--check", str(path)])
    right = sum(q["kind"] == "choice" for q in data["questions"])
    assert rc == 0 and text.splitlines()[-1] == f"score: {right}/6"
    assert "no answer" in text


def test_two_seeds_give_different_questions(tmp_path):
    one, _ = _revealed(tmp_path, seed=1, count=10)
    two, _ = _revealed(tmp_path, seed=2, count=10)
    assert [q["id"] for q in one["questions"]] != [q["id"] for q in two["questions"]]
    assert {q["answer"] for q in one["questions"]} != {q["answer"] for q in two["questions"]}
    rc, text = _run(["--seed", "1", "--count", "10", "--json"])
    assert all(q["answer"] is None and "explanation" not in q for q in json.loads(text)["questions"])


def test_list_names_every_template_and_its_notebook():
    rc, text = _run(["--list"])
    lines = [line for line in text.splitlines()[1:] if line.strip()]
    assert rc == 0 and len(lines) == len(REGISTRY) >= 30
    for line in lines:
        assert any(slug in line for slug in NOTEBOOKS.values()), line


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ("[]", "non-empty list"),
    ('[{"answer": 1}]', "has no 'id'"),
    ('[{"id": "ledger_speedup:1"}]', "has no 'answer'"),
    ('[{"id": "warp_drive:1", "answer": 1}]', "unknown question id"),
    ('[{"id": "ledger_speedup:abc", "answer": 1}]', "must be a seed"),
    ('[{"id": "ledger_speedup:1", "answer": "fast"}]', "expected a number"),
    ('[{"id": "pitfalls_temperatures:1", "answer": "z"}]', "expected one of the letters"),
])
def test_check_errors_name_the_problem_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "answers.json"
    if content is not None:
        path.write_text(content)
    rc, text = _run(["--check", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err and text == ""


def test_bad_arguments_exit_2_with_usage(capsys):
    for argv in (["--reveal"], ["--count", "0"], ["--mock", "--topic", "kv"], ["--json", "--list"]):
        with pytest.raises(SystemExit) as stop:
            main(argv, out=io.StringIO())
        assert stop.value.code == 2
    assert "usage:" in capsys.readouterr().err
    rc, _ = _run(["--topic", "quantum"])
    assert rc == 2 and "unknown topic" in capsys.readouterr().err


def test_help_explains_the_modes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for word in ("--mock", "--json", "--reveal", "--check", "--list", "--topic", "serving", "examples"):
        assert word in text


def test_make_drill_passes_topic_seed_and_count_and_make_help_names_both_targets():
    def make(*args: str) -> str:
        return subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout

    assert "-m specdec.drill --topic serving --seed 3 --count 2" in make("drill", "TOPIC=serving", "SEED=3", "COUNT=2")
    assert make("drill").rstrip().endswith("-m specdec.drill")
    assert "-m specdec.drill --mock --seed 5" in make("mock-interview", "SEED=5")
    helped = subprocess.run(["make", "--no-print-directory", "-s", "help"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert "make drill" in helped and "make mock-interview" in helped


# -- the terminal drill and the mock interview ---------------------------------------------------------------------


def test_terminal_drill_checks_each_answer_and_keeps_score():
    questions = draw_questions(11, 3, "ledger")
    first = questions[0]
    script = ["not a number", str(first.answer), "1e-9"]
    rc, text = _run(["--seed", "11", "--count", "3", "--topic", "ledger"], script)
    assert rc == 0
    assert "expected a number" in text and "Right." in text and "Not quite: the answer is" in text
    assert first.explanation[:40] in text.replace("\n  ", " ")
    assert "Score: 1 / 2" in text and "(stopped)" in text and "notebooks/01_cost_ledger.ipynb#" in text


def test_mock_interview_asks_written_questions_and_reports_time_and_what_to_revise():
    items = mock_interview(21, 8)
    assert sum(i.kind == "written" for i in items) == 2 and items[-1].kind == "written"
    assert {i.kind for i in items} == {"number", "choice", "written"}
    script = []
    for item in items:
        if item.kind == "written":
            script += ["It is exact because the residual makes up the difference.", "", "0.5"]
        else:
            script.append(str(item.answer))
    rc, text = _run(["--mock", "--seed", "21", "--count", "8"], script)
    assert rc == 0 and "Model answer:" in text and "Rubric (1 point):" in text
    assert "Score: 7 / 8" in text
    report = text[text.index("Score: 7 / 8"):]
    assert report.count(" s  ") == 8, "the report lists the time of every question"
    written = [i for i in items if i.kind == "written"]
    for item in written:
        assert item.section.link in report, "a half-right written answer points at its section"


def test_written_questions_come_from_the_notebooks_with_model_answers_and_rubrics():
    written = written_questions()
    assert len(written) >= 6
    for w in written:
        assert w.prompt and len(w.model_answer) > 200 and w.rubric_points and w.points > 0, w.id
        assert "BEGIN SOLUTION" not in w.model_answer + w.rubric
        assert w.section.title in _headings(w.section.notebook), f"{w.id}: no section {w.section.title!r}"
    assert set(REVISE) <= {w.id for w in written}


# -- the widget, without a browser ----------------------------------------------------------------------------------


def test_widget_checks_answers_explains_and_reports():
    from specdec.drill.widget import DrillApp

    questions = draw_questions(3, 3)
    app = DrillApp(questions, "test")
    app.check()
    assert "Answer first" in app.feedback.value
    for i, q in enumerate(questions):
        right = i != 1
        wrong = "z" if isinstance(q, ChoiceQuestion) else None
        if isinstance(q, ChoiceQuestion):
            app.answer.value = q.answer if right else next(letter for letter in "abcd" if letter != q.answer)
        else:
            app.answer.value = str(q.answer) if right else str(q.answer * 2)
        assert wrong is None or wrong not in app.answer.value
        app.check()
        assert ("Right" in app.feedback.value) == right
        assert "Revise" in app.explanation.value and q.section.anchor in app.explanation.value
        assert app.next_button.disabled is False
        app.next()
    assert "Score 2 / 3" in app.prompt.value and "Revise" in app.prompt.value


def test_mock_interview_widget_scores_written_answers_by_self_assessment():
    from specdec.drill.widget import DrillApp

    items = mock_interview(5, 6)
    app = DrillApp(items, "mock", timed=True)
    for item in items:
        if item.kind == "written":
            app.answer.value = "my answer"
            app.check()
            assert "Model answer" in app.explanation.value and "Rubric" in app.explanation.value
            app.self_score.value = 1.0
        else:
            app.answer.value = str(item.answer)
            app.check()
        app.next()
    assert "Score 6 / 6" in app.prompt.value


# -- the package's shape --------------------------------------------------------------------------------------------


def test_nothing_below_the_drill_imports_it_and_there_is_no_cycle():
    graph = import_graph()
    assert find_cycle(graph) is None
    outside = {m for m, deps in graph.items() if not m.startswith(UPPER)
               and any(d.startswith("specdec.drill") for d in deps)}
    assert not outside, f"{sorted(outside)} import specdec.drill: lessons never import the drill"
    # the grader shows model answers with the drill's parser of written cells, and nothing else of the drill
    course = {d for m, deps in graph.items() if m.startswith("specdec.course") for d in deps if d.startswith("specdec.drill")}
    assert course <= {"specdec.drill.written"}, f"specdec.course imports {sorted(course)}"
    assert (PACKAGE / "drill" / "__main__.py").exists() and (REPO_ROOT / "solutions" / "specdec" / "drill").is_dir()
