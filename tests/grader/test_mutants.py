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
    r"(test_\w+) \([^;()]*; (?:likely bug|suspected shortcut): (.+?), (?:exact|alike|near) "
    r"match of \d+ catalogued"
)


def named_bugs(reason: str) -> dict[str, str]:
    """test -> the likely bug grades.csv's reason names for it."""
    return dict(LIKELY.findall(reason))


def test_the_mutants_get_their_own_mistake_named_and_no_one_else_any(graded):
    """A bug is named from its failure; a shortcut only where the answer shows it (a table of
    cases, numbers typed in: autograder/evidence.py) or a guard refused it, so shortcuts
    without such evidence get no name at all, never another mistake's."""
    counts = {kind: dict.fromkeys(("right", "wrong", "none", "ambiguous"), 0)
              for kind in ("bug", "shortcut")}  # fmt: skip
    for section, notebook, k in ROUNDS:
        named = named_bugs(graded.rows[(mutants.student_id(k), section)]["reason"])
        owner = {t: a for a, ts in mutants.tests_of_answers(section, notebook).items() for t in ts}
        by_answer = {v.answer: v for v in mutants.rounds(section, notebook)[k]}
        for variant in mutants.rounds(section, notebook)[k]:
            for test in mutants.expected_failures(section, notebook, variant):
                said, label = named.pop(test, None), variant.hint or variant.name
                tied = said is not None and said.startswith("one of ") and label in said
                verdict = (
                    "right" if said == label else "ambiguous" if tied
                    else "none" if said is None else "wrong"
                )  # fmt: skip
                counts[variant.kind][verdict] += 1
        assert not {t for t in named if by_answer.get(owner.get(t)) is None}, named
    bugs, shortcuts = counts["bug"], counts["shortcut"]
    # measured (class run of every catalogue round): bugs 93 % named right; shortcuts 64 %
    # named with their evidence, the rest nothing; a wrong name almost never
    assert bugs["wrong"] <= 0.02 * sum(bugs.values()), counts
    assert bugs["right"] >= 0.9 * sum(bugs.values()), counts
    assert shortcuts["wrong"] <= 0.01 * sum(shortcuts.values()), counts
    assert shortcuts["right"] >= 0.5 * sum(shortcuts.values()), counts
    for section, _ in mutants.sections():
        for student in ("reference", "blank"):
            reason = graded.rows[(student, section)]["reason"]
            assert "likely bug" not in reason and "suspected shortcut" not in reason, student
