"""Reports carry no text the student's code chose (issue 53, item 8): every message the grader
can word from what the kernel said (the tampering report of autograder/integrity.py, the error
names of failed tests and cells in autograder/outcomes.py, the sealed feedback page of
autograder/nbgrader_plugins.py) is tried here with hidden test lines, base64-encoded, in every
field the kernel controls, and must quote none of it. Without a kernel; test_hostile.py grades
the same attack (the catalogue's ``base64-modules``) and reads grades.csv, report.md and the
feedback page."""

from __future__ import annotations

import base64
import dataclasses
import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from autograder import integrity, outcomes, results
from autograder.nbgrader_plugins import HideHiddenTests
from tests.helpers import graded_cell

HIDDEN = "assert f(2) == 4, 'secret case'"
SECRET = base64.b64encode(HIDDEN.encode()).decode()  # what a student's cell can compute
LEAKS = (HIDDEN, SECRET, "secret case", "c2VjcmV0")  # "c2VjcmV0": base64 of "secret"
TEST_SOURCE = f"assert f() == 1\n### BEGIN HIDDEN TESTS\n{HIDDEN}\n### END HIDDEN TESTS"


def _clean(text: str) -> bool:
    return not any(leak in text for leak in LEAKS)


def _baseline() -> dict:
    return {
        "modules": {"numpy": 1, "math": 2},
        "ids": {"numpy.allclose": 10, "math.isclose": 11},
        "foreign": [],
        "hooks": {"custom_exceptions": "()", "shell.run_cell": 5},
        "names": {"open": "shadows built-in:open"},
    }


def _hostile() -> dict:
    """A fingerprint a tampering kernel sends: student-chosen text wherever text goes."""
    now = _baseline()
    now["modules"] = {"numpy": 99, "math": 2, SECRET: 3}
    now["ids"] = {"numpy.allclose": 98, "math.isclose": 11, f"numpy.{SECRET}": 1}
    now["foreign"] = [f"distopt.{SECRET}.f", f"numpy.{SECRET}", "distopt.grading.own_work"]
    now["hooks"] = {"custom_exceptions": f"(<class '{SECRET}'>,)", "shell.run_cell": 6, SECRET: 1}
    now["names"] = {
        SECRET: f"fake module:{SECRET}",  # a name made with globals()[...], any text
        "fake0": f"fake module:{SECRET}",
        "np": f"fake module:{SECRET}",
        f"x{SECRET[:-2]}": "object:",  # once bound to a genuine module registered as SECRET
        "math": "object:",
        "filter": "shadows built-in:filter",
        f"{SECRET}_all": f"shadows built-in:{SECRET}",
    }
    return now


def _tampering_words() -> list[str]:
    seen = {f"x{SECRET[:-2]}": SECRET, "math": "math"}
    tests = {"filter", f"{SECRET}_all", "f"}  # every identifier of the tests, hidden ones too
    return integrity.differences(_baseline(), _hostile(), seen, tests, {"f", "np", "assert"})


def test_the_tampering_report_quotes_no_name_the_kernel_chose():
    found = _tampering_words()
    for change in found:
        assert _clean(change), change
        assert len(change) <= integrity.CHANGE_CHARS
    # ... and still says what happened, with the names the grader knows
    assert "the module numpy was replaced in sys.modules" in found
    assert "numpy.allclose was replaced" in found
    assert "distopt.grading.own_work was replaced by notebook code" in found
    assert "2 functions of package modules defined by notebook code" in found
    assert "the kernel's custom_exceptions was changed" in found
    assert "the notebook's name 'np' is a fake module" in found
    assert "2 names of the notebook: fake modules" in found
    assert "the name 'math' no longer refers to the module math" in found
    assert "1 name of the notebook: no longer the modules held" in found
    assert "the notebook's name 'filter' is a function shadowing the built-in" in found
    tampered = outcomes.Tampered(cell=5, grade_id="test_f", when="before", changes=tuple(found))
    status, reason = results.words([outcomes.Graded(notebook="nb"), tampered])
    for text in (tampered.phrase(), tampered.message(), status, reason):
        assert _clean(text), text


@pytest.mark.parametrize("name", [SECRET, "a" * 61, "numpy.f(x)", "", None, 12])
def test_only_short_known_identifiers_are_quotable(name):
    assert not integrity.quotable(name, {"a" * 61, "numpy", "f", SECRET})


def test_visible_names_leave_out_the_hidden_tests():
    names = integrity.visible_names([TEST_SOURCE])
    assert "f" in names and "secret" not in names and "case" not in names


@pytest.mark.parametrize(
    "known", ["ValueError", "AssertionError", "NotYourOwnWork", "LaunchTimeout", "IntegrityError"]
)
def test_error_names_the_grader_knows_are_quoted(known):
    assert outcomes.error_name(known) == known
    assert outcomes.FailedTest(grade_id="test_f", why=known).phrase() == f"test_f ({known})"


@pytest.mark.parametrize("chosen", [SECRET, "MyOwnError", "x" * 500])
def test_an_error_class_the_notebook_named_is_not_quoted(chosen):
    failed = outcomes.FailedTest(grade_id="test_f", why=chosen)
    raised = outcomes.CellRaised(cell=3, grade_id="f", ename=chosen)
    status, reason = results.words([outcomes.Graded(notebook="nb"), failed, raised])
    for text in (failed.phrase(), raised.phrase(), status, reason):
        assert chosen not in text and _clean(text), text
    assert outcomes.UNLISTED_ERROR in reason


def _filled(kind: type, text: str):
    """An outcome of ``kind`` with ``text`` in every text field (and tuples of it)."""
    values = {}
    for field in dataclasses.fields(kind):
        if field.type in ("str", "str | None"):
            values[field.name] = text
        elif field.type == "tuple[str, ...]":
            values[field.name] = (text,) * 50
        elif field.type in ("int", "float"):
            values[field.name] = 3
    return kind(**values)


@pytest.mark.parametrize("kind", sorted(outcomes.KINDS.values(), key=lambda k: k.__name__), ids=str)
def test_every_outcome_says_a_bounded_amount_whatever_its_fields_hold(kind):
    outcome = _filled(kind, "A" * 10_000)
    said = [outcome.phrase(), outcome.page()]
    if isinstance(outcome, outcomes.CellOutcome):
        said.append(outcome.message())
        output = json.dumps(outcome.output())  # the message, as value and traceback
        assert len(output) <= 2 * len(said[-1]) + 200, (kind.__name__, len(output))
    for text in said:
        assert len(text) <= 1_000, (kind.__name__, len(text))


# The outcomes whose fields hold what the kernel wrote (an error's name) or what the grader
# words from it (the tampering changes, from integrity.differences): none quotes it. (The
# others quote what the grader read itself, the submitted file's name or its JSON error, which
# the student handed in before grading: bounded above.)
FROM_THE_KERNEL = {
    outcomes.FailedTest: lambda: outcomes.FailedTest(grade_id="test_f", why=SECRET),
    outcomes.CellRaised: lambda: outcomes.CellRaised(cell=2, ename=SECRET),
    outcomes.Tampered: lambda: outcomes.Tampered(
        cell=2, when="before", changes=tuple(_tampering_words())
    ),
}


@pytest.mark.parametrize("kind", list(FROM_THE_KERNEL), ids=lambda k: k.__name__)
def test_no_outcome_quotes_what_the_kernel_chose(kind):
    outcome = FROM_THE_KERNEL[kind]()
    said = [outcome.phrase(), outcome.page(), *results.words([outcome])]
    if isinstance(outcome, outcomes.CellOutcome):
        said += [outcome.message(), json.dumps(outcome.output())]
    for text in said:
        assert _clean(text), text


def test_the_sealed_page_quotes_no_error_name_the_notebook_chose():
    test = graded_cell("test_f", TEST_SOURCE, test=True, cell_id="t")
    test.outputs = []
    later = graded_cell("test_g", "assert g() == 0", test=True, cell_id="u")
    later.outputs = [
        new_output("error", ename=SECRET, evalue=SECRET,
                   traceback=[f"Cell In[6], line 1\n  assert g() == 0\n{SECRET}: {SECRET}"])
    ]  # fmt: skip
    changes = tuple(_tampering_words())
    outcomes.record(later, outcomes.Tampered(cell=2, when="before", changes=changes))
    student = new_code_cell("print(In)")
    student.outputs = [new_output("stream", name="stdout", text=SECRET)]
    nb = new_notebook(cells=[test, later, student])
    nb, _ = HideHiddenTests().preprocess(nb, {})
    page = nbformat.writes(nb)
    assert _clean(page), [o for c in nb.cells for o in c.get("outputs", [])]
    enames = [o.get("ename") for o in nb.cells[1].outputs]
    assert enames == [outcomes.UNLISTED_ERROR, "IntegrityError"], enames


@pytest.mark.parametrize("forged", [[], {"modules": SECRET}, {"names": {SECRET: 1}}, "x"])
def test_a_forged_fingerprint_is_said_in_fixed_words(forged):
    assert integrity.differences(_baseline(), forged, {}, set()) == [
        "the integrity check got an answer it cannot read (a forged fingerprint)"
    ]


@pytest.mark.parametrize(("answer", "count"), [("12", 12), ("9" * 7, None), (SECRET, None)])
def test_the_count_of_ended_processes_is_at_most_six_digits(answer, count):
    """The kernel answers the strays request (autograder/strays.py): a longer count could
    carry hidden text, as digits, into the cell's note and grades.csv."""
    from jupyter_core.utils import run_sync

    from autograder.nbgrader_plugins import ExecuteUntilKernelDeath

    step = ExecuteUntilKernelDeath()

    async def answered(code, expressions):
        return {"user_expressions": {"n": {"status": "ok", "data": {"text/plain": answer}}}}

    step._async_silent = answered
    assert run_sync(step._async_end_strays)() == count
