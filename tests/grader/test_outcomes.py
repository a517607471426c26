"""Outcomes as data (autograder/outcomes.py) and the words of grades.csv (autograder/results.py).

Every outcome has an example here: it must survive the trip through a notebook's metadata,
and the rows built from outcomes must read as the README's status table says. The execute
step's own records are tested without a kernel in test_nbgrader_plugins.py.
"""

from __future__ import annotations

import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from autograder import outcomes
from autograder.outcomes import (
    AutograderFailure,
    CellRaised,
    CellTimeout,
    FailedTest,
    Graded,
    InvalidNotebook,
    KernelDied,
    KernelLost,
    Missing,
    NbgraderFailed,
    NoFeedback,
    NotRun,
    OutputCut,
    Repaired,
    ShowOnly,
    StraysEnded,
    Tampered,
    UnreadableCells,
)
from autograder.results import category, words

EXAMPLES = {
    Graded: Graded(notebook="nb"),
    Missing: Missing(notebook="nb", found=("final.ipynb",)),
    InvalidNotebook: InvalidNotebook(file="nb.ipynb", why="the file is empty"),
    UnreadableCells: UnreadableCells(error="KeyError: 'cells'"),
    NbgraderFailed: NbgraderFailed(last_line="[ERROR] no such assignment"),
    AutograderFailure: AutograderFailure(error="OSError: disk full"),
    NoFeedback: NoFeedback(notebook="nb"),
    FailedTest: FailedTest(grade_id="test_f", why="AssertionError"),
    CellRaised: CellRaised(cell=3, grade_id="f", ename="SyntaxError"),
    Repaired: Repaired(what="ignored extra files: numpy.py"),
    KernelDied: KernelDied(cell=7, grade_id="g", cause="os._exit"),
    KernelLost: KernelLost(cell=7, grade_id="g", cause="ValueError: bad message"),
    NotRun: NotRun(cell=8, grade_id="test_g", after=7),
    CellTimeout: CellTimeout(cell=7, grade_id="g", limit_s=120),
    Tampered: Tampered(cell=8, grade_id="test_g", when="before", changes=("np.x was replaced",)),
    OutputCut: OutputCut(cell=4, limit_bytes=1000),
    StraysEnded: StraysEnded(cell=4, grade_id="f", count=243),
    ShowOnly: ShowOnly(cell=5),
}


def test_every_outcome_has_an_example():
    assert set(outcomes.KINDS.values()) == set(EXAMPLES)


@pytest.mark.parametrize("kind", sorted(EXAMPLES, key=lambda k: k.__name__), ids=str)
def test_each_outcome_survives_json_and_has_words(kind):
    outcome = EXAMPLES[kind]
    assert outcomes.from_json(outcome.to_json()) == outcome
    assert outcome.phrase()
    if isinstance(outcome, outcomes.CellOutcome):
        assert outcome.output()["output_type"] in ("error", "stream")


def test_a_record_that_is_not_an_outcome_is_refused():
    with pytest.raises(ValueError, match="not an outcome record"):
        outcomes.from_json({"outcome": "CellOutcome", "cell": 1})
    with pytest.raises(ValueError, match="not an outcome record"):
        outcomes.from_json({"cell": 1})


def test_records_live_in_the_cell_and_are_written_once():
    cell = new_code_cell("f()")
    died = EXAMPLES[KernelDied]
    outcomes.record(cell, died)
    outcomes.record(cell, died)
    assert outcomes.recorded(cell) == [died]
    assert [o["ename"] for o in cell.outputs] == ["KernelDied"]
    assert outcomes.wrote(cell, cell.outputs[0])
    # The student's own error of that name is not the autograder's.
    forged = new_output("error", ename="KernelDied", evalue="hidden line", traceback=[])
    assert not outcomes.wrote(cell, forged)
    nb = new_notebook(cells=[cell])
    outcomes.clear(nb)
    assert outcomes.recorded(nb.cells[0]) == []


def test_a_fully_graded_notebook_says_so():
    assert words([Graded(notebook="nb")]) == ("graded", "every test passed")


def test_failed_tests_raising_cells_and_repairs_make_the_reason():
    raised = [CellRaised(cell=i, ename="NameError") for i in range(10, 15)]
    status, reason = words(
        [
            Repaired(what="graded final.ipynb as nb.ipynb"),
            Graded(notebook="nb"),
            FailedTest(grade_id="test_f", why="AssertionError"),
            FailedTest(grade_id="test_g"),
            *raised,
            OutputCut(cell=4, grade_id="f", limit_bytes=1000),
        ]
    )
    assert status == "graded"
    assert reason == (
        "failed test_f (AssertionError), test_g; cell 10 raised NameError; "
        "cell 11 raised NameError; cell 12 raised NameError and 2 more; "
        "graded final.ipynb as nb.ipynb; printed output of cell 4 (f) cut after 1000 bytes"
    )


def test_execution_problems_make_the_status_an_error():
    status, _ = words(
        [
            Graded(notebook="nb"),
            CellTimeout(cell=5, grade_id="f", limit_s=10),
            KernelDied(cell=7, grade_id="g", cause="os._exit"),
            NotRun(cell=8, after=7),
        ]
    )
    assert status == "error: timeout in cell 5 (f); kernel died in cell 7 (g)"


def test_only_the_first_tampering_of_a_notebook_is_named():
    later = Tampered(cell=11, grade_id="test_h", when="before", changes=("a", "b", "c", "d"))
    status, _ = words([Graded(notebook="nb"), EXAMPLES[Tampered], later, NoFeedback(notebook="nb")])
    assert status == (
        "error: tampering detected at cell 8 (test_g): np.x was replaced; no feedback page for nb"
    )
    assert later.phrase().endswith("a; b; c (and 1 more)")


def test_a_missing_notebook_is_missing_and_names_what_was_found():
    assert words([Missing(notebook="nb")]) == ("missing", "missing nb.ipynb")
    status, reason = words([EXAMPLES[Missing]])
    assert status == "missing (found final.ipynb: wrong name)"
    assert reason == "missing nb.ipynb; found final.ipynb: rename it to nb.ipynb"
    assert EXAMPLES[Missing].page().startswith("No submission of nb.ipynb was found")


def test_an_invalid_notebook_is_an_error_and_a_missing_one_only_a_reason():
    status, reason = words([EXAMPLES[InvalidNotebook], Missing(notebook="other")])
    assert status == "error: nb.ipynb is not a valid notebook (the file is empty)"
    assert reason.endswith("; missing other.ipynb")


def test_a_fatal_outcome_names_only_itself():
    status, reason = words([Graded(notebook="nb"), EXAMPLES[KernelDied], EXAMPLES[NbgraderFailed]])
    assert status == "error: nbgrader could not grade it: [ERROR] no such assignment"
    assert reason == "nbgrader could not grade it: [ERROR] no such assignment"


def test_no_outcome_is_refused():
    with pytest.raises(ValueError):
        words([])


@pytest.mark.parametrize(
    ("ended_in", "kind"),
    [
        ([Graded(notebook="nb")], "graded"),
        ([EXAMPLES[Missing]], "missing"),
        ([Graded(notebook="nb"), EXAMPLES[Tampered]], "error"),
        ([EXAMPLES[AutograderFailure]], "error"),
    ],
)
def test_the_report_counts_statuses_by_kind(ended_in, kind):
    assert category(words(ended_in)[0]) == kind


def test_a_status_from_elsewhere_is_refused():
    with pytest.raises(ValueError, match="not a status"):
        category("gradedish")
