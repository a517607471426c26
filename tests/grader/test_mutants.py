"""Test the tests with the mutant catalogue (tests/grader/mutants), graded in the class run.

Each round of a section is one student's tests-only submission holding several wrong answers;
the tests that lose their points must be exactly those the round's variants name: each variant
is caught by its own test, and costs no other exercise its points.
"""

from __future__ import annotations

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
