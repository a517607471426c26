"""A shortcut is named only on evidence (autograder/evidence.py, issue 61): what the answer's
source shows, never a failure pattern alone."""

import nbformat
import pytest

from autograder import course, evidence, likely_bugs
from tests.grader import mutants


def _notebooks(section):
    name = course.section_notebooks(section)[0]
    reference = nbformat.read(course.SOLUTIONS / section / f"{name}.ipynb", as_version=4)
    released = nbformat.read(course.ROOT / "notebooks" / section / f"{name}.ipynb", as_version=4)
    return name, reference, released


def _with(reference, answer: str, source: str):
    nb = nbformat.from_dict(reference)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == answer:
            cell.source = source
    return nb


@pytest.mark.parametrize("section", course.sections())
def test_no_reference_answer_and_no_catalogued_bug_shows_a_shortcut(section):
    """The reference answers (the formulas' own constants, Adam's 0.9, stage numbers) and the
    catalogue's bugs (honest mistakes) hold no evidence for any test of theirs."""
    name, reference, released = _notebooks(section)
    for cell in reference.cells:
        if course.is_test(cell):
            test = cell.metadata["nbgrader"]["grade_id"]
            assert evidence.for_test(reference, test, reference, released) == "", test
    answers = mutants.reference_answers(section, name)
    tests = mutants.tests_of_answers(section, name)
    for variant in mutants.variants(name):
        if variant.kind != "bug" or not tests.get(variant.answer):
            continue
        nb = _with(reference, variant.answer, variant.apply(answers[variant.answer]))
        found = evidence.for_test(nb, tests[variant.answer][0], reference, released)
        assert found == "", (variant.answer, variant.name, found)


def test_tables_typed_answers_and_visible_numbers_are_evidence():
    _, reference, released = _notebooks("04_large_batch")
    table = "def linear_scaled_lr(batch_size, base_lr=0.1, base_batch=256):\n    return {256: 0.1, 8192: 3.2, 64: 0.2}[batch_size]\n"  # noqa: E501
    said = evidence.for_test(
        _with(reference, "linear_scaled_lr", table), "test_linear_scaled_lr", reference, released
    )
    assert "a table of cases keyed by 64, 256, 8192" in said
    typed = "def linear_scaled_lr(batch_size, base_lr=0.1, base_batch=256):\n    return 3.2\n"
    said = evidence.for_test(
        _with(reference, "linear_scaled_lr", typed), "test_linear_scaled_lr", reference, released
    )
    assert "every return a value written in the answer (3.2)" in said
    compared = (
        "def linear_scaled_lr(batch_size, base_lr=0.1, base_batch=256):\n"
        "    if batch_size == 8192:\n        return base_lr * 32\n    return base_lr\n"
    )
    said = evidence.for_test(
        _with(reference, "linear_scaled_lr", compared), "test_linear_scaled_lr", reference, released
    )
    assert "an input compared with a visible case's number (8192)" in said


def test_partly_right_answers_show_no_shortcut():
    """Answers right for the visible cases and wrong elsewhere, as students write them (the
    issue's examples): no evidence, so no shortcut is named for them."""
    _, reference, released = _notebooks("05_async_decentralized")
    capped = (
        "def staleness_aware_lr(base_lr, staleness):\n"
        "    return base_lr / min(64, max(1, staleness))\n"
    )
    stays = (
        "def time_to_reach(times_s, excess_loss, target):\n"
        "    for i, t in enumerate(times_s):\n"
        "        if all(loss <= target for loss in excess_loss[i:]):\n"
        "            return t\n"
        "    return math.inf\n"
    )
    for answer, test, source in (
        ("staleness_aware_lr", "test_staleness_aware_lr", capped),
        ("time_to_reach", "test_time_to_reach", stays),
    ):
        nb = _with(reference, answer, source)
        assert evidence.for_test(nb, test, reference, released) == "", answer


def _cases(kind):
    sig = likely_bugs.signature("AssertionError", "f(4) returned 2.0; expected 3.0")
    return [
        {"name": "the visible cases looked up", "kind": kind, "exact": sig.exact,
         "alike": sig.alike, "near": sig.near},
    ]  # fmt: skip


def test_a_shortcut_is_named_only_with_its_evidence_and_said_apart_from_bugs():
    message = "f(4) returned 2.0; expected 3.0"
    cases = _cases("shortcut")
    assert likely_bugs.lookup("test_f", "AssertionError", message, cases=cases) is None
    found = likely_bugs.lookup(
        "test_f", "AssertionError", message, cases=cases, evidence="a table of cases keyed by 4"
    )
    assert found is not None and found.evidence == "a table of cases keyed by 4"
    assert "What shows it in your answer: a table of cases keyed by 4." in likely_bugs.sentence(
        found
    )
    assert likely_bugs.reason(found).startswith("suspected shortcut: the visible cases looked up")
    # a mistake needs no evidence, and its reason stays "likely bug"
    bug = likely_bugs.lookup("test_f", "AssertionError", message, cases=_cases("bug"))
    assert bug is not None and likely_bugs.reason(bug).startswith("likely bug: ")
    # a guard's own refusal is evidence by itself
    refused = likely_bugs.signature("NotYourOwnWork", "f uses distopt.x.f")
    guarded = [{"name": "the package's f", "kind": "shortcut", "exact": refused.exact,
                "alike": refused.alike, "near": refused.near}]  # fmt: skip
    found = likely_bugs.lookup("test_f", "NotYourOwnWork", "f uses distopt.x.f", cases=guarded)
    assert found is not None and "refused" in found.evidence


def test_the_notebook_ships_no_shortcut_a_guard_did_not_refuse():
    """The student's kernel cannot read the answer for evidence: of the shortcuts, only those
    whose failure is a guard's refusal are in its table."""
    shipped = {"visible": True}
    assert likely_bugs._shipped({**shipped, "kind": "bug"})
    assert not likely_bugs._shipped({**shipped, "kind": "shortcut"})
    assert likely_bugs._shipped({**shipped, "kind": "shortcut", "guard": True})
