"""The mutant catalogue (tests/grader/mutants) covers every graded exercise and fits the notebooks.

Fast: nothing is graded here (tests/grader/test_mutants.py grades the rounds in the class run).
"""

from __future__ import annotations

import pytest

from tests.grader import mutants

SECTIONS = mutants.sections()


@pytest.mark.parametrize(("section", "notebook"), SECTIONS)
def test_every_answer_has_two_bugs_and_two_shortcuts(section, notebook):
    answers = mutants.reference_answers(section, notebook)
    found = mutants.variants(notebook)
    unknown = {v.answer for v in found} - set(answers)
    assert not unknown, f"{notebook}: variants of answers that do not exist: {sorted(unknown)}"
    short = [
        f"{answer} ({kind}s: {count})"
        for answer in answers
        for kind in ("bug", "shortcut")
        if (count := sum(v.answer == answer and v.kind == kind for v in found)) < 2
    ]
    assert not short, f"{notebook}: fewer than 2 bugs or 2 shortcuts for " + ", ".join(short)


@pytest.mark.parametrize(("section", "notebook"), SECTIONS)
def test_every_variant_applies_and_names_tests_of_the_notebook(section, notebook):
    answers = mutants.reference_answers(section, notebook)
    tests = {t for ts in mutants.tests_of_answers(section, notebook).values() for t in ts}
    for variant in mutants.variants(notebook):
        source = variant.apply(answers[variant.answer])  # raises if a bug's patch does not apply
        assert source != answers[variant.answer], f"{variant.name} changes nothing"
        assert set(variant.fails) <= tests, (variant.name, sorted(set(variant.fails) - tests))
        assert mutants.expected_failures(section, notebook, variant), variant.name


def test_rounds_hold_each_variant_once_and_then_the_cascade_round():
    for section, notebook in SECTIONS:
        rounds = mutants.rounds(section, notebook)
        by_answer = {v.answer for v in mutants.variants(notebook)}
        depth = max((sum(v.answer == a for v in mutants.variants(notebook)) for a in by_answer),
                    default=0)  # fmt: skip
        held = [v for r in rounds[:depth] for v in r]
        assert sorted(held, key=repr) == sorted(mutants.variants(notebook), key=repr), notebook
        for r in rounds:
            answers = [v.answer for v in r]
            assert len(answers) == len(set(answers)), (notebook, "one variant per answer per round")
        built_on = {a for a, users in mutants.dependants(section, notebook).items() if users}
        if built_on & by_answer:
            assert {v.answer for v in rounds[-1]} == built_on & by_answer, notebook
