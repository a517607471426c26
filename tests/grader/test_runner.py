"""The course's one notebook runner (autograder/runner.py), which make execute, make spread,
the benchmark and the mutant trials call: a fresh kernel in the notebook's folder."""

from __future__ import annotations

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError
from nbformat.v4 import new_code_cell, new_notebook

from autograder import runner
from tests.helpers import ROOT, run_module


def _notebook(path):
    cells = ["import os; print(os.path.basename(os.getcwd()))", "1 / 0", "print('after')"]
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]), path)


def test_the_command_line_runs_a_notebook_in_its_folder_past_an_error(tmp_path):
    """What make spread runs, in a process whose environment selects the CPU kernels."""
    (tmp_path / "here").mkdir()
    _notebook(tmp_path / "here" / "nb.ipynb")
    out = tmp_path / "out.ipynb"
    done = run_module(
        ROOT,
        "autograder.runner",
        str(tmp_path / "here" / "nb.ipynb"),
        str(out),
        "--allow-errors",
        "--timeout",
        "60",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cells = nbformat.read(out, as_version=4).cells
    assert cells[0].outputs[0].text == "here\n", "the kernel runs in the notebook's folder"
    assert cells[1].outputs[0].ename == "ZeroDivisionError"
    assert cells[2].outputs[0].text == "after\n"
    assert "execution" not in cells[0].metadata, "no timing recorded"


def test_without_allow_errors_a_raising_cell_stops_the_run(tmp_path):
    _notebook(tmp_path / "nb.ipynb")
    nb = nbformat.read(tmp_path / "nb.ipynb", as_version=4)
    with pytest.raises(CellExecutionError, match="ZeroDivisionError"):
        runner.run(nb, tmp_path, timeout=60)
    assert nb.cells[2].outputs == []
