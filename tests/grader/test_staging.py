"""Repairs of submitted notebooks (autograder/staging.py): nbgrader metadata restored by cell
id, repeated and foreign graded cells, deleted graded cells put back where they were.
Without a kernel; the class runs in test_hostile.py and test_autograder.py show the same end
to end."""

from __future__ import annotations

import copy

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from autograder import staging
from tests.helpers import graded_cell


def _released() -> nbformat.NotebookNode:
    return new_notebook(
        cells=[
            graded_cell("f", "def f():\n    raise NotImplementedError()", test=False, cell_id="a1"),
            graded_cell("test_f", "assert f() == 1", test=True, cell_id="a2"),
            graded_cell("g", "def g():\n    raise NotImplementedError()", test=False, cell_id="a3"),
            graded_cell("test_g", "assert g() == 2", test=True, cell_id="a4"),
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
    nb.cells.append(graded_cell("test_other", "assert True", test=True, cell_id="zz"))
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
    assert notes == ["deleted graded cells put back: test_f (after cell 1), test_g (after cell 3)"]
    assert len({c["id"] for c in nb.cells}) == 4


def _with_demo_cells() -> nbformat.NotebookNode:
    """f, a demo cell defining what test_f uses, test_f; g, a demo cell, test_g."""
    nb = _released()
    for at, cell_id in ((1, "demo-f"), (4, "demo-g")):
        demo = new_code_cell(f"CONSTANT_{cell_id[-1]} = 1")
        demo["id"] = cell_id
        nb.cells.insert(at, demo)
    return nb


def test_a_deleted_test_goes_back_after_the_demo_cells_before_it():
    released = _with_demo_cells()
    nb = copy.deepcopy(released)
    nb.cells = [c for c in nb.cells if c.get("id") not in ("a2", "a4")]  # both tests deleted
    notes = staging.repair(nb, released)
    assert [c.get("id") for c in nb.cells] == ["a1", "demo-f", "a2", "a3", "demo-g", "a4"]
    assert notes == ["deleted graded cells put back: test_f (after cell 2), test_g (after cell 5)"]


def test_the_anchor_is_the_nearest_earlier_cell_wherever_it_was_moved():
    released = _with_demo_cells()
    nb = copy.deepcopy(released)
    nb.cells = [c for c in nb.cells if c.get("id") != "a4"]
    demo_g = next(c for c in nb.cells if c.get("id") == "demo-g")
    nb.cells.remove(demo_g)
    nb.cells.insert(0, demo_g)  # the student moved the demo cell to the top
    staging.repair(nb, released)
    assert [c.get("id") for c in nb.cells][:2] == ["demo-g", "a4"]


def test_with_no_earlier_cell_left_a_test_goes_before_the_next_one():
    released = _with_demo_cells()
    nb = copy.deepcopy(released)
    nb.cells = [c for c in nb.cells if c.get("id") != "a1"]  # the first cell, deleted
    notes = staging.repair(nb, released)
    assert [c.get("id") for c in nb.cells] == ["a1", "demo-f", "a2", "a3", "demo-g", "a4"]
    assert notes == ["deleted graded cells put back: f (before cell 1)"]


def test_extra_files_are_noted_but_not_the_exchanges_own(tmp_path):
    released = _released()
    (tmp_path / "released").mkdir()
    nbformat.write(released, tmp_path / "released" / "nb.ipynb")
    submitted = tmp_path / "submitted"
    submitted.mkdir()
    nbformat.write(released, submitted / "nb.ipynb")
    for name in ["timestamp.txt", "submission_secret.txt", "numpy.py"]:  # nbgrader writes two
        (submitted / name).write_text("x")
    found = staging.stage(
        submitted, tmp_path / "staged", {"nb": submitted / "nb.ipynb"}, tmp_path / "released"
    )
    assert "ignored extra files: numpy.py" in found.notes
