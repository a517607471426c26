"""Test the tests of every section, on the shared class run (tests/grader/class_run.py).

* ``reference`` (the answers, with the graded tests rearranged): every deleted test is put
  back by the autograder and gets its points, every test moved to the end gets its points, the
  one moved above its own exercise scores 0 and is named, the last test, run after a cell that
  patched what it relies on, loses its points to the tampering check and is named;
* ``blank``: every graded test cell must score 0.

So no test can pass by accident and none is impossible to pass. (That every test passes on
the unchanged reference is shown by nbval, which runs every cell of every reference notebook
under other CPU kernels than this machine's and fails on any error; the browser tests run
them on this machine's own kernels, e2e/test_jupyterlab.py; tests/grader/test_hostile.py
holds the other hostile cases.)
"""

import re

import nbformat
import pytest

from autograder.course import gradebook_url, open_gradebook
from tests.grader.class_run import SECTIONS, deleted_and_moved, first_test, last_test


def _grades(course, notebook, section, student):
    with open_gradebook(gradebook_url(course / "autograder" / "gradebook.db")) as gb:
        grades = gb.find_submission_notebook(notebook, section, student).grades
        return {g.name: (g.score, g.max_score) for g in grades if g.max_score_gradecell}


def _autograded(graded, student, section, notebook):
    path = graded.course / "autograder" / "autograded" / student / section / f"{notebook}.ipynb"
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize(("section", "notebook"), SECTIONS)
def test_deleted_and_moved_tests_get_their_points(graded, section, notebook):
    deleted, moved = deleted_and_moved(section, notebook)
    grades = _grades(graded.course, notebook, section, "reference")
    assert grades, f"{section}/{notebook} has no graded test cells"
    for name in deleted + moved:
        score, max_score = grades[name]
        assert score == max_score > 0, (section, name, score, max_score)
    reason = graded.rows[("reference", section)]["reason"]
    assert "deleted graded cells put back: " + ", ".join(deleted) in _without_places(reason)


def _without_places(reason: str) -> str:
    """The reason with the "(after cell N)" of each put-back test left out."""
    return re.sub(r" \((?:after|before) cell \d+\)| \(at the end\)", "", reason)


@pytest.mark.parametrize(("section", "notebook"), SECTIONS)
def test_a_test_moved_above_its_exercise_and_a_tampered_test_score_zero(graded, section, notebook):
    """Only those two lose points; both are named, the tampered one in the status."""
    first, last = first_test(section, notebook), last_test(section, notebook)
    row = graded.rows[("reference", section)]
    assert row["status"].startswith("error: tampering detected"), row
    assert last["grade_id"] in row["status"], row
    assert f"failed {first['grade_id']}" in row["reason"], row
    assert float(row["score"]) == float(row["max_score"]) - first["points"] - last["points"], row
    grades = _grades(graded.course, notebook, section, "reference")
    assert grades[first["grade_id"]][0] == grades[last["grade_id"]][0] == 0


@pytest.mark.parametrize(("section", "notebook"), SECTIONS)
def test_the_blank_notebook_fails_every_test(graded, section, notebook):
    blank = graded.rows[("blank", section)]
    assert blank["status"] == "graded", blank
    assert float(blank["score"]) == 0 < float(blank["max_score"]), blank
    for name, (score, _) in _grades(graded.course, notebook, section, "blank").items():
        assert score == 0, (section, name, score)
