"""The drill in a notebook (ipywidgets 8): one question at a time, Check, the derivation, Next, a running score.

``drill_widget(topic, seed, count)`` asks numbers and choices; ``mock_interview_widget(seed, count)`` adds written
answers (type one, then see the model answer and the rubric and score yourself) and ends with the report of the
terminal's ``--mock``: score, time per question, sections to revise. Both draw their questions with
:mod:`specdec.drill.session`, so a seed gives the same questions as ``python -m specdec.drill --seed``.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable

import ipywidgets as widgets

from specdec.drill.questions import LETTERS, ChoiceQuestion, DrillInputError, Question, Section
from specdec.drill.session import BUDGET_S, Attempt, Item, draw_questions, fresh_seed, mock_interview, revision_list
from specdec.drill.written import Written

SCORES = (("0", 0.0), ("1/4", 0.25), ("1/2", 0.5), ("3/4", 0.75), ("1", 1.0))


def _link(section: Section) -> str:
    """A link to the section that works from a notebook in notebooks/ (JupyterLab opens it at the heading)."""
    return (f'<a href="{html.escape(section.notebook)}.ipynb#{html.escape(section.anchor)}" target="_blank" '
            'style="color: var(--jp-content-link-color, #0969da); text-decoration: underline">'
            f"{html.escape(section.notebook)} / {html.escape(section.title)}</a>")


def _para(text: str) -> str:
    return f'<div style="white-space: pre-wrap; line-height: 1.45">{html.escape(text)}</div>'


class DrillApp:
    """The widget's state: the items, where the learner is, and what each answer scored."""

    def __init__(self, items: list[Item], title: str, timed: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.items, self.title, self.timed, self.clock = items, title, timed, clock
        self.index, self.attempts, self.started = 0, [], 0.0
        self.answered = False
        self.header = widgets.HTML()
        self.prompt = widgets.HTML()
        self.answer_box = widgets.Box(layout=widgets.Layout(width="100%"))
        self.check_button = widgets.Button(description="Check", button_style="primary", icon="check")
        self.next_button = widgets.Button(description="Next", disabled=True, icon="arrow-right")
        self.feedback = widgets.HTML()
        self.explanation = widgets.HTML()
        self.score_line = widgets.HTML()
        self.answer: widgets.Widget | None = None
        self.self_score: widgets.ToggleButtons | None = None
        for w, name in ((self.header, "header"), (self.prompt, "question"), (self.answer_box, "answer"),
                        (self.check_button, "check"), (self.next_button, "next"), (self.feedback, "feedback"),
                        (self.explanation, "explanation"), (self.score_line, "score")):
            w.add_class(f"specdec-drill-{name}")
        self.check_button.on_click(lambda _: self.check())
        self.next_button.on_click(lambda _: self.next())
        self.widget = widgets.VBox([self.header, self.prompt, self.answer_box,
                                    widgets.HBox([self.check_button, self.next_button]),
                                    self.feedback, self.explanation, self.score_line],
                                   layout=widgets.Layout(width="100%", max_width="900px"))
        self.widget.add_class("specdec-drill")
        self.show()

    @property
    def item(self) -> Item:
        return self.items[self.index]

    def _score_text(self) -> str:
        total = sum(a.score for a in self.attempts)
        return f"<b>Score {total:g}/{len(self.attempts)}</b> &middot; {len(self.items) - len(self.attempts)} to go"

    def show(self) -> None:
        """Put the current item on screen, with an empty answer."""
        item = self.item
        self.answered = False
        self.header.value = (f"<b>{html.escape(self.title)}</b> &middot; question {self.index + 1} of {len(self.items)} "
                             f"&middot; {html.escape(item.section.notebook)} / {html.escape(item.section.title)}")
        self.prompt.value = _para(item.prompt)
        if isinstance(item, ChoiceQuestion):
            self.answer = widgets.RadioButtons(options=[(f"({letter}) {option}", letter) for letter, option in
                                                        zip(LETTERS, item.options)], value=None,
                                               layout=widgets.Layout(width="100%"))
        elif isinstance(item, Written):
            self.answer = widgets.Textarea(placeholder="Answer as you would aloud, in 3 to 6 sentences.",
                                           layout=widgets.Layout(width="100%", height="8em"))
        else:
            unit = f" ({item.unit})" if item.unit else ""
            self.answer = widgets.Text(placeholder=f"a number{unit}; arithmetic such as 3.36 / 1.2 works",
                                       layout=widgets.Layout(width="28em"))
        self.answer_box.children = (self.answer,)
        self.check_button.description = "Show model answer" if isinstance(item, Written) else "Check"
        self.check_button.disabled, self.next_button.disabled = False, True
        self.feedback.value = self.explanation.value = ""
        self.score_line.value = self._score_text()
        self.started = self.clock()

    def check(self) -> None:
        """Grade the answer (or, for a written question, reveal the model answer and the rubric)."""
        if self.answered:
            return
        item = self.item
        if isinstance(item, Written):
            self._reveal_written(item)
            return
        raw = self.answer.value
        if raw is None or raw == "":
            self.feedback.value = "<i>Answer first.</i>"
            return
        try:
            right = item.is_right(raw)
        except DrillInputError as err:
            self.feedback.value = f"<i>{html.escape(str(err))}</i>"
            return
        self._record(item, float(right), str(raw))
        if right:
            self.feedback.value = '<span style="color: #1a7f37; font-weight: bold">&#10004; Right.</span>'
        else:
            self.feedback.value = ('<span style="color: #cf222e; font-weight: bold">&#10008; Not quite.</span> '
                                   f"The answer is <b>{html.escape(item.answer_text())}</b>.")
        self.explanation.value = self._explain(item)

    def _explain(self, item: Question) -> str:
        tolerance = ""
        if item.kind == "number":
            tolerance = " (an exact count)" if item.rel == 0 else f" (answers within {item.rel:.0%} count)"
        return (f"<div><b>Why</b>{tolerance}: {html.escape(item.explanation)}</div>"
                f"<div>Revise: {_link(item.section)}</div>")

    def _reveal_written(self, item: Written) -> None:
        self.self_score = widgets.ToggleButtons(options=SCORES, value=None, description="Your score:")
        self.self_score.add_class("specdec-drill-self-score")
        self.self_score.observe(lambda change: self._score_written(item, change["new"]), names="value")
        rubric = "".join(f"<li>{html.escape(point)}</li>" for point in item.rubric_points)
        self.feedback.value = "<i>Compare with the model answer, then score yourself by the rubric.</i>"
        self.explanation.value = (f"<div><b>Model answer.</b> {html.escape(item.model_answer)}</div>"
                                  f"<div><b>Rubric ({item.points:g} point).</b><ul>{rubric}</ul></div>"
                                  f"<div>Revise: {_link(item.section)}</div>")
        self.answer.disabled = True
        self.check_button.disabled = True
        self.answer_box.children = (self.answer, self.self_score)

    def _score_written(self, item: Written, score: float | None) -> None:
        if score is None or self.answered:
            return
        self._record(item, score, self.answer.value)
        self.self_score.disabled = True

    def _record(self, item: Item, score: float, given: str) -> None:
        seconds = self.clock() - self.started
        self.attempts.append(Attempt(item, score, seconds, given))
        self.answered = True
        self.check_button.disabled, self.next_button.disabled = True, False
        if isinstance(self.answer, widgets.Text | widgets.RadioButtons):
            self.answer.disabled = True
        timing = f" &middot; {seconds:.0f} s" if self.timed else ""
        self.score_line.value = self._score_text() + timing
        if self.index == len(self.items) - 1:
            self.next_button.description = "Report"

    def next(self) -> None:
        if not self.answered:
            return
        if self.index < len(self.items) - 1:
            self.index += 1
            self.show()
        else:
            self.finish()

    def finish(self) -> None:
        """The report: score, time per question, sections to revise."""
        total = sum(a.score for a in self.attempts)
        rows = "".join(
            f"<tr><td>{i}</td><td>{a.item.kind}</td><td>{'right' if a.score == 1 else 'wrong' if a.score == 0 else a.score}"
            f"</td><td>{a.seconds:.0f} s{' (over budget)' if self.timed and a.seconds > BUDGET_S[a.item.kind] else ''}"
            f"</td><td>{html.escape(a.item.id)}</td></tr>" for i, a in enumerate(self.attempts, 1))
        revise = revision_list(self.attempts)
        advice = ("<ul>" + "".join(f"<li>{_link(s)}</li>" for s in revise) + "</ul>") if revise else \
            "<p>Nothing to revise: every answer was right.</p>"
        self.header.value = f"<b>{html.escape(self.title)}</b> &middot; done"
        self.prompt.value = (f"<h3>Score {total:g} / {len(self.attempts)}</h3><table>"
                             "<tr><th>#</th><th>kind</th><th>result</th><th>time</th><th>question</th></tr>"
                             f"{rows}</table><p><b>Revise</b></p>{advice}")
        self.answer_box.children = ()
        self.feedback.value = self.explanation.value = ""
        self.check_button.disabled = self.next_button.disabled = True
        self.score_line.value = "Run the cell again for fresh numbers."


def drill_widget(topic: str | None = None, seed: int | None = None, count: int = 5) -> widgets.VBox:
    """``count`` numeric and multiple-choice questions (of one topic or notebook, or all), checked one by one."""
    seed = fresh_seed() if seed is None else seed
    app = DrillApp(draw_questions(seed, count, topic), f"Drill (seed {seed}{', ' + topic if topic else ''})")
    return app.widget


def mock_interview_widget(seed: int | None = None, count: int = 8) -> widgets.VBox:
    """A timed mock interview: numbers, choices and written answers, then a report with what to revise."""
    seed = fresh_seed() if seed is None else seed
    app = DrillApp(mock_interview(seed, count), f"Mock interview (seed {seed})", timed=True)
    return app.widget
