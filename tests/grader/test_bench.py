"""The whole-course benchmark's floor, on a notebook small enough for the tests."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from autograder import bench


def test_the_floor_runs_cleared_copies_of_the_autograded_notebooks(tmp_path):
    autograded = tmp_path / "autograder" / "autograded" / "ann" / "01_a"
    autograded.mkdir(parents=True)
    cell = new_code_cell("open('ran.txt', 'w').write('yes')")
    cell.outputs = [new_output("stream", name="stdout", text="stale")]
    nbformat.write(new_notebook(cells=[cell]), autograded / "nb.ipynb")

    (copy,) = bench.floor_copies(tmp_path)
    assert copy == str(tmp_path / "floor" / "ann" / "01_a" / "nb.ipynb")
    assert nbformat.read(copy, as_version=4).cells[0].outputs == []
    seconds = bench.run_in_started_processes([copy], jobs=1)
    assert seconds > 0
    assert (tmp_path / "floor" / "ann" / "01_a" / "ran.txt").read_text() == "yes"
