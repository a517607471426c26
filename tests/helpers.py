"""Helpers shared by the tests (``from tests.helpers import ...``).

The detailed autograder tests use the memory section (02) as their class.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat

from autograder import fixtures

ROOT = Path(__file__).resolve().parent.parent
SECTION = "02_memory_sharding"
NOTEBOOK = "memory_sharding"
SOLUTION_NB = ROOT / "solutions" / SECTION / f"{NOTEBOOK}.ipynb"
RELEASED_NB = ROOT / "notebooks" / SECTION / f"{NOTEBOOK}.ipynb"


def run_module(course_root: Path, module: str, *args: str, timeout_s: float = 600):
    """Run `python -m MODULE ARGS` from a course copy, as the Makefile would."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=course_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def catalogue_class(folder: Path, students: list[str]) -> Path:
    """A scratch course in ``folder`` whose ``students`` hand in the catalogue assignment
    (autograder/catalogue/cases.py: each writes its case's submission)."""
    from autograder.catalogue import cases

    course = fixtures.copy_course(folder)
    cases.install(course)
    done = run_module(course, "autograder.release", cases.SECTION)
    assert done.returncode == 0, done.stderr
    ctx = cases.Context(root=course, host_port=9)
    for student in students:
        cases.CASES[student].write(
            course / "autograder" / "submitted" / student / cases.SECTION, ctx
        )
    return course


def answered_notebook(**kwargs) -> nbformat.NotebookNode:
    """The memory notebook with the reference answers typed in (see autograder.fixtures)."""
    return fixtures.answered_notebook(SECTION, NOTEBOOK, **kwargs)


def progress_counts(stderr: str) -> list[str]:
    """The "done/total" of each state of the grader's progress line, in order."""
    states = [part for line in stderr.splitlines() for part in line.split("\r")]
    return [state.split("] ", 1)[1].split()[0] for state in states if state.startswith("grading [")]
