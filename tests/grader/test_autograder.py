"""`make grade` end to end on a class of fixture submissions made from the reference notebook.

Also tests the tests: the answers typed into the student notebook get full marks; the blank
notebook fails every graded test cell; typical bugs and a pasted number fail the named tests.
(tests/grader/test_sections.py checks the reference and the blank of every section.)
"""

import csv
import hashlib
import shutil

import nbformat
import pytest

from autograder.fixtures import copy_course, edit_answer, kill_kernel_in
from tests.helpers import NOTEBOOK, RELEASED_NB, SECTION, answered_notebook, run_module

ALL_TESTS = {
    "test_state_bytes_per_gpu": 3,
    "test_min_gpus_to_fit": 2,
    "test_ring_allreduce_seconds": 2,
    "test_bytes_sent_per_step": 2,
    "test_layer_activation_bytes": 3,
    "test_peak_bytes_per_gpu": 2,
    "test_fsdp_peak_bytes": 2,
    "test_zero1_adam": 3,
}
MAX_SCORE = sum(ALL_TESTS.values())


def _partly_wrong():
    """Two typical bugs and one pasted answer."""
    nb = answered_notebook()
    # forgets the all-gather half of the ring
    edit_answer(nb, "ring_allreduce_seconds", "steps = 2 * (n - 1)", "steps = n - 1")
    # forgets the attention-score term
    edit_answer(
        nb,
        "layer_activation_bytes",
        "return sbh * (34 + 5 * heads * seq_len / hidden)",
        "return sbh * 34",
    )
    # pastes the visible test's numbers instead of a formula: hidden tests must catch it
    pasted = (
        "def bytes_sent_per_step(num_params, zero_stage, world_size, *, weight_bytes=2,"
        " grad_bytes=2):\n    return 275.625e9 * (1.5 if zero_stage == 3 else 1)\n"
    )
    cell = next(
        c
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade_id") == "bytes_sent_per_step"
    )
    cell.source = pasted
    return nb


def _kernel_dies():
    nb = answered_notebook()
    kill_kernel_in(nb, "ring_allreduce_seconds")
    return nb


# student id -> (notebook or None, expected score, expected status, failing tests)
CLASS = {
    "answered": (answered_notebook, MAX_SCORE, "graded", set()),
    "blank": ("blank", 0, "graded", set(ALL_TESTS)),
    # peak_bytes_per_gpu is right but builds on the buggy layer_activation_bytes
    "partly_wrong": (
        _partly_wrong,
        MAX_SCORE - 2 - 3 - 2 - 2,
        "graded",
        {
            "test_ring_allreduce_seconds",
            "test_layer_activation_bytes",
            "test_bytes_sent_per_step",
            "test_peak_bytes_per_gpu",
        },
    ),
    # dies in the answer cell of exercise 3: the two tests before it count
    "kernel_dies": (
        _kernel_dies,
        5,
        "error: kernel died in cell 18 (ring_allreduce_seconds)",
        set(ALL_TESTS) - {"test_state_bytes_per_gpu", "test_min_gpus_to_fit"},
    ),
    "missing": (None, 0, "missing", set(ALL_TESTS)),
    "not_json": (
        "not json",
        0,
        "error: memory_sharding.ipynb is not a valid notebook",
        set(ALL_TESTS),
    ),
}


def _digest(folder):
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    course = copy_course(tmp_path_factory.mktemp("course"))
    submitted = course / "autograder" / "submitted"
    for student, (source, *_rest) in CLASS.items():
        folder = submitted / student / SECTION
        folder.mkdir(parents=True)
        target = folder / f"{NOTEBOOK}.ipynb"
        if source == "blank":
            shutil.copy2(RELEASED_NB, target)
        elif source == "not json":
            target.write_text('{"cells": [ this is not JSON')
        elif callable(source):
            nbformat.write(source(), target)
    (submitted / "missing" / SECTION / "notes.txt").write_text("forgot the notebook")
    before = _digest(submitted)
    done = run_module(course, "autograder.grade", "--jobs", "2")
    with (course / "autograder" / "grades.csv").open(newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    return course, done, rows, before, _digest(submitted)


def test_grading_finishes_with_exit_0(graded_class):
    _, done, *_ = graded_class
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"graded {len(CLASS)} submissions" in done.stdout


def test_grades_csv_has_the_expected_row_for_every_student(graded_class):
    _, _, rows, *_ = graded_class
    assert set(rows) == set(CLASS)
    for student, (_, score, status, _) in CLASS.items():
        row = rows[student]
        assert row["section"] == SECTION
        assert float(row["score"]) == score, (student, row)
        assert float(row["max_score"]) == MAX_SCORE, (student, row)
        assert row["status"].startswith(status), (student, row)


def test_every_row_has_a_feedback_page(graded_class):
    course, _, rows, *_ = graded_class
    for student, row in rows.items():
        pages = row["feedback"].split()
        assert pages, student
        for page in pages:
            assert (course / page).is_file(), (student, page)
    missing_page = (course / rows["missing"]["feedback"]).read_text()
    assert "No submission" in missing_page


def test_each_graded_cell_scores_as_expected(graded_class):
    """Test the tests: which graded cells pass, cell by cell, from the gradebook."""
    from autograder.course import gradebook_url, open_gradebook

    course, *_ = graded_class
    with open_gradebook(gradebook_url(course / "autograder" / "gradebook.db")) as gb:
        for student, (source, _, _, failing) in CLASS.items():
            if source in (None, "not json"):
                continue
            notebook = gb.find_submission_notebook(NOTEBOOK, SECTION, student)
            scores = {g.name: g.score for g in notebook.grades if g.name in ALL_TESTS}
            assert set(scores) == set(ALL_TESTS), student
            for grade_id, points in ALL_TESTS.items():
                expected = 0 if grade_id in failing else points
                assert scores[grade_id] == expected, (student, grade_id, scores[grade_id])


def test_submitted_files_are_never_changed(graded_class):
    *_, before, after = graded_class
    assert before == after


def test_an_empty_class_is_not_an_error(tmp_path):
    course = copy_course(tmp_path)
    done = run_module(course, "autograder.grade")
    assert done.returncode == 0
    assert "nothing to grade" in done.stdout
    assert "autograder/submitted/<student_id>/<section>/<notebook>.ipynb" in done.stdout


def test_an_unknown_section_is_refused_with_the_list_of_sections(tmp_path):
    course = copy_course(tmp_path)
    done = run_module(course, "autograder.grade", "--section", "99_nothing")
    assert done.returncode == 2
    assert SECTION in done.stderr
