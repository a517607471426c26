"""The grader's nbgrader steps (autograder/nbgrader_plugins.py) without a kernel: feedback
pages that keep hidden tests hidden, and the execute step's records of what happened in a cell.
The class runs in test_hostile.py and test_autograder.py show the same end to end."""

from __future__ import annotations

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.v4 import new_code_cell, new_notebook, new_output
from nbgrader.preprocessors import Execute

from autograder import outcomes
from autograder.nbgrader_plugins import ExecuteUntilKernelDeath, HideHiddenTests
from autograder.results import words
from tests.helpers import graded_cell

# --- feedback pages -------------------------------------------------------------------------


def _error(line: int, evalue: str) -> nbformat.NotebookNode:
    return new_output(
        "error",
        ename="AssertionError",
        evalue=evalue,
        traceback=[
            "\x1b[0;31mAssertionError\x1b[0m Traceback",
            f"Cell \x1b[0;32mIn[5], line {line}\x1b[0m\n  assert f() == 1\n  assert f(2) == 4",
            f"\x1b[0;31mAssertionError\x1b[0m: {evalue}",
        ],
    )


TEST_SOURCE = (
    "assert f() == 1\n### BEGIN HIDDEN TESTS\nassert f(2) == 4, 'secret case'\n### END HIDDEN TESTS"
)


def _feedback(line: int, printed: str = "") -> nbformat.NotebookNode:
    test = graded_cell("test_f", TEST_SOURCE, test=True, cell_id="t")
    test.outputs = [_error(line, "secret case" if line > 1 else "")]
    student = new_code_cell("print(In)")
    student.outputs = [new_output("stream", name="stdout", text=printed)]
    nb = new_notebook(cells=[test, student])
    nb, _ = HideHiddenTests().preprocess(nb, {})
    return nb


def test_a_hidden_failure_shows_only_that_a_hidden_test_failed():
    nb = _feedback(line=3, printed="['', \"assert f(2) == 4, 'secret case'\"]")
    test, student = nb.cells
    assert "secret" not in test.source and "f(2)" not in test.source
    assert test.source.startswith("assert f() == 1\n# (hidden tests)")
    assert [o.evalue for o in test.outputs] == ["hidden test failed"]
    assert "secret" not in student.outputs[0].text and "[hidden]" in student.outputs[0].text


def test_a_visible_failure_keeps_its_error_without_the_hidden_lines_around_it():
    nb = _feedback(line=1)
    (output,) = nb.cells[0].outputs
    assert output.ename == "AssertionError"
    assert output.evalue == "(line 1 of the test)"
    assert "f(2)" not in "".join(output.traceback)


def test_a_failure_recorded_by_the_autograder_is_shown_even_in_hidden_tests():
    test = graded_cell("test_f", TEST_SOURCE, test=True, cell_id="t")
    test.outputs = [_error(3, "secret case")]
    outcomes.record(test, outcomes.Tampered(cell=1, when="before", changes=("x was replaced",)))
    nb, _ = HideHiddenTests().preprocess(new_notebook(cells=[test]), {})
    assert [o.ename for o in nb.cells[0].outputs] == ["HiddenTestFailed", "IntegrityError"]


# --- the execute step's records, with nbclient's execution replaced ------------------------


def _executed(monkeypatch, raised: BaseException):
    """Two code cells run by the execute step, the first one's execution raising."""

    def execute(self, cell, resources, index):
        if index == 0:
            raise raised
        return cell, resources

    monkeypatch.setattr(Execute, "preprocess_cell", execute)
    nb = new_notebook(
        cells=[new_code_cell("f()"), graded_cell("test_f", "f()", test=True, cell_id="t")]
    )
    nb.cells[0].metadata[outcomes.METADATA_KEY] = {"outcomes": [{"outcome": "Repaired"}]}
    step = ExecuteUntilKernelDeath(check_integrity=0)
    step.start_notebook(nb)
    for index, cell in enumerate(nb.cells):
        step.preprocess_cell(cell, {}, index)
    return [outcomes.recorded(cell) for cell in nb.cells], nb


def test_a_kernel_lost_while_running_a_cell_fails_the_cells_after_it(monkeypatch):
    (first, second), nb = _executed(monkeypatch, ConnectionError("channel closed"))
    assert first == [outcomes.KernelLost(cell=1, cause="ConnectionError: channel closed")]
    assert second == [outcomes.NotRun(cell=2, grade_id="test_f", after=1)]
    assert [o.ename for o in nb.cells[1].outputs] == ["NotRun"]  # so nbgrader scores it 0
    ended_in = [outcomes.Graded(notebook="nb"), *first, *second]
    assert words(ended_in)[0] == "error: kernel lost in cell 1"


def test_a_dead_kernel_is_recorded_as_a_death(monkeypatch):
    (first, _), nb = _executed(monkeypatch, DeadKernelError("Kernel died"))
    assert [type(o) for o in first] == [outcomes.KernelDied]
    assert nb.cells[0].outputs[-1].ename == "KernelDied"


def test_a_timeout_is_recorded_and_its_error_output_is_the_records():
    step = ExecuteUntilKernelDeath(check_integrity=0, interrupt_on_timeout=False)
    cell = new_code_cell("while True: pass")
    step.start_notebook(new_notebook(cells=[cell]))
    step._place = {"cell": 1, "grade_id": None}
    from jupyter_core.utils import run_sync

    with pytest.raises(CellTimeoutError):
        run_sync(step._async_handle_timeout)(10, cell)
    (timed_out,) = outcomes.recorded(cell)
    assert timed_out == outcomes.CellTimeout(cell=1, limit_s=10)
    assert step.error_on_timeout["evalue"] == timed_out.output()["evalue"]
