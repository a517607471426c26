"""Test the tests with the mutant catalogue (tests/grader/mutants), graded in the class run.

Each round of a section is one student's tests-only submission holding several wrong answers;
the tests that lose their points must be exactly those the round's variants name: each variant
is caught by its own test, and costs no other exercise its points. And graded as students,
the mutants get their own mistake named in grades.csv's reason (autograder/likely_bugs.py),
the reference and the blank notebooks none.
"""

from __future__ import annotations

import re

import pytest

from autograder.course import gradebook_url, open_gradebook
from tests.grader import mutants

ROUNDS = [
    (section, notebook, k)
    for section, notebook in mutants.sections()
    for k in range(len(mutants.rounds(section, notebook)))
]


@pytest.mark.parametrize(("section", "notebook", "k"), ROUNDS)
def test_each_round_fails_exactly_the_tests_its_mutants_name(graded, section, notebook, k):
    student = mutants.student_id(k)
    row = graded.rows[(student, section)]
    assert row["status"] == "graded", row
    with open_gradebook(gradebook_url(graded.course / "autograder" / "gradebook.db")) as gb:
        grades = gb.find_submission_notebook(notebook, section, student).grades
        scores = {g.name: (g.score, g.max_score) for g in grades if g.max_score_gradecell}
    lost = {name for name, (score, max_score) in scores.items() if score < max_score}
    problems = []
    for variant in mutants.rounds(section, notebook)[k]:
        for test in sorted(mutants.expected_failures(section, notebook, variant) - lost):
            problems.append(f"{variant.answer} ({variant.name}) passed {test}")
    named = set().union(
        *(
            mutants.expected_failures(section, notebook, v)
            for v in mutants.rounds(section, notebook)[k]
        )
    )
    problems += [f"{test} lost its points, but no mutant of the round names it" for test in
                 sorted(lost - named)]  # fmt: skip
    assert not problems, f"{section} {student}: " + "; ".join(problems)


LIKELY = re.compile(
    r"(test_\w+) \([^;()]*; likely bug: (.+?), (?:exact|alike|near) match of \d+ catalogued"
)


def named_bugs(reason: str) -> dict[str, str]:
    """test -> the likely bug grades.csv's reason names for it."""
    return dict(LIKELY.findall(reason))


def test_the_mutants_get_their_own_mistake_named_and_no_one_else_any(graded):
    right = wrong = none = ambiguous = 0
    for section, notebook, k in ROUNDS:
        named = named_bugs(graded.rows[(mutants.student_id(k), section)]["reason"])
        owner = {t: a for a, ts in mutants.tests_of_answers(section, notebook).items() for t in ts}
        by_answer = {v.answer: v for v in mutants.rounds(section, notebook)[k]}
        for variant in mutants.rounds(section, notebook)[k]:
            for test in mutants.expected_failures(section, notebook, variant):
                said, label = named.pop(test, None), variant.hint or variant.name
                tied = said is not None and said.startswith("one of ") and label in said
                right += said == label
                ambiguous += tied  # it and the mistakes that fail exactly alike, named
                wrong += said not in (None, label) and not tied
                none += said is None
        assert not {t for t in named if by_answer.get(owner.get(t)) is None}, named
    total = right + wrong + none + ambiguous
    # measured by `python -m autograder.likely_bugs evaluate`: about 97 % right, none wrong;
    # most of the rest are tests that fail two mistakes exactly alike, both named
    assert wrong <= 0.02 * total and right >= 0.9 * total, (right, wrong, none, ambiguous)
    for section, _ in mutants.sections():
        for student in ("reference", "blank"):
            assert "likely bug" not in graded.rows[(student, section)]["reason"], student
