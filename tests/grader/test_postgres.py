"""A class graded in two shards at once against one PostgreSQL gradebook, one shard killed
midway and run again, gives exactly the grades of one SQLite run on one machine.

The server is a real PostgreSQL (Debian's, which `make test` installs when run as root),
started in a temporary folder on a unix socket. Where it cannot be started the test is skipped
and says why; under CI (CI=true) it fails instead, so that CI never passes without it.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import store
from autograder.catalogue import cases
from autograder.course import open_gradebook
from tests.grader import postgres
from tests.helpers import catalogue_class, kill_when_stored, module_env, run_module

STUDENTS = [
    "honest-complete",
    "honest-blank",
    "syntax-error",
    "patch-numpy",
    "kernel-exit",
    "missing",
]


@pytest.fixture(scope="module")
def server():
    why = postgres.why_not()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL gradebook test: {why}")
        pytest.skip(why)
    running = postgres.start()
    yield running
    running.stop()


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _grades(course: Path) -> list[dict[str, str]]:
    return _csv(course / "autograder" / "grades.csv")


def _test_scores(url: str) -> list[tuple]:
    """Every graded cell's score in nbgrader's gradebook: (student, notebook, cell, score)."""
    with open_gradebook(store.resolve(url)) as gb:
        return sorted(
            (submission.student.id, notebook.name, grade.name, grade.score)
            for assignment in gb.assignments
            for submission in assignment.submissions
            for notebook in submission.notebooks
            for grade in notebook.grades
        )


def _shard(course: Path, url: str, index: int, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "autograder.grade", "--jobs", "1"]
    return subprocess.Popen(
        [*command, "--db", url, "--shard", f"{index}/2"],
        cwd=course,
        env=module_env(),
        text=True,
        start_new_session=True,
        **popen,
    )


def test_two_shards_on_postgres_grade_exactly_as_one_sqlite_run(tmp_path, server):
    reference = catalogue_class(tmp_path / "sqlite", STUDENTS)
    done = run_module(reference, "autograder.grade", "--jobs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    expected = _grades(reference)
    assert sorted(r["student_id"] for r in expected) == sorted(STUDENTS)

    course = catalogue_class(tmp_path / "postgres", STUDENTS)
    url = server.create_database("class_run")
    first = _shard(course, url, 1, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = _shard(course, url, 2, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stored = kill_when_stored(first, url, 1, graded_by=" 1/2")  # a machine lost midway
    killed_after = len(stored)
    assert 1 <= killed_after < 3, "killed midway: some of its 3 submissions graded, not all"
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, out + err
    assert "shard 2/2: 3 of 6 submissions" in out, out
    assert "make grade-report" in out and "grades.csv" not in out, out

    not_yet = run_module(course, "autograder.report", "--db", url)
    assert not_yet.returncode == 1, not_yet.stdout + not_yet.stderr
    assert "not graded yet" in not_yet.stdout and "SHARD=i/n" in not_yet.stdout

    again = run_module(course, "autograder.grade", "--jobs", "1", "--db", url, "--shard", "1/2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resuming an interrupted run: {killed_after} of 3 already graded" in again.stdout
    rows = store.load_results(store.resolve(url))
    shard_one = {job: row for job, row in rows.items() if row["graded_by"].endswith(" 1/2")}
    assert len(shard_one) == 3, "none lost"
    assert {job: shard_one[job]["graded_at"] for job in stored} == stored, "resumed, not regraded"

    report = run_module(course, "autograder.report", "--db", url)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "6 of 6 submissions graded" in report.stdout
    assert _grades(course) == expected  # every column, row for row
    assert _csv(course / "autograder" / "grades_lms.csv") == _csv(
        reference / "autograder" / "grades_lms.csv"
    )
    sqlite_url = f"sqlite:///{reference / 'autograder' / 'gradebook.db'}"
    scores = _test_scores(url)
    assert len(scores) == 3 * 5  # 3 tests for each student with a notebook
    assert scores == _test_scores(sqlite_url)
    assert len({row[:3] for row in scores}) == len(scores), "one grade per test and student"
    rows = store.load_results(store.resolve(url))
    assert sorted(rows) == sorted((s, cases.SECTION) for s in STUDENTS)
    graders = {row["graded_by"].rsplit(" ", 1)[-1] for row in rows.values()}
    assert graders == {"1/2", "2/2"}
    report_md = (course / "autograder" / "report.md").read_text()
    assert "| test_mean_square |" in report_md  # the hardest tests, from PostgreSQL
