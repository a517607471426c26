"""The example Slurm script, autograder/cluster/grade-array.sbatch, grades a class as it says:
submitted as a job array of two tasks from a course folder on a real (one-node) Slurm cluster,
with GRADEBOOK naming a PostgreSQL gradebook, each task grades its own shard through
`make grade`, in the sandbox where this machine allows it; `autograder.report` then writes
grades.csv with every student's catalogue score.

The cluster (Debian's slurm-wlm and munge) and the PostgreSQL server are started in temporary
folders (tests/grader/slurm.py, postgres.py), which needs root. Where they cannot be started
the test is skipped and says why; under CI (CI=true) it fails instead.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import course, sandbox, store
from autograder.catalogue import cases
from tests.grader import postgres, slurm
from tests.helpers import catalogue_class, run_module

STUDENTS = ["honest-complete", "honest-blank", "patch-numpy"]
SCRIPT = course.ROOT / "autograder" / "cluster" / "grade-array.sbatch"
VENV = Path(sys.executable).parent.parent  # this test's environment, e.g. <repo>/.venv


@pytest.fixture(scope="module")
def servers():
    why = postgres.why_not() or slurm.why_not()
    if why is None and shutil.which("make") is None:
        why = "the Slurm script runs make, which is not installed"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm grading test: {why}")
        pytest.skip(why)
    server = postgres.start()
    try:
        with slurm.running() as cluster:
            yield server, cluster
    finally:
        server.stop()


def _make_flags(scratch: Path) -> str:
    """MAKEFLAGS under which `make grade` in the course copy uses this test's environment
    as installed (`make install` done), changing nothing in it and building nothing.

    A .venv in the copy linking to this environment would make `make` reinstall into this
    environment whenever its stamp is older than pyproject.toml (an edited checkout). So
    VENV names the environment itself, and STAMP a file of the copy's, newer than its
    pyproject.toml. (A linked .venv is graded correctly: test_sandbox.py checks that the
    sandbox keeps the link's path visible.)
    """
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(course.ROOT / name, scratch / name)
    stamp = scratch / ".installed"
    stamp.touch()
    flags = f"VENV={VENV} STAMP={stamp}"
    assert len(flags.split()) == 2, f"MAKEFLAGS cannot hold paths with spaces: {flags}"
    return flags


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_the_example_script_grades_a_class_in_two_shards_on_slurm(tmp_path, servers):
    server, cluster = servers
    scratch = catalogue_class(tmp_path, STUDENTS)
    url = server.create_database("slurm_class")
    env = dict(cluster.env, GRADEBOOK=url, MAKEFLAGS=_make_flags(scratch))
    for name in ("MAKELEVEL", "MFLAGS", "MAKEOVERRIDES"):  # from `make test`, if it runs us
        env.pop(name, None)
    env["PATH"] = os.pathsep.join([str(VENV / "bin"), env.get("PATH", "")])
    plan = subprocess.run(
        ["make", "--no-print-directory", "-n", "grade", "SHARD=1/2"],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
    )
    grade = f"{VENV / 'bin' / 'python'} -m autograder.grade"
    assert plan.returncode == 0 and plan.stdout.startswith(grade), plan.stdout + plan.stderr

    # One CPU per task instead of the script's two: both tasks run at once on a 2-CPU node.
    done = cluster.run(
        *("sbatch", "--wait", "--array=1-2", "--cpus-per-task=1", str(SCRIPT)),
        cwd=scratch,
        env=env,
        timeout=300,
    )
    outputs = [p.read_text() for p in sorted(scratch.glob("slurm-*.out"))]
    shown = "".join(f"\n--- task output\n{text}" for text in outputs)
    assert done.returncode == 0, done.stdout + done.stderr + shown + "\n" + cluster.logs()
    assert len(outputs) == 2, shown
    note = "on" if sandbox.probe() is None else "off: "
    for index in (1, 2):
        (text,) = [t for t in outputs if f"shard {index}/2: " in t]
        assert f"sandbox: {note}" in text and "--jobs 1" in text, shown

    report = run_module(scratch, "autograder.report", "--db", url)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "3 of 3 submissions graded" in report.stdout, report.stdout
    rows = _csv(scratch / "autograder" / "grades.csv")
    assert sorted(r["student_id"] for r in rows) == sorted(STUDENTS)
    for row in rows:
        case = cases.CASES[row["student_id"]]
        assert float(row["score"]) == case.score and row["status"].startswith(case.status), (
            row,
            shown,
        )

    results = store.load_results(store.resolve(url))
    assert sorted(results) == sorted((s, cases.SECTION) for s in STUDENTS)
    graders = {row["graded_by"].rsplit(" ", 1)[-1] for row in results.values()}
    assert graders == {"1/2", "2/2"}
    assert {row["sandbox"][: len(note)] for row in results.values()} == {note}
