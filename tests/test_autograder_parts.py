"""The autograder's parts without a kernel: repairs of submitted notebooks, the integrity
comparison, and feedback pages that keep hidden tests hidden. Fast; the class runs in
test_hostile.py and test_autograder.py show the same end to end."""

from __future__ import annotations

import copy

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from autograder import integrity, staging
from autograder.nbgrader_plugins import HideHiddenTests


def _graded(grade_id: str, source: str, *, test: bool, cell_id: str) -> nbformat.NotebookNode:
    meta = {"grade": test, "grade_id": grade_id, "solution": not test, "locked": test}
    if test:
        meta["points"] = 1
    cell = new_code_cell(source, metadata={"nbgrader": meta})
    cell["id"] = cell_id
    return cell


def _released() -> nbformat.NotebookNode:
    return new_notebook(
        cells=[
            _graded("f", "def f():\n    raise NotImplementedError()", test=False, cell_id="a1"),
            _graded("test_f", "assert f() == 1", test=True, cell_id="a2"),
            _graded("g", "def g():\n    raise NotImplementedError()", test=False, cell_id="a3"),
            _graded("test_g", "assert g() == 2", test=True, cell_id="a4"),
        ]
    )


def _ids(nb):
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]


def test_stripped_metadata_is_restored_by_cell_id():
    nb = copy.deepcopy(_released())
    for cell in nb.cells:
        cell.metadata.pop("nbgrader")
    notes = staging.repair(nb, _released())
    assert _ids(nb) == ["f", "test_f", "g", "test_g"]
    assert notes == ["restored the nbgrader metadata of 4 cells"]


def test_duplicates_and_foreign_cells_lose_their_metadata():
    nb = copy.deepcopy(_released())
    nb.cells.insert(2, copy.deepcopy(nb.cells[1]))
    nb.cells[2]["id"] = "copy"
    nb.cells.append(_graded("test_other", "assert True", test=True, cell_id="zz"))
    notes = staging.repair(nb, _released())
    assert _ids(nb) == ["f", "test_f", None, "g", "test_g", None]
    assert "cell 'test_f' appears twice: the first one is graded" in notes
    assert "cell 'test_other' is not part of this notebook: graded as ordinary code" in notes


def test_deleted_graded_cells_are_put_back_in_place():
    nb = copy.deepcopy(_released())
    del nb.cells[3]  # test_g
    del nb.cells[1]  # test_f
    notes = staging.repair(nb, _released())
    assert _ids(nb) == ["f", "test_f", "g", "test_g"]
    assert notes == ["deleted graded cells put back: test_f, test_g"]
    assert len({c["id"] for c in nb.cells}) == 4


def _fingerprint(**changes):
    fp = {
        "modules": {"numpy": 1},
        "ids": {"numpy.allclose": 10, "math.isclose": 11},
        "foreign": [],
        "hooks": {"custom_exceptions": "()"},
        "names": {"open": "shadows built-in:open"},
    }
    for key, value in changes.items():
        fp[key] = {**fp[key], **value} if isinstance(fp[key], dict) else value
    return fp


def test_the_integrity_comparison_names_each_change():
    base, seen = _fingerprint(), {}
    assert integrity.differences(base, _fingerprint(), seen, set()) == []
    assert integrity.differences(base, _fingerprint(ids={"numpy.allclose": 99}), seen, set()) == [
        "numpy.allclose was replaced"
    ]
    hooked = _fingerprint(hooks={"custom_exceptions": "(<class 'BaseException'>,)"})
    assert integrity.differences(base, hooked, seen, set()) == [
        "the kernel's custom_exceptions was changed"
    ]
    assert integrity.differences(base, None, seen, set()) == [
        "the integrity check got no answer from the kernel"
    ]


def test_a_rebound_module_name_is_tampering_but_plain_data_is_not():
    base, seen = _fingerprint(), {}
    integrity.differences(base, _fingerprint(names={"math": "module:math"}), seen, set())
    assert seen == {"math": "math"}
    fake = _fingerprint(names={"math": "object:"})
    assert integrity.differences(base, fake, seen, set()) == [
        "the name 'math' no longer refers to the module math"
    ]
    assert integrity.differences(base, _fingerprint(names={"math": None}), seen, set()) == []


def test_shadowing_a_builtin_matters_only_where_tests_use_it():
    base, seen = _fingerprint(), {}
    mine = _fingerprint(names={"filter": "shadows built-in:filter"})
    assert integrity.differences(base, mine, seen, {"assert", "f"}) == []
    assert integrity.differences(base, mine, seen, {"filter"}) != []
    err = _fingerprint(names={"AssertionError": "shadows built-in:AssertionError"})
    assert integrity.differences(base, err, seen, set()) != []


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
    test = _graded("test_f", TEST_SOURCE, test=True, cell_id="t")
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
