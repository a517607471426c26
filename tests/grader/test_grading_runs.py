"""Nothing lost: a killed class run resumes and grades every student once, grading again gives
the same grades, and submitted files stay byte-identical throughout."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from autograder import store
from autograder.catalogue import cases
from autograder.results import Result
from autograder.resume import RunState
from tests.helpers import (
    catalogue_class,
    digest,
    kill_when_stored,
    module_env,
    progress_counts,
    run_module,
)

STUDENTS = ["honest-complete", "honest-blank", "syntax-error", "patch-numpy", "kernel-exit"]


def _grades(course):
    with (course / "autograder" / "grades.csv").open(newline="") as f:
        return {
            (r["student_id"], r["section"]): (r["score"], r["status"], r["reason"])
            for r in csv.DictReader(f)
        }


def _grade_command():
    return [sys.executable, "-m", "autograder.grade", "--jobs", "2"]


@pytest.fixture()
def small_class(tmp_path):
    return catalogue_class(tmp_path / "course", STUDENTS)


def test_a_killed_run_resumes_and_grading_again_changes_nothing(small_class):
    """Killed, resumed, graded again: every student graded once per run, the same grades, and
    submitted files untouched throughout. The results table is the one store of results: the
    resumed run takes the killed run's rows from it as they are."""
    submitted = small_class / "autograder" / "submitted"
    before = digest(submitted)
    url = f"sqlite:///{small_class / 'autograder' / 'gradebook.db'}"
    run = subprocess.Popen(
        _grade_command(),
        cwd=small_class,
        env=module_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    stored = kill_when_stored(run, url, 2)
    graded_before = len(stored)
    assert 2 <= graded_before < len(STUDENTS)
    assert (small_class / "autograder" / ".work" / "run.json").is_file()

    again = run_module(small_class, "autograder.grade", "--jobs", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resuming an interrupted run: {graded_before} of {len(STUDENTS)}" in again.stdout
    counts = progress_counts(again.stderr)  # the bar starts from what was already graded
    assert counts[0] == f"{graded_before}/{len(STUDENTS)}", counts
    assert counts[-1] == f"{len(STUDENTS)}/{len(STUDENTS)}", counts
    kept = store.load_results(store.resolve(url))
    assert sorted(s for s, _ in kept) == sorted(STUDENTS)
    assert {job: kept[job]["graded_at"] for job in stored} == stored, "resumed, not regraded"
    assert len({row["run_id"] for row in kept.values()}) == 1, "one run, resumed"
    assert not (small_class / "autograder" / ".work" / "run.json").exists(), "the run finished"
    rows = _grades(small_class)
    assert sorted(s for s, _ in rows) == sorted(STUDENTS)
    assert rows[("honest-complete", cases.SECTION)][:2] == ("5", "graded")

    second = run_module(small_class, "autograder.grade", "--jobs", "2")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming" not in second.stdout, "a finished run must not be resumed"
    again_kept = store.load_results(store.resolve(url))
    assert all(again_kept[job]["graded_at"] > kept[job]["graded_at"] for job in kept)
    assert _grades(small_class) == rows
    assert digest(submitted) == before


def test_without_the_sandbox_grading_goes_on_and_says_so(small_class):
    done = run_module(small_class, "autograder.grade", "--no-sandbox", "--student", "patch-numpy")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sandbox: off (--no-sandbox)" in done.stdout
    report = (small_class / "autograder" / "report.md").read_text()
    assert "sandbox for student code: off (--no-sandbox)" in report
    rows = _grades(small_class)
    score, status, _ = rows[("patch-numpy", cases.SECTION)]
    assert score == "2" and "numpy.allclose was replaced" in status


def test_a_broken_reference_notebook_stops_the_run_with_nbgraders_reason(tmp_path):
    course = catalogue_class(tmp_path / "course", ["honest-complete"])
    reference = course / "solutions" / cases.SECTION / f"{cases.NOTEBOOK}.ipynb"
    nb = json.loads(reference.read_text())
    graded = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id")]
    graded[1]["metadata"]["nbgrader"]["grade_id"] = graded[0]["metadata"]["nbgrader"]["grade_id"]
    reference.write_text(json.dumps(nb))
    submitted = course / "autograder" / "submitted"
    before = digest(submitted)
    done = run_module(course, "autograder.grade", "--jobs", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Duplicate grade id: mean_square" in done.stderr, done.stderr
    assert "nothing was graded: fix the reference notebook in solutions/" in done.stderr
    assert "ReleaseError" not in done.stderr, "a message, not the grader's traceback"
    assert not (course / "autograder" / "grades.csv").exists()
    assert digest(submitted) == before


def _result(student):
    return Result(student, "s", 1.0, 2.0, "graded", "", "every test passed")


def test_a_run_resumes_unchanged_submissions_from_the_results_table(tmp_path):
    for student in ("a", "b"):
        (tmp_path / "submitted" / student / "s").mkdir(parents=True)
        (tmp_path / "submitted" / student / "s" / "nb.ipynb").write_text(student)
    url = store.resolve(f"sqlite:///{tmp_path / 'g.db'}")
    table = store.Results(url)
    state = RunState(work=tmp_path / "work", submitted=tmp_path / "submitted")
    jobs, key = [("a", "s"), ("b", "s")], {"jobs": [("a", "s"), ("b", "s")]}

    def keep(result, run_id):
        job = (result.student_id, result.section)
        table.save(result, sandbox="on", graded_by="here", digest=state.digest(job), run_id=run_id)

    run_id, done = state.start(jobs, key, table)  # no table yet: nothing to resume
    assert done == {}
    with store.exclusive(url):
        store.create_tables(url)
    keep(_result("a"), run_id)
    keep(_result("b"), "an-earlier-run")  # stored, but by another run
    assert state.start(jobs, key, table) == (run_id, {("a", "s"): _result("a")})  # killed
    keep(_result("b"), run_id)
    assert state.start(jobs, key, table) == (run_id, {job: _result(job[0]) for job in jobs})
    (tmp_path / "submitted" / "b" / "s" / "nb.ipynb").write_text("changed")
    assert state.start(jobs, key, table) == (run_id, {("a", "s"): _result("a")})  # b again
    other, done = state.start(jobs, {"jobs": [("a", "s")]}, table)  # other arguments
    assert other != run_id and done == {}
    assert state.start(jobs, {"jobs": [("a", "s")]}, table) == (other, {})
    state.finish()
    fresh, done = state.start(jobs, {"jobs": [("a", "s")]}, table)  # a finished run: anew
    assert fresh not in (run_id, other) and done == {}
    table.close()
