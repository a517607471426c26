"""Test the tests of every section: the reference scores full marks, the blank scores zero.

One class run grades, for every section in solutions/, the reference notebook and the
released (blank) notebook. Every graded test cell must pass on the reference and fail on the
blank, so no test can pass by accident and none is impossible to pass.

The same run grades, per section, one hostile submission (the catalogue in
tests/test_hostile.py holds the rest): the reference answers with ``numpy.allclose`` patched
to always agree just before the last test, which must lose that test's points and be named.
"""

import csv
import shutil

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder import course
from autograder.fixtures import copy_course
from conftest import run_module

CASES = [
    (section, notebook)
    for section in course.sections()
    for notebook in course.section_notebooks(section)
]
PATCH = "import numpy\nnumpy.allclose = lambda *args, **kwargs: True  # every comparison agrees"


def _graded_cells(nb):
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


def _patched_before_last_test(nb):
    """The notebook with a cell that patches numpy inserted before its last graded test."""
    last = _graded_cells(nb)[-1]
    index = nb.cells.index(last)
    nb.cells.insert(index, nbformat.v4.new_code_cell(PATCH))
    nb.cells[index].id = "student-patch"
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    scratch = copy_course(tmp_path_factory.mktemp("course"))
    for section, notebook in CASES:
        for student, source in (("reference", "solutions"), ("blank", "notebooks")):
            folder = scratch / "autograder" / "submitted" / student / section
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy2(scratch / source / section / f"{notebook}.ipynb", folder)
        folder = scratch / "autograder" / "submitted" / "patcher" / section
        folder.mkdir(parents=True, exist_ok=True)
        nb = nbformat.read(scratch / "solutions" / section / f"{notebook}.ipynb", as_version=4)
        nbformat.write(_patched_before_last_test(nb), folder / f"{notebook}.ipynb")
    done = run_module(scratch, "autograder.grade", "--jobs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    with (scratch / "autograder" / "grades.csv").open(newline="") as f:
        rows = {(r["student_id"], r["section"]): r for r in csv.DictReader(f)}
    return scratch, rows


@pytest.mark.parametrize(("section", "notebook"), CASES)
def test_reference_gets_full_marks_and_blank_gets_zero(graded, section, notebook):
    scratch, rows = graded
    reference, blank = rows[("reference", section)], rows[("blank", section)]
    assert reference["status"] == "graded", reference
    assert float(reference["score"]) == float(reference["max_score"]) > 0, reference
    assert blank["status"] == "graded", blank
    assert float(blank["score"]) == 0, blank
    with Gradebook(f"sqlite:///{scratch / 'autograder' / 'gradebook.db'}") as gb:
        for student, full in (("reference", True), ("blank", False)):
            grades = gb.find_submission_notebook(notebook, section, student).grades
            graded_cells = [g for g in grades if g.max_score_gradecell]
            assert graded_cells, f"{section}/{notebook} has no graded test cells"
            for g in graded_cells:
                expected = g.max_score if full else 0
                assert g.score == expected, (student, section, g.name, g.score)


@pytest.mark.parametrize(("section", "notebook"), CASES)
def test_blank_demo_cells_fail_only_with_not_implemented_error(graded, section, notebook):
    """A student who has answered nothing sees only the exercises' NotImplementedError.

    Outside the graded test cells, a follow-on NameError or KeyError (a demo cell using a
    value an unanswered exercise never made) would send a student hunting for a bug that is
    not theirs.
    """
    scratch, _ = graded
    path = scratch / "autograder" / "autograded" / "blank" / section / f"{notebook}.ipynb"
    nb = nbformat.read(path, as_version=4)
    others = [
        (index, output.ename, output.evalue)
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade")
        for output in cell.outputs
        if output.output_type == "error" and output.ename != "NotImplementedError"
    ]
    assert not others, f"{section}/{notebook}: cells with other errors {others}"


@pytest.mark.parametrize(("section", "notebook"), CASES)
def test_patching_numpy_before_a_test_costs_that_test(graded, section, notebook):
    """On every real section: a tampered test scores 0 and is named; earlier tests count."""
    _, rows = graded
    row = rows[("patcher", section)]
    reference = nbformat.read(
        course.ROOT / "solutions" / section / f"{notebook}.ipynb", as_version=4
    )
    last = _graded_cells(reference)[-1].metadata["nbgrader"]
    assert row["status"].startswith("error: tampering detected"), row
    assert last["grade_id"] in row["status"], row
    assert float(row["score"]) == float(row["max_score"]) - last["points"], row
