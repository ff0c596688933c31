"""Answers too alike, for an instructor to read: flagged for review, never penalised (cohort grading).

Each code answer is fingerprinted once with copydetect, MOSS's method: Pygments tokens with every name written
``V`` and every string ``S``, comments and whitespace dropped, and every run of NOISE characters of that filtered
code hashed (copydetect's defaults; a winnowing window of 1 keeps every hash, so the scores do not depend on
Python's per-process salting of ``hash``). Renamed variables and rewritten comments change nothing. Code the
released skeleton holds (signature, docstring, argument checks, ``raise NotImplementedError()``) is taken out: a
fingerprint that touches it does not count. An answer with under MIN_OWN characters of filtered code of its own
is never compared: everyone who gets a short exercise right writes much the same thing.

The score of two answers is copydetect's overlap fraction (``compare_files``: the characters under fingerprints
found in the other answer, over the characters under all of its fingerprints) of each, the smaller of the two:
both answers are mostly the same code. It is computed from the fingerprints, pair by pair, as compare_files
computes it.

MIN_OWN and THRESHOLD were measured on the course's reference answers (36 of its 91 exercises have 100 or more
characters of their own). Against the reference, honest answers written independently scored: different
algorithms at most 0.39 (0.52 between two of them); the obvious algorithm, at 100 or more characters, at most 0.60,
but at 80 to 95 characters 0.70 to 0.82 and under 80 up to 0.94. The reference itself with names and comments
changed scores 1.00; with one line dropped or added, 0.75 to 1.00; padded with a four-line helper, 0.68 to 1.00
(23 of 36 reported). Independent statements reordered score 0.00 to 0.60: not reported.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from itertools import combinations

import nbformat
import numpy as np
from copydetect import CodeFingerprint

from specdec.course.inert import visible

REFERENCE = "the reference"  # Match.second for the instructor's solution
NOISE = 25  # characters of filtered code under one fingerprint (copydetect's default noise threshold)
MIN_OWN = 100  # characters of filtered code under an answer's own fingerprints for it to be compared
THRESHOLD = 0.75  # the score from which a pair is reported
ANSWER_LIMIT = 20_000  # characters of an answer read (the longest reference answer has about 3,800)
NAME_LIMIT = 200  # characters of a name shown in a report line

_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|$)", re.MULTILINE)


@dataclass(frozen=True)
class Match:
    assignment: str
    exercise: str  # the answer cell's grade_id
    first: str  # a student
    second: str  # another student, or REFERENCE
    score: float  # 0..1: the smaller of copydetect's two overlap fractions


@dataclass(frozen=True)
class _Fingerprints:
    runs: list[tuple[int, int]]  # (where in the filtered code, hash) of each fingerprint, in order
    hashes: frozenset[int]
    coverage: int  # characters of filtered code under the fingerprints (copydetect's token_coverage)


def answers(nb: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> source of every code answer cell (metadata.nbgrader.solution true and cell_type code); a cell
    without a grade_id that is text is skipped, and of two with one grade_id the first is kept."""
    found: dict[str, str] = {}
    for cell in nb.cells:
        meta = cell.get("metadata")
        grading = meta.get("nbgrader") if isinstance(meta, dict) else None
        if (cell.get("cell_type") == "code" and isinstance(grading, dict) and grading.get("solution") is True
                and isinstance(grading.get("grade_id"), str) and isinstance(cell.get("source"), str)):
            found.setdefault(grading["grade_id"], cell["source"])
    return found


def _fingerprint(code: str) -> CodeFingerprint:
    return CodeFingerprint("answer.py", NOISE, 1, language="python", fp=io.StringIO(code[:ANSWER_LIMIT]))


def _own(code: str, boilerplate: set[int]) -> _Fingerprints | None:
    """The answer's fingerprints that hold none of the boilerplate's (no character a boilerplate fingerprint
    covers), or None when they cover under MIN_OWN characters."""
    found = _fingerprint(code)
    covered = np.zeros(len(found.filtered_code), dtype=bool)
    for value in found.hashes & boilerplate:
        for start in found.hash_idx[value]:
            covered[start:start + NOISE] = True
    seen = np.concatenate([[0], np.cumsum(covered)])
    clean = seen[NOISE:] == seen[:-NOISE]  # clean[i]: the run starting at i holds no boilerplate
    runs = sorted((int(start), int(value)) for value, starts in found.hash_idx.items() for start in starts if clean[start])
    coverage = _covered([start for start, _ in runs])
    return _Fingerprints(runs, frozenset(value for _, value in runs), coverage) if coverage >= MIN_OWN else None


def _covered(starts: list[int]) -> int:
    """Characters under the runs of NOISE characters starting at starts (in order): copydetect's slices."""
    return sum(min(NOISE, after - before) for before, after in zip(starts, starts[1:])) + NOISE if starts else 0


def _score(a: _Fingerprints, b: _Fingerprints, threshold: float) -> float | None:
    """The smaller overlap fraction of a and b, or None when it is under the threshold."""
    if a is b:  # the same code (each text is fingerprinted once)
        return 1.0
    shared = a.hashes & b.hashes
    fractions = []
    for answer in (a, b):
        fractions.append(_covered([start for start, value in answer.runs if value in shared]) / answer.coverage)
        if fractions[-1] < threshold:
            return None
    return min(fractions)


def compare(submissions: dict[tuple[str, str], dict[str, str]], references: dict[str, dict[str, str]],
            skeletons: dict[str, dict[str, str]], threshold: float = THRESHOLD) -> list[Match]:
    """Pairs of answers to the same exercise that are too alike: each student's answer against the reference, and
    every two students' answers against each other. Code the released skeleton already holds (its signature,
    docstring, `raise NotImplementedError`) is boilerplate and does not count; an answer with too little of its own
    code (left blank, or a few tokens) is never compared. The exercises are the reference's and the skeleton's
    grade_ids. Sorted by assignment, exercise, score (highest first) and names."""
    matches = []
    for assignment in sorted({assignment for _, assignment in submissions}):
        reference, skeleton = references.get(assignment, {}), skeletons.get(assignment, {})
        students = sorted(student for student, each in submissions if each == assignment)
        for exercise in sorted(set(reference) | set(skeleton)):
            boilerplate = _fingerprint(skeleton.get(exercise, "")).hashes
            by_code: dict[str, _Fingerprints | None] = {}  # identical answers (blank ones, say) fingerprinted once
            own: dict[str | None, _Fingerprints] = {}  # None: the reference (no folder name can be None)
            for student in students:
                code = submissions[student, assignment].get(exercise)
                if code is not None and code not in by_code:
                    by_code[code] = _own(code, boilerplate)
                if code is not None and by_code[code] is not None:
                    own[student] = by_code[code]
            if exercise in reference and (solution := _own(_MARKER.sub("", reference[exercise]), boilerplate)):
                own[None] = solution
            for first, second in combinations(own, 2):  # the reference, last, is only ever second
                score = _score(own[first], own[second], threshold)
                if score is not None:
                    matches.append(Match(assignment, exercise, first, REFERENCE if second is None else second, score))
    return sorted(matches, key=lambda m: (m.assignment, m.exercise, -m.score, m.first, m.second))


def report_lines(matches: list[Match]) -> list[str]:
    """Lines for report.txt, e.g. 'similarity: alice/01_cost_ledger exercise arithmetic_intensity: 0.93 like bob
    (for review; not penalised)'."""
    return [f"similarity: {visible(m.first, NAME_LIMIT)}/{visible(m.assignment, NAME_LIMIT)} exercise "
            f"{visible(m.exercise, NAME_LIMIT)}: {m.score:.2f} like "
            f"{m.second if m.second == REFERENCE else visible(m.second, NAME_LIMIT)} (for review; not penalised)"
            for m in matches]
