"""The grader's nbgrader steps (autograder/nbgrader_plugins.py) without a kernel: feedback
pages that keep hidden tests hidden, and the execute step's records of what happened in a cell.
The class runs in test_hostile.py and test_autograder.py show the same end to end."""

from __future__ import annotations

import base64
import json
import zlib

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.v4 import new_code_cell, new_notebook, new_output
from nbgrader.preprocessors import Execute

from autograder import outcomes
from autograder.nbgrader_plugins import SEALED_NOTE, ExecuteUntilKernelDeath, HideHiddenTests
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


def _feedback(line: int, printed: str = "", before: str = "") -> nbformat.NotebookNode:
    early = new_code_cell("print('before any test')")
    early.outputs = [new_output("stream", name="stdout", text=before)] if before else []
    test = graded_cell("test_f", TEST_SOURCE, test=True, cell_id="t")
    test.outputs = [_error(line, "secret case" if line > 1 else "")]
    student = new_code_cell("print(In)")
    student.outputs = [new_output("stream", name="stdout", text=printed)]
    nb = new_notebook(cells=[early, test, student])
    nb, _ = HideHiddenTests().preprocess(nb, {})
    return nb


def test_a_hidden_failure_shows_only_that_a_hidden_test_failed():
    nb = _feedback(line=3, printed="['', \"assert f(2) == 4, 'secret case'\"]")
    _, test, student = nb.cells
    assert "secret" not in test.source and "f(2)" not in test.source
    assert test.source.startswith("assert f() == 1\n# (hidden tests)")
    assert [o.evalue for o in test.outputs] == ["hidden test failed"]
    assert [o.text for o in student.outputs] == [SEALED_NOTE + "\n"]


def test_a_visible_failure_shows_its_line_not_a_message_the_students_code_could_write():
    nb = _feedback(line=1)
    (output,) = nb.cells[1].outputs
    assert output.ename == "AssertionError"
    assert output.evalue.startswith("line 1 of the test failed: assert f() == 1")
    assert "f(2)" not in "".join(output.traceback)


def test_outputs_before_the_first_hidden_test_are_shown():
    nb = _feedback(line=1, before="before any test\n")
    assert [o.text for o in nb.cells[0].outputs] == ["before any test\n"]


def _encodings(text: str) -> list[str]:
    """What a student cell could print of the hidden code: plainly and disguised."""
    raw = text.encode()
    return [
        text,
        base64.b64encode(raw).decode(),
        base64.b64encode(zlib.compress(raw)).decode(),
        text[::-1],
        "".join(chr(ord(c) + 1) for c in text),
        raw.hex(),
    ]


def test_nothing_the_student_could_write_after_a_hidden_test_reaches_the_page():
    hidden = "assert f(2) == 4, 'secret case'"
    later_test = graded_cell("test_g", "assert g() == 0", test=True, cell_id="u")
    later_test.outputs = [
        new_output("stream", name="stdout", text=_encodings(hidden)[1]),
        new_output("execute_result", data={"text/plain": _encodings(hidden)[2]}, execution_count=3),
        new_output(
            "error",
            ename="AssertionError",
            evalue="got " + _encodings(hidden)[3],
            traceback=[f"Cell In[6], line 1\n  assert g() == 0\nAssertionError: {hidden[::-1]}"],
        ),
    ]
    picture = new_code_cell("show()")
    picture.outputs = [new_output("display_data", data={"image/png": _encodings(hidden)[1]})]
    test = graded_cell("test_f", TEST_SOURCE, test=True, cell_id="t")
    test.outputs = [_error(1, "got " + _encodings(hidden)[4])]
    printer = new_code_cell("print(In)")
    printer.outputs = [
        new_output("stream", name="stdout", text="\n".join(_encodings(hidden))),
    ]
    nb = new_notebook(cells=[test, printer, picture, later_test])
    nb, _ = HideHiddenTests().preprocess(nb, {})
    page = json.dumps([c.get("outputs", []) for c in nb.cells]) + "".join(
        c.source for c in nb.cells
    )
    for disguised in _encodings(hidden) + _encodings("secret case"):
        assert disguised not in page
    assert [o.text for o in nb.cells[1].outputs] == [SEALED_NOTE + "\n"]
    assert [o.text for o in nb.cells[2].outputs] == [SEALED_NOTE + "\n"]
    (error,) = nb.cells[3].outputs
    assert error.evalue.startswith("line 1 of the test failed: assert g() == 0")


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
    # the error's class only: its message may quote what the kernel sent
    assert first == [outcomes.KernelLost(cell=1, cause="ConnectionError")]
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


def _printed(step: ExecuteUntilKernelDeath, nb, index: int, msg_type: str, content: dict):
    """One message of cell ``index`` handed to the execute step's output hook."""
    step.nb, step._place = nb, {"cell": index + 1, "grade_id": None}
    step.clear_before_next_output = False
    outs = nb.cells[index].outputs
    header = {"msg_type": msg_type}
    msg = {"msg_type": msg_type, "content": content, "header": header, "parent_header": {}}
    step.output(outs, msg, None, index)
    return outs


def test_the_whole_notebook_keeps_a_bounded_output():
    nb = new_notebook(cells=[new_code_cell("print(x)") for _ in range(5)])
    step = ExecuteUntilKernelDeath(
        check_integrity=0, max_output_bytes=1000, max_notebook_output_bytes=2500
    )
    step.start_notebook(nb)
    for index in range(5):
        for _ in range(3):
            _printed(step, nb, index, "stream", {"name": "stdout", "text": "x" * 400})
    kept = [sum(o.get("text", "").count("x") for o in c.outputs) for c in nb.cells]
    assert kept == [800, 800, 800, 0, 0]  # 1000 per cell, then 2500 in all: whole messages
    assert all(len(outcomes.recorded(c)) == 1 for c in nb.cells)  # each cut, once


def test_an_error_keeps_the_head_and_tail_of_its_message_and_traceback():
    nb = new_notebook(cells=[new_code_cell("raise ValueError('x' * 10**7)")])
    step = ExecuteUntilKernelDeath(check_integrity=0, max_error_chars=1000)
    step.start_notebook(nb)
    huge = "start " + "x" * 10**6 + " end"
    content = {"ename": "ValueError", "evalue": huge, "traceback": [huge] * 50}
    (error,) = _printed(step, nb, 0, "error", content)
    assert error.evalue.startswith("start ") and error.evalue.endswith(" end")
    assert "the autograder cut 999," in error.evalue
    assert len(json.dumps(error)) < 10_000


def test_markdown_math_becomes_mathml_and_code_and_prices_stay():
    from autograder.nbgrader_plugins import math_to_mathml

    text = math_to_mathml("cost $2(N-1)\\alpha$; `$x$` stays; $$\\frac{a}{b}$$; it costs $5 or $6")
    assert text.count('<math xmlns="http://www.w3.org/1998/Math/MathML"') == 2, text
    assert 'display="block"' in text and "<mfrac>" in text
    assert "`$x$`" in text and "costs $5 or $6" in text
