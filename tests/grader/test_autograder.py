"""`make grade` end to end on a class of fixture submissions made from the reference notebook.

Also tests the tests: the answers typed into the student notebook get full marks; the blank
notebook fails every graded test cell; answers the package computed fail their own tests only
(typical bugs and pasted numbers of every section: tests/grader/mutants).
The class is section 02's part of the shared class run (tests/grader/class_run.py), whose
other students are checked by tests/grader/test_sections.py.
"""

import json

import pytest

from autograder.course import gradebook_url, open_gradebook
from autograder.fixtures import copy_course
from tests.grader.class_run import ALL_TESTS, AT_BIRTH, MAX_SCORE, SECTION_02_CLASS
from tests.helpers import NOTEBOOK, SECTION, run_module

CLASS = SECTION_02_CLASS


def test_grading_finishes_with_exit_0(graded):
    assert graded.done.returncode == 0, graded.done.stdout + graded.done.stderr
    assert f"graded {len(graded.rows)} submissions" in graded.done.stdout


def test_grades_csv_has_the_expected_row_for_every_student(graded):
    rows = {student: row for (student, section), row in graded.rows.items() if section == SECTION}
    assert set(CLASS) <= set(rows)
    for student, (_, score, status, _) in CLASS.items():
        row = rows[student]
        assert row["section"] == SECTION
        assert float(row["score"]) == score, (student, row)
        assert float(row["max_score"]) == MAX_SCORE, (student, row)
        assert row["status"].startswith(status), (student, row)


def test_a_torch_sections_kernels_start_warm_with_torch_and_the_launchers_fork_server(graded):
    """The zygote preloads what section 02 imports (torch), and each kernel forked from it
    starts the launcher's fork server at birth, before the notebook imports anything."""
    if "sandbox: off" in graded.done.stdout:
        pytest.skip("kernels start cold without the sandbox")
    at_birth = graded.course / "autograder" / "autograded" / "answered" / SECTION / AT_BIRTH
    assert json.loads(at_birth.read_text()) == {
        "frozen_heap": True,
        "torch": True,
        "fork_server": True,
    }


def test_every_row_has_a_feedback_page(graded):
    course = graded.course
    for (student, section), row in graded.rows.items():
        pages = row["feedback"].split()
        assert pages, (student, section)
        for page in pages:
            assert (course / page).is_file(), (student, section, page)
    missing_page = (course / graded.rows[("missing", SECTION)]["feedback"]).read_text()
    assert "No submission" in missing_page


def test_each_graded_cell_scores_as_expected(graded):
    """Test the tests: which graded cells pass, cell by cell, from the gradebook."""
    course = graded.course
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


def test_answers_the_package_computed_are_refused_however_it_was_held(graded):
    reason = graded.rows[("delegates", SECTION)]["reason"]
    assert reason.startswith("failed "), reason
    for grade_id in CLASS["delegates"][3]:
        assert f"{grade_id} (NotYourOwnWork" in reason, reason  # "; likely bug: ..." may follow


def test_submitted_files_are_never_changed(graded):
    assert graded.before == graded.after


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


def test_the_report_flags_no_pair_among_the_class_runs_honest_students(graded):
    """Every student of the class run is the reference answer, a catalogued mistake or a
    fixture of the grader: what they share is the reference, which is not evidence."""
    report = (graded.course / "autograder" / "report.md").read_text()
    similar = report[report.index("## Similar answers") :]
    assert "No pair above the threshold." in similar, similar[:2000]


def test_the_grader_logs_each_rank_tests_messages_beside_the_graded_notebook(graded):
    """What the report compares (autograder.similarity): the reference's rank tests' messages,
    each rank's, and which tests passed; the logs never reach a feedback page."""
    from autograder import similarity

    folder = graded.course / "autograder" / "autograded" / "reference" / SECTION
    times = folder / similarity.test_times_name(NOTEBOOK)
    patterns = similarity.message_patterns(folder / similarity.message_log_name(NOTEBOOK), times)
    assert set(patterns) == {"test_zero1_adam", "test_fsdp_sgd"}, set(patterns)
    for test, pattern in patterns.items():
        assert {(n, rank) for n, rank, _ in pattern} >= {(2, 0), (2, 1), (3, 2)}, test
    assert {"test_zero1_adam", "test_fsdp_sgd"} <= similarity.passed_tests(times)
    assert not list((graded.course / "autograder" / "feedback").rglob("*.jsonl"))
