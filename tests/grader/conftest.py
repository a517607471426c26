"""The class run that test_sections, test_autograder, test_mutants and test_release share
(class_run.py).

It is graded once per test session: under `make test` the root conftest.py schedules the four
files as one unit of work, so the one worker that runs them builds it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from autograder.fixtures import copy_course
from tests.grader import class_run
from tests.helpers import digest, run_module


@dataclass
class ClassRun:
    course: Path  # the scratch copy of the course that was graded
    done: CompletedProcess  # `python -m autograder.grade --jobs 2`
    rows: dict[tuple[str, str], dict[str, str]]  # grades.csv by (student, section)
    before: dict[str, str]  # digest of every submitted file before grading
    after: dict[str, str]  # and after


@pytest.fixture(scope="session")
def graded(tmp_path_factory) -> ClassRun:
    scratch = copy_course(tmp_path_factory.mktemp("class_run"))
    submitted = scratch / "autograder" / "submitted"
    # section 02's "blank" is the one every section has
    extra = {k: v[0] for k, v in class_run.SECTION_02_CLASS.items() if k != "blank"}
    class_run.write_class(submitted, extra)
    before = digest(submitted)
    done = run_module(scratch, "autograder.grade", "--jobs", "2", timeout_s=2400)
    assert done.returncode == 0, done.stdout + done.stderr
    with (scratch / "autograder" / "grades.csv").open(newline="") as f:
        rows = {(r["student_id"], r["section"]): r for r in csv.DictReader(f)}
    return ClassRun(scratch, done, rows, before, digest(submitted))
