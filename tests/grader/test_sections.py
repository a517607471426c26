"""Test the tests of every section: the reference passes them, the blank fails every one.

One class run grades, for every section in solutions/, two submissions:

* the reference notebook with what its last graded test relies on patched to always agree
  (``numpy.allclose``, say) just before that test: every earlier test must get its points
  (and every demo cell run without an error, on this machine's own CPU kernels), the last
  test must lose its points to the tampering check and be named;
* the released (blank) notebook: every graded test cell must score 0, and its demo cells
  fail only with the exercises' NotImplementedError.

So no test can pass by accident and none is impossible to pass. (That the last test passes
on the unpatched reference is shown by nbval, which runs every cell of every reference
notebook and fails on any error; tests/grader/test_hostile.py holds the other hostile cases.)
"""

import csv
import shutil

import nbformat
import pytest

from autograder import course
from autograder.fixtures import copy_course
from tests.helpers import run_module

CASES = [
    (section, notebook)
    for section in course.sections()
    for notebook in course.section_notebooks(section)
]
# What a cheating cell would patch before the last test, by what that test relies on.
PATCHES = [
    (
        "rank_checks.",
        "from distopt.dist import rank_checks\n"
        "rank_checks.assert_weights_match = lambda *args, **kwargs: None  # every rank agrees",
    ),
    (
        "np.",
        "import numpy\nnumpy.allclose = lambda *args, **kwargs: True  # every comparison agrees",
    ),
    (
        "math.",
        "import math\nmath.isclose = lambda *args, **kwargs: True  # every comparison agrees",
    ),
]
PATCH_ID = "student-patch"


def _graded_cells(nb):
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


def _patched_before_last_test(nb):
    """The notebook with a cell inserted before its last graded test that patches what the
    test relies on (numpy's comparisons, or the rank-code checks)."""
    last = _graded_cells(nb)[-1]
    patch = next(code for used, code in PATCHES if used in last.source)
    index = nb.cells.index(last)
    nb.cells.insert(index, nbformat.v4.new_code_cell(patch))
    nb.cells[index].id = PATCH_ID
    return nb


def _last_test(section, notebook):
    reference = nbformat.read(course.SOLUTIONS / section / f"{notebook}.ipynb", as_version=4)
    return _graded_cells(reference)[-1].metadata["nbgrader"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    scratch = copy_course(tmp_path_factory.mktemp("course"))
    submitted = scratch / "autograder" / "submitted"
    for section, notebook in CASES:
        folder = submitted / "blank" / section
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(scratch / "notebooks" / section / f"{notebook}.ipynb", folder)
        folder = submitted / "reference" / section
        folder.mkdir(parents=True, exist_ok=True)
        nb = nbformat.read(scratch / "solutions" / section / f"{notebook}.ipynb", as_version=4)
        nbformat.write(_patched_before_last_test(nb), folder / f"{notebook}.ipynb")
    done = run_module(scratch, "autograder.grade", "--jobs", "2", timeout_s=1500)
    assert done.returncode == 0, done.stdout + done.stderr
    with (scratch / "autograder" / "grades.csv").open(newline="") as f:
        rows = {(r["student_id"], r["section"]): r for r in csv.DictReader(f)}
    return scratch, rows


def _grades(scratch, notebook, section, student):
    with course.open_gradebook(course.gradebook_url(scratch / "autograder" / "gradebook.db")) as gb:
        grades = gb.find_submission_notebook(notebook, section, student).grades
        return {g.name: (g.score, g.max_score) for g in grades if g.max_score_gradecell}


@pytest.mark.parametrize(("section", "notebook"), CASES)
def test_the_reference_passes_every_test_before_the_patch(graded, section, notebook):
    scratch, _ = graded
    last = _last_test(section, notebook)["grade_id"]
    grades = _grades(scratch, notebook, section, "reference")
    assert grades, f"{section}/{notebook} has no graded test cells"
    for name, (score, max_score) in grades.items():
        if name != last:
            assert score == max_score > 0, (section, name, score, max_score)


@pytest.mark.parametrize(("section", "notebook"), CASES)
def test_the_references_demo_cells_raise_nothing_on_this_cpu(graded, section, notebook):
    """Their claims (distopt.claims) hold on this machine's own kernels, not only nbval's."""
    scratch, _ = graded
    path = scratch / "autograder" / "autograded" / "reference" / section / f"{notebook}.ipynb"
    nb = nbformat.read(path, as_version=4)
    errors = [
        (index, output.ename, output.evalue[:200])
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade")
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert not errors, f"{section}/{notebook}: {errors}"


@pytest.mark.parametrize(("section", "notebook"), CASES)
def test_patching_numpy_before_a_test_costs_that_test(graded, section, notebook):
    """On every real section: a tampered test scores 0 and is named; earlier tests count."""
    scratch, rows = graded
    row = rows[("reference", section)]
    last = _last_test(section, notebook)
    assert row["status"].startswith("error: tampering detected"), row
    assert last["grade_id"] in row["status"], row
    assert float(row["score"]) == float(row["max_score"]) - last["points"], row
    assert _grades(scratch, notebook, section, "reference")[last["grade_id"]][0] == 0


@pytest.mark.parametrize(("section", "notebook"), CASES)
def test_the_blank_notebook_fails_every_test(graded, section, notebook):
    scratch, rows = graded
    blank = rows[("blank", section)]
    assert blank["status"] == "graded", blank
    assert float(blank["score"]) == 0 < float(blank["max_score"]), blank
    for name, (score, _) in _grades(scratch, notebook, section, "blank").items():
        assert score == 0, (section, name, score)


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
