"""Helpers shared by the tests (``from tests.helpers import ...``).

The detailed autograder tests use the memory section (02) as their class.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

from autograder import fixtures

ROOT = Path(__file__).resolve().parent.parent
SECTION = "02_memory_sharding"
NOTEBOOK = "memory_sharding"
SOLUTION_NB = ROOT / "solutions" / SECTION / f"{NOTEBOOK}.ipynb"
RELEASED_NB = ROOT / "notebooks" / SECTION / f"{NOTEBOOK}.ipynb"


def module_env() -> dict[str, str]:
    """The environment the Makefile gives `python -m ...`: this interpreter's bin/ first."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (its path relative to ``folder``) with the SHA-256 of its
    bytes: two digests are equal when nothing under ``folder`` changed."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def kill_when_stored(
    run: subprocess.Popen, url: str, entries: int, graded_by: str = ""
) -> dict[tuple[str, str], float]:
    """Kill ``run`` (and its process group) once the gradebook at ``url`` holds ``entries``
    results (of graders whose name ends with ``graded_by``), as a lost machine would; the
    results it had stored, by (student, section), with the time each was graded."""
    from autograder import store

    table = store.Results(store.resolve(url))

    def stored() -> dict[tuple[str, str], float]:
        rows = table.load().items()
        return {job: r["graded_at"] for job, r in rows if r["graded_by"].endswith(graded_by)}

    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and run.poll() is None:
            if len(stored()) >= entries:
                break
            time.sleep(0.2)
        assert run.poll() is None, "the run finished before it could be killed"
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        return stored()
    finally:
        table.close()


def run_module(course_root: Path, module: str, *args: str, timeout_s: float = 600):
    """Run `python -m MODULE ARGS` from a course copy, as the Makefile would."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=course_root,
        env=module_env(),
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
    # one hand-in time for every file, so that two classes written apart grade alike (the
    # report's submitted_at is the notebooks' file time when no LMS download gave one)
    handed_in = 1_767_225_600  # 2026-01-01 00:00 UTC
    for path in (course / "autograder" / "submitted").rglob("*"):
        if path.is_file() and not path.is_symlink():  # a case's link points elsewhere
            os.utime(path, (handed_in, handed_in))
    return course


def graded_cell(grade_id: str, source: str, *, test: bool, cell_id: str) -> nbformat.NotebookNode:
    """A code cell with nbgrader's metadata: a test worth 1 point, or (``test=False``) an
    answer cell; ``cell_id`` is its notebook cell id."""
    meta = {"grade": test, "grade_id": grade_id, "solution": not test, "locked": test}
    if test:
        meta["points"] = 1
    cell = new_code_cell(source, metadata={"nbgrader": meta})
    cell["id"] = cell_id
    return cell


def answered_notebook(**kwargs) -> nbformat.NotebookNode:
    """The memory notebook with the reference answers typed in (see autograder.fixtures)."""
    return fixtures.answered_notebook(SECTION, NOTEBOOK, **kwargs)


def progress_counts(stderr: str) -> list[str]:
    """The "done/total" of each state of the grader's progress line, in order."""
    states = [part for line in stderr.splitlines() for part in line.split("\r")]
    return [state.split("] ", 1)[1].split()[0] for state in states if state.startswith("grading [")]


class NoAnswer(Exception):
    """What :func:`call_within` returns for a call that raised or ran past its limit."""


def call_within(seconds: int, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, or :class:`NoAnswer` (the class, as a marker) if it raises or
    takes more than ``seconds`` (SIGALRM: the main thread only). For probes that call package
    functions with arguments they were not written for (tests/repo/test_no_answers*.py)."""
    import numpy as np

    def stop(*_):
        raise NoAnswer

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    except BaseException as error:  # noqa: BLE001  (a wrong call, a refusal, too slow)
        if isinstance(error, KeyboardInterrupt):
            raise
        return NoAnswer
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def kept_process_state():
    """A generator for a fixture: what a probed package function may change for the tests
    after it, put back (torch's default dtype and thread count, and the mark that this
    process is a rank, :mod:`distopt.problems.own_data`). Rank code sets float64 as the
    default dtype in its own process; called here, it must not leave it for a training
    run later in this worker."""
    import torch

    from distopt.problems import own_data

    dtype, threads, rank_seen = (
        torch.get_default_dtype(),
        torch.get_num_threads(),
        own_data._rank_seen,
    )
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        own_data._rank_seen = rank_seen
