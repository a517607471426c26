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
    assert f"{len(STUDENTS)} of {len(STUDENTS)} submissions kept as graded before" in second.stdout
    unchanged = store.load_results(store.resolve(url))
    assert {job: r["graded_at"] for job, r in unchanged.items()} == {
        job: r["graded_at"] for job, r in kept.items()
    }, "nothing changed: nothing regraded"
    forced = run_module(small_class, "autograder.grade", "--jobs", "2", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    again_kept = store.load_results(store.resolve(url))
    assert all(again_kept[job]["graded_at"] > kept[job]["graded_at"] for job in kept)
    assert _grades(small_class) == rows
    assert digest(submitted) == before


_OUTPUTS = ("grades.csv", "grades_lms.csv", "grades_history.csv", "report.md")


def _outputs(course) -> dict[str, bytes]:
    """What an instructor reads after a run: the tables, the report (its line of when it was
    written left out: that is the run's own) and every feedback page."""
    folder = course / "autograder"
    found = {name: (folder / name).read_bytes() for name in _OUTPUTS if (folder / name).exists()}
    found["report.md"] = b"\n".join(
        line for line in found["report.md"].splitlines() if not line.startswith(b"Written ")
    )
    for page in sorted((folder / "feedback").rglob("*.html")):
        found[page.relative_to(folder).as_posix()] = page.read_bytes()
    return found


def test_a_resubmission_regrades_only_itself_and_equals_a_full_regrade(small_class):
    """Issue 55: one student hands in again; only that submission runs, and every output
    (grades, history, report, LMS table, feedback pages) equals a full regrade's."""
    url = f"sqlite:///{small_class / 'autograder' / 'gradebook.db'}"
    first = run_module(small_class, "autograder.grade", "--jobs", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    before = store.load_results(store.resolve(url))
    ctx = cases.Context(root=small_class, host_port=9)
    resubmitted = small_class / "autograder" / "submitted" / "honest-blank" / cases.SECTION
    cases.CASES["honest-complete"].write(resubmitted, ctx)
    again = run_module(small_class, "autograder.grade", "--jobs", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    others = len(STUDENTS) - 1
    assert f"{others} of {len(STUDENTS)} submissions kept as graded before" in again.stdout
    assert "graded 1 submissions in" in again.stdout, again.stdout
    after = store.load_results(store.resolve(url))
    regraded = {job for job in after if after[job]["graded_at"] != before[job]["graded_at"]}
    assert regraded == {("honest-blank", cases.SECTION)}
    assert _grades(small_class)[("honest-blank", cases.SECTION)][:2] == ("5", "graded")
    incremental = _outputs(small_class)
    forced = run_module(small_class, "autograder.grade", "--jobs", "2", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    full = _outputs(small_class)
    assert incremental.keys() == full.keys()
    for name in full:
        assert incremental[name] == full[name], name
    # a change to the section's tests regrades everyone of it
    reference = small_class / "solutions" / cases.SECTION / f"{cases.NOTEBOOK}.ipynb"
    nb = json.loads(reference.read_text())
    test = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade"))
    test["source"] = "".join(test["source"]) + "\nassert True  # a changed test\n"
    reference.write_text(json.dumps(nb))
    changed = run_module(small_class, "autograder.grade", "--jobs", "2")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "kept as graded before" not in changed.stdout


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


def test_a_timeout_on_a_busy_machine_is_said_and_graded_again():
    """Issue 59: a cell that ran out of time while the machine was busy is not the answer's
    fault: the reason says so, the student's words say it will be graded again, and the row is
    stored without a digest, so that the next run grades it again."""
    from autograder import results, resume

    timed_out = Result("s", "x", 2.0, 5.0, "error: timeout in cell 7 (f)", "", "")
    assert resume.busy_timeout(timed_out, load=1.2, cores=2) == "", "idle: the answer's own"
    said = resume.busy_timeout(timed_out, load=9.0, cores=2)
    assert said.startswith(results.BUSY_TIMEOUT) and "load 9.0 on 2 cores" in said
    graded = Result("s", "x", 5.0, 5.0, "graded", "", "")
    assert resume.busy_timeout(graded, load=9.0, cores=2) == ""
    row = {"score": "2", "max_score": "5", "reason": said}
    assert "will be graded again" in results.student_words(row)
