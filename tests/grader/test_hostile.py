"""The catalogue of broken and hostile submissions (autograder/catalogue/cases.py), graded in
one class run next to honest students: each gets its expected score, status and reason, the
class run finishes, nothing submitted changes, nothing leaks out of or into the sandbox.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import html
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import nbformat
import pytest

from autograder import bounds, outcomes, sandbox
from autograder.catalogue import cases
from autograder.fixtures import copy_course
from autograder.nbgrader_plugins import SEALED_NOTE
from tests.helpers import ROOT, digest, progress_counts, run_module

SANDBOX = sandbox.probe()  # None when the sandbox works here
CGROUPS = isinstance(bounds.detect(), bounds.Hierarchy)  # a bound per submission
CATALOGUE = {
    k: c
    for k, c in cases.CASES.items()
    if (SANDBOX is None or not c.sandbox) and (CGROUPS or not c.cgroups)
}
# For the catalogue's infinite loop, fork bomb and hung rank. Long enough for a cell that
# launches ranks under a loaded class run. Without the sandbox, kernels start cold and the fork
# server's first start imports torch (3 s here alone, over 10 s beside two other kernels on 2
# cores; at 20 s the greedy ranks' cell once ran out of time under a loaded `make test`). With
# it, kernels are forked warm with their fork server running (autograder/zygote.py), and the
# slowest rank cell (hung-rank-in-a-cell: a launch with a 5 s timeout) takes about 6 s.
CELL_TIMEOUT_S = 15 if SANDBOX is None else 30


class _Listener:
    """A TCP server on the host's loopback that counts connections (none may arrive)."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass

    def close(self):
        self._stop.set()
        self._thread.join()
        self.server.close()


def _second_clone() -> Path | None:
    """A clone of this repository outside the course root and outside /tmp (which every
    kernel has private anyway): beside the repository, else in the home folder. It holds
    hidden tests (solutions/, the catalogue) that no kernel may read. None without git."""
    for parent in (ROOT.parent, Path.home()):
        try:
            folder = Path(tempfile.mkdtemp(prefix=".other-term-", dir=parent))
        except OSError:
            continue
        done = subprocess.run(
            ["git", "clone", "--quiet", "--depth", "1", f"file://{ROOT}", str(folder / "course")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode == 0:
            return folder
        shutil.rmtree(folder, ignore_errors=True)
    return None


@pytest.fixture(scope="module")
def other_clone():
    folder = _second_clone()
    yield folder
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def graded(tmp_path_factory, other_clone):
    course = copy_course(tmp_path_factory.mktemp("course"))
    cases.install(course, imports_torch=True)  # the cases that launch ranks start warm
    released = run_module(course, "autograder.release", cases.SECTION)
    assert released.returncode == 0, released.stdout + released.stderr
    listener = _Listener()
    ctx = cases.Context(root=course, host_port=listener.port)
    submitted = course / "autograder" / "submitted"
    for student, case in CATALOGUE.items():
        case.write(submitted / student / case.section, ctx)
    before = digest(submitted)
    start = time.perf_counter()
    done = run_module(
        course,
        "autograder.grade",
        "--jobs",
        "2",
        "--cell-timeout",
        f"{cases.SECTION}={CELL_TIMEOUT_S}",
    )
    elapsed = time.perf_counter() - start
    listener.close()
    with (course / "autograder" / "grades.csv").open(newline="") as f:
        rows = {(r["student_id"], r["section"]): r for r in csv.DictReader(f)}
    return course, done, rows, before, digest(submitted), listener, elapsed


def test_the_class_run_finishes(graded):
    _, done, rows, *_, elapsed = graded
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"catalogue of {len(CATALOGUE)} submissions graded in {elapsed:.0f} s")
    if SANDBOX is not None:
        print(f"sandbox unavailable ({SANDBOX}): its cases were left out")
    if not CGROUPS:
        print(f"no control group per submission ({bounds.detect()}): its cases were left out")
    first = done.stdout.splitlines()[0]
    assert first.startswith("sandbox: on; bounds: ") or SANDBOX is not None, first
    assert ("per submission, cgroup" in first) == CGROUPS, first
    jobs = len(rows)  # every student has a row for each section anyone handed in
    counts = progress_counts(done.stderr)
    assert counts[0] == f"0/{jobs}" and counts[-1] == f"{jobs}/{jobs}", counts
    assert "grading [" not in done.stdout, "the progress line belongs on stderr"


def test_two_workers_never_found_the_gradebook_locked(graded):
    """Both workers write the one SQLite gradebook; its busy timeout makes them wait."""
    course, _, rows, *_ = graded
    log = (course / "autograder" / ".work" / "grading.log").read_text()
    assert "database is locked" not in log
    assert not [r for r in rows.values() if "nbgrader could not grade it" in r["status"]]


@pytest.mark.parametrize("student", sorted(CATALOGUE))
def test_each_submission_gets_its_expected_grade(graded, student):
    _, done, rows, *_ = graded
    case = CATALOGUE[student]
    row = rows[(student, case.section)]
    assert float(row["score"]) == case.score, row
    assert row["status"].startswith(case.status), row
    for words in case.reason:
        assert words in row["status"] + " " + row["reason"], (words, row)


def test_honest_students_are_unaffected(graded):
    """Graded beside forks, bombs and patches, the honest rows are exactly right."""
    _, _, rows, *_ = graded
    complete = rows[("honest-complete", cases.SECTION)]
    assert (complete["score"], complete["status"]) == ("5", "graded")
    blank = rows[("honest-blank", cases.SECTION)]
    assert (blank["score"], blank["status"]) == ("0", "graded")


def test_submissions_are_byte_identical_after_grading(graded):
    _, _, _, before, after, *_ = graded
    assert before == after


@pytest.mark.skipif(SANDBOX is not None, reason=f"no sandbox here: {SANDBOX}")
def test_student_code_reads_writes_and_connects_nowhere_else(graded):
    course, _, _, _, _, listener, _ = graded
    autograded = course / "autograder" / "autograded"
    loot = {
        name: json.loads((autograded / name / cases.SECTION / "loot.json").read_text())
        for name in ("read-solutions-and-others", "write-outside", "network")
    }
    for name, found in loot.items():
        assert found["read"] == [], (name, found["read"][:5])
    assert loot["write-outside"]["written"] == []
    assert not (course / "pwned.txt").exists()
    assert loot["network"]["network"] == []
    assert loot["network"]["loopback"] is True, "torch.distributed needs a loopback"
    assert listener.connections == 0


@pytest.mark.skipif(SANDBOX is not None, reason=f"no sandbox here: {SANDBOX}")
def test_a_kernel_walking_the_machine_finds_no_hidden_tests(graded, other_clone):
    """The kernel sees an allow list: another clone of the course on this machine (with its
    solutions/ and catalogue) is not there, nor anything else holding hidden tests; the walk
    covered the whole view (the environment's files included)."""
    course, *_ = graded
    autograded = course / "autograder" / "autograded" / "walk-the-machine" / cases.SECTION
    loot = json.loads((autograded / "loot.json").read_text())
    assert loot["read"] == [], loot["read"][:10]
    assert loot["walked"] > 10_000 and loot["searched"] > 1_000, loot
    print(f"the kernel walked {loot['walked']} files in {loot['walk_s']} s, found none")
    if other_clone is None:
        pytest.skip("no second clone of the repository could be made (git, a writable folder)")
    # The same walk outside the sandbox, over the other clone: it finds its hidden tests.
    code = (
        "import json, os\nloot = {'read': []}\n"
        + cases.WALK_THE_MACHINE.replace("{walk_root!r}", repr(str(other_clone)))
        + "\nprint(json.dumps(loot['read']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    found = json.loads(done.stdout)
    assert any("/solutions/" in path for path in found), found
    assert any(path.endswith("catalogue.ipynb") for path in found), found


@pytest.mark.skipif(SANDBOX is not None, reason=f"no sandbox here: {SANDBOX}")
def test_kernels_start_warm_and_keep_nothing_of_their_zygote(graded):
    course, *_ = graded
    autograded = course / "autograder" / "autograded"
    loot = {
        name: json.loads((autograded / name / cases.SECTION / "loot.json").read_text())
        for name in ("read-solutions-and-others", "write-outside", "network", "warm-kernel")
    }
    warm = loot["warm-kernel"]
    assert warm["warm"], "forked from the zygote's frozen heap"
    assert (warm["torch"], warm["fork_server"]) == (True, True), "with torch and its server"
    assert warm["grader_modules"] == []
    assert warm["uid"] != 0
    assert warm["env"] == {"HOME": "/tmp", "MPLCONFIGDIR": None, "JPY_PARENT_PID": "1"}
    assert warm["runtime_listed"] is None
    draws = [found["draw"] for found in loot.values()]
    assert len(set(draws)) == len(draws), draws


def test_a_100mb_print_is_cut(graded):
    course, *_ = graded
    path = course / "autograder" / "autograded" / "print-100mb" / cases.SECTION
    notebook = path / f"{cases.NOTEBOOK}.ipynb"
    assert notebook.stat().st_size < 5_000_000
    cells = nbformat.read(notebook, as_version=4).cells
    (cut,) = [
        o for c in cells for o in outcomes.recorded(c) if not isinstance(o, outcomes.ShowOnly)
    ]
    assert isinstance(cut, outcomes.OutputCut) and cut.grade_id == "mean_square"
    assert "the autograder cut this cell's output" in notebook.read_text()


def test_feedback_hides_hidden_tests(graded):
    course, _, rows, *_ = graded
    page = (course / rows[("honest-blank", cases.SECTION)]["feedback"]).read_text()
    assert "mean_square([1, 2, 3])" in page, "visible tests are shown"
    assert "one negative number" not in page and "HIDDEN TESTS" not in page
    wrong = (course / rows[("duplicated-test", cases.SECTION)]["feedback"]).read_text()
    assert "hidden test failed" in wrong or "AssertionError" in wrong
    assert "one negative number" not in wrong
    printed = (course / rows[("print-hidden-tests", cases.SECTION)]["feedback"]).read_text()
    assert SEALED_NOTE in html.unescape(printed), "the printed history is left out"
    assert "one negative number" not in printed, "hidden test code printed by the student"


def _hidden_lines() -> list[str]:
    """The catalogue's hidden test lines (what no feedback page may hold, in any form)."""
    nb = nbformat.read(cases.FOLDER / f"{cases.NOTEBOOK}.ipynb", as_version=4)
    found = []
    for cell in nb.cells:
        hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1:]
        for part in hidden:
            body = part.split("### END HIDDEN TESTS")[0]
            found += [line.strip() for line in body.splitlines() if len(line.strip()) > 8]
    assert len(found) >= 5, found
    return found


def _decoded(page: str) -> list[str]:
    """The page, and every run of base64 in it decoded (and decompressed, where it inflates)."""
    found = [page, page[::-1]]
    for run in re.findall(r"[A-Za-z0-9+/]{24,}={0,2}", page):
        try:
            raw = base64.b64decode(run + "=" * (-len(run) % 4))
        except ValueError:
            continue
        found.append(raw.decode(errors="replace"))
        with contextlib.suppress(zlib.error):
            found.append(zlib.decompress(raw).decode(errors="replace"))
    return found


def test_the_feedback_holds_no_hidden_line_in_any_encoding(graded):
    course, _, rows, *_ = graded
    autograded = course / "autograder" / "autograded" / "encoded-history" / cases.SECTION
    printed = cases.cell_text(autograded / f"{cases.NOTEBOOK}.ipynb")
    assert "base64:" in printed and "one negative number" in printed, "the attack ran"
    page = html.unescape(
        (course / rows[("encoded-history", cases.SECTION)]["feedback"]).read_text()
    )
    assert SEALED_NOTE in page
    for text in _decoded(page):
        for line in _hidden_lines():
            assert line not in text, line


def test_no_text_the_students_code_chose_reaches_grades_report_or_page(graded):
    """The base64-modules case names fake modules, notebook names, sys.modules keys and an
    error class with hidden test lines in base64 (issue 53, item 8): grades.csv, report.md and
    the feedback page say what happened in their own words and quote none of it."""
    course, _, rows, *_ = graded
    autograded = course / "autograder" / "autograded" / "base64-modules" / cases.SECTION
    ran = cases.cell_text(autograded / f"{cases.NOTEBOOK}.ipynb")
    names = [  # as the case computes them
        base64.b64encode(line.encode()).decode()
        for line in _hidden_lines()
        if "negative" in line or "numbers" in line
    ]
    assert len(names) == 2, names
    assert "IntegrityError" in ran, "the attack ran and was caught"
    row = rows[("base64-modules", cases.SECTION)]
    texts = {
        "grades.csv": (course / "autograder" / "grades.csv").read_text(),
        "report.md": (course / "autograder" / "report.md").read_text(),
        "feedback": html.unescape((course / row["feedback"]).read_text()),
    }
    for where, text in texts.items():
        for decoded in _decoded(text):
            for line in _hidden_lines():
                assert line not in decoded, (where, line)
        assert not [name for name in names if name in text], where
    assert "an error class of the notebook's own" in texts["feedback"]


def test_answers_a_person_should_read_are_listed_whatever_they_scored(graded):
    course, _, rows, *_ = graded
    row = rows[("needs-review", cases.SECTION)]
    assert row["score"] == "5"
    report = (course / "autograder" / "report.md").read_text()
    section = report.split("## Answers that need a person's review")[1]
    assert "- needs-review / 99_catalogue (5 / 5):" in section
    assert "cell 10 (dot) line 4, frames or the collector: `caller = sys._getframe(1)" in section
    honest = [s for s in ("honest-complete", "honest-blank") if f"- {s} /" in section]
    assert honest == [], "the reference answers need no review"


def test_no_graded_notebook_or_feedback_page_exceeds_5_mb(graded):
    course, _, rows, *_ = graded
    pages = [course / page for row in rows.values() for page in row["feedback"].split()]
    notebooks = list((course / "autograder" / "autograded").glob("*/*/*.ipynb"))
    assert len(notebooks) >= len(CATALOGUE) - 5  # all but the unreadable and missing ones
    sizes = {path: path.stat().st_size for path in pages + notebooks}
    assert max(sizes.values()) < 5_000_000, max(sizes.items(), key=lambda item: item[1])


def test_the_report_lists_the_hardest_tests(graded):
    course, *_ = graded
    report = (course / "autograder" / "report.md").read_text()
    assert "| test | failed | of graded |" in report
    lines = [line for line in report.splitlines() if line.startswith("| test_")]
    failed = [int(line.split("|")[2]) for line in lines[:3]]
    assert failed == sorted(failed, reverse=True), lines
    lms = (course / "autograder" / "grades_lms.csv").read_text().splitlines()
    assert lms[0].startswith("student_id,")
    assert any(line.startswith("honest-complete,") for line in lms)


def test_the_feedback_pages_exist(graded):
    course, _, rows, *_ = graded
    for (student, _section), row in rows.items():
        if student in CATALOGUE:
            for page in row["feedback"].split():
                assert (course / page).is_file(), (student, page)
            nb = course / "autograder" / "autograded" / student / cases.SECTION
            for path in nb.glob("*.ipynb"):
                nbformat.read(path, as_version=4)
