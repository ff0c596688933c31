"""Answer similarity for instructors (specdec.course.similarity): copies are flagged for review, honest answers not."""

from __future__ import annotations

import io
import re
from itertools import combinations

import nbformat
import pytest
from copydetect import CodeFingerprint, compare_files

from specdec.course import similarity
from specdec.course.driver import assignments
from specdec.course.similarity import REFERENCE, Match, answers, compare, report_lines
from specdec.paths import REPO_ROOT

SLUG = "04_chain_verify"

SKELETON = '''def verify_chain(p, q, draft, generator=None):
    """Verify gamma drafts left to right; returns the committed tokens (k + 1,)."""
    check_chain(p, q, draft, batched=False)
    # YOUR CODE HERE
    raise NotImplementedError()
'''

SOLUTION = '''    gamma = draft.shape[0]
    committed = []
    for i in range(gamma):
        y = int(draft[i])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if u * float(q[i, y]) < float(p[i, y]):
            committed.append(y)
            continue
        correction = torch.multinomial(residual_distribution(p[i], q[i]), 1, generator=generator)
        return torch.tensor(committed + [int(correction)], dtype=torch.long)
    bonus = torch.multinomial(p[gamma].to(torch.float64), 1, generator=generator)
    return torch.tensor(committed + [int(bonus)], dtype=torch.long)
'''

#: The solution with every name changed and other comments: the same code to a fingerprint.
DISGUISED = '''    n_drafts = draft.shape[0]  # how many drafts
    kept = []
    for j in range(n_drafts):
        tok = int(draft[j])
        r = float(torch.rand((), generator=generator, dtype=torch.float64))  # uniform in [0, 1)
        if r * float(q[j, tok]) < float(p[j, tok]):
            kept.append(tok)
            continue
        fix = torch.multinomial(residual_distribution(p[j], q[j]), 1, generator=generator)
        return torch.tensor(kept + [int(fix)], dtype=torch.long)
    extra = torch.multinomial(p[n_drafts].to(torch.float64), 1, generator=generator)
    return torch.tensor(kept + [int(extra)], dtype=torch.long)
'''

#: Correct answers written independently: no two alike, none like the solution.
HONEST = [
    '''    accepted = []
    for i, tok in enumerate(draft.tolist()):
        u = torch.rand((), generator=generator, dtype=torch.float64).item()
        if u < p[i, tok].item() / q[i, tok].item():
            accepted.append(tok)
        else:
            res = residual_distribution(p[i], q[i])
            accepted.append(torch.multinomial(res, 1, generator=generator).item())
            break
    else:
        accepted.append(torch.multinomial(p[-1].double(), 1, generator=generator).item())
    return torch.tensor(accepted, dtype=torch.long)
''',
    '''    committed = []
    gamma = draft.shape[0]
    for i in range(gamma):
        y = int(draft[i])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if u < float(p[i, y]) / float(q[i, y]):
            committed.append(y)
        else:
            r = residual_distribution(p[i], q[i])
            committed.append(int(torch.multinomial(r, 1, generator=generator)))
            return torch.tensor(committed, dtype=torch.long)
    committed.append(int(torch.multinomial(p[gamma].to(torch.float64), 1, generator=generator)))
    return torch.tensor(committed, dtype=torch.long)
''',
    '''    out = torch.empty(draft.numel() + 1, dtype=torch.long)
    k = 0
    while k < draft.numel():
        ratio = p[k][draft[k]] / q[k][draft[k]]
        if torch.rand(1, generator=generator, dtype=torch.float64).item() >= ratio:
            out[k] = torch.multinomial(residual_distribution(p[k], q[k]), num_samples=1, generator=generator)[0]
            return out[: k + 1]
        out[k] = draft[k]
        k += 1
    out[k] = torch.multinomial(p[k].double(), num_samples=1, generator=generator)[0]
    return out
''',
]


def answer(body: str) -> str:
    """The skeleton's cell with body in place of its placeholder."""
    return SKELETON.replace("    # YOUR CODE HERE\n    raise NotImplementedError()\n", body)


REFERENCE_CELL = answer(f"    ### BEGIN SOLUTION\n{SOLUTION}    ### END SOLUTION\n")


def run(students: dict[str, str], threshold: float = similarity.THRESHOLD) -> list[Match]:
    submissions = {(name, SLUG): {"verify_chain": code} for name, code in students.items()}
    return compare(submissions, {SLUG: {"verify_chain": REFERENCE_CELL}}, {SLUG: {"verify_chain": SKELETON}},
                   threshold)


def test_answers_are_the_code_answer_cells():
    cells = [nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"solution": True, "grade_id": "one"}}),
             nbformat.v4.new_markdown_cell("prose", metadata={"nbgrader": {"solution": True, "grade_id": "written"}}),
             nbformat.v4.new_code_cell("assert x", metadata={"nbgrader": {"solution": False, "grade_id": "test"}}),
             nbformat.v4.new_code_cell("y = 2", metadata={"nbgrader": "not an object"}),
             nbformat.v4.new_code_cell("z = 3", metadata={"nbgrader": {"solution": True, "grade_id": 7}}),
             nbformat.v4.new_code_cell("print()")]
    assert answers(nbformat.v4.new_notebook(cells=cells)) == {"one": "x = 1"}


@pytest.mark.parametrize("slug", assignments())
def test_every_reference_answer_has_its_released_skeleton(slug):
    reference = answers(nbformat.read(REPO_ROOT / "grader" / "source" / slug / f"{slug}.ipynb", as_version=4))
    released = answers(nbformat.read(REPO_ROOT / "notebooks" / f"{slug}.ipynb", as_version=4))
    assert reference and reference.keys() == released.keys()
    assert all("### BEGIN SOLUTION" in code for code in reference.values())
    assert not any("### BEGIN SOLUTION" in code for code in released.values())


def test_a_pasted_reference_is_found_also_with_names_and_comments_changed():
    matches = run({"alice": REFERENCE_CELL, "bob": answer(DISGUISED), "carol": answer(HONEST[0])})
    assert {(m.first, m.second) for m in matches} == {("alice", REFERENCE), ("bob", REFERENCE), ("alice", "bob")}
    assert all(m.score == 1.0 and (m.assignment, m.exercise) == (SLUG, "verify_chain") for m in matches)


def test_two_students_sharing_an_answer_are_paired():
    shared = HONEST[2].replace("out", "result").replace("    k = 0\n", "    k = 0  # position\n")
    matches = run({"dan": answer(HONEST[2]), "erin": answer(shared), "frank": answer(HONEST[1])})
    assert matches == [Match(SLUG, "verify_chain", "dan", "erin", 1.0)]


def test_honest_distinct_answers_are_not_paired():
    assert run({f"student{i}": answer(body) for i, body in enumerate(HONEST)}) == []


def test_blank_skeletons_and_short_answers_are_never_compared():
    short = answer("    return torch.cat([draft, p[-1].argmax().view(1)])\n")  # the same few tokens, written alike
    students = {"gina": SKELETON, "hal": SKELETON, "ivy": short, "jo": short, "kim": ""}
    assert run(students, threshold=0.0) == []


def test_report_lines_escape_names():
    evil = "mallory\x1b[2J\nsimilarity: fake line\u202e"
    matches = run({evil: REFERENCE_CELL, "zed": REFERENCE_CELL})
    lines = report_lines(matches)
    assert len(lines) == len(matches) == 3
    assert all("\n" not in line and "\x1b" not in line and "\u202e" not in line for line in lines)
    assert lines[0] == (f"similarity: mallory\\x1b[2J\\nsimilarity: fake line\\u202e/{SLUG} exercise verify_chain: 1.00 "
                        "like the reference (for review; not penalised)")
    assert lines[1].endswith(": 1.00 like zed (for review; not penalised)")


def test_matches_are_ordered_whatever_the_order_of_submissions():
    students = {"uma": answer(HONEST[2]), "vic": REFERENCE_CELL, "walt": answer(DISGUISED),
                "xena": answer(HONEST[2].replace("    k += 1\n", "    k = k + 1\n")), "yan": answer(HONEST[0])}
    forward, backward = run(students), run(dict(reversed(students.items())))
    assert forward == backward
    assert [(m.first, m.second) for m in forward] == [("vic", REFERENCE), ("vic", "walt"), ("walt", REFERENCE),
                                                      ("uma", "xena")]
    assert [m.score for m in forward] == sorted((m.score for m in forward), reverse=True)
    assert forward[-1].score < 1.0


def test_scores_are_copydetects_overlap_fractions():
    """Without boilerplate, the score is the smaller of compare_files' two fractions."""
    codes = [re.sub(r".*### (BEGIN|END) SOLUTION\n", "", REFERENCE_CELL)] + [answer(body) for body in HONEST]
    ours = [similarity._own(code, set()) for code in codes]
    theirs = [CodeFingerprint("answer.py", similarity.NOISE, 1, language="python", fp=io.StringIO(code))
              for code in codes]
    for i, j in combinations(range(len(codes)), 2):
        _, fractions, _ = compare_files(theirs[i], theirs[j])
        assert similarity._score(ours[i], ours[j], 0.0) == pytest.approx(min(fractions), abs=1e-12)
