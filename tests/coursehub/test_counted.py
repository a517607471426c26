"""One rule for which submission counts (coursehub/counted.py), on both of the course server's
paths: the grading service's decision, and the instructor's collect (nbgrader's collect with
``CountedCollect``) followed by make grade's reading of the collected submission's time.

The end-to-end run with the hub, real accounts and the class run is
e2e/test_coursehub.py::test_on_time_then_late_counts_the_same_on_both_paths; here nbgrader's
real collect runs on a scratch course and an inbound folder laid out as the exchange lays it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import nbformat
import pytest

from autograder import class_settings, fixtures
from coursehub import counted, grading_service, instructor, settings

SECTION = "01_data_parallel"
ON_TIME, LATE, LATER = (
    "2026-12-05 11:59:00.000000",
    "2026-12-05 13:00:00.000000",
    "2026-12-06 09:00:00.000000",
)
CLASS_TOML = (
    f"[due]\n{SECTION} = 2026-12-05T12:00:00\n\n[late]\ngrace_minutes = 5\npenalty_per_day = 0.25\n"
)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = fixtures.copy_course(tmp_path_factory.mktemp("counted") / "course")
    (root / "autograder" / "class.toml").write_text(CLASS_TOML)
    return root


@pytest.fixture()
def hub(course, tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "ROOT", course)
    monkeypatch.setattr(settings, "EXCHANGE", tmp_path / "exchange")
    monkeypatch.setattr(settings, "LEDGER", tmp_path / "ledger.jsonl")
    monkeypatch.setattr(settings, "STUDENTS", ["ann", "ben"])
    monkeypatch.setattr(settings, "MIN_MINUTES", 0.0)
    shutil.rmtree(course / "autograder" / "submitted", ignore_errors=True)
    grader = grading_service.Grader()
    rules = class_settings.load(course / "autograder" / "class.toml")
    grader.class_settings = SimpleNamespace(load=lambda: rules)
    grader.tell = lambda entry, text, pages=(): None
    return SimpleNamespace(course=course, grader=grader, rules=rules)


def submit(student: str, stamp: str, marker: str) -> str:
    """A submission as nbgrader submit leaves it; ``marker`` tells the notebooks apart."""
    name = f"{student}+{SECTION}+{stamp} UTC+{marker}"
    folder = settings.EXCHANGE / settings.COURSE_ID / "inbound" / name
    folder.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.metadata["marker"] = marker
    nbformat.write(nb, folder / "data_parallel.ipynb")
    (folder / "timestamp.txt").write_text(f"{stamp} UTC")
    return name


def collect() -> None:
    done = instructor.main(["collect", SECTION])
    assert done == 0


def collected(course, student: str) -> tuple[str, str]:
    folder = course / "autograder" / "submitted" / student / SECTION
    nb = nbformat.read(folder / "data_parallel.ipynb", 4)
    return nb.metadata["marker"], (folder / "timestamp.txt").read_text().strip()


def make_grade_lateness(course, student: str) -> dict:
    """What make grade reads: the collected submission's time and lateness (the course's own
    class_settings, run in the scratch course)."""
    code = (
        "import json; from autograder import class_settings as c;"
        f"x = c.load().lateness({student!r}, {SECTION!r});"
        "print(json.dumps({'at': x.submitted_at.isoformat(), 'source': x.source,"
        " 'late': x.late, 'penalty': x.penalty}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=course, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=str(course)), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_rule_prefers_the_newest_on_time_else_the_newest_late(hub):
    rules = hub.rules

    def sub(name, when):
        return counted.Submission(name, "ann", SECTION, counted.nbgrader_time(when))

    on_time, grace = sub("a", ON_TIME), sub("b", "2026-12-05 12:04:59")
    late, later = sub("c", LATE), sub("d", LATER)
    assert counted.counted([on_time, late, later], rules) == on_time
    assert counted.counted([late, grace, on_time], rules) == grace  # within the grace
    assert counted.counted([later, late], rules) == later
    assert counted.counted([], rules) is None


def test_the_service_and_the_instructors_collect_pick_the_same_submission(hub):
    ann_on_time = submit("ann", ON_TIME, "ann-on-time")
    ann_late = submit("ann", LATE, "ann-late")
    ben_late = submit("ben", LATE, "ben-late")
    ben_later = submit("ben", LATER, "ben-later")
    hub.grader.scan()
    chosen = {e.name for e in hub.grader.ready()}
    assert chosen == {ann_on_time, ben_later}
    entries = hub.grader.ledger.entries
    assert entries[ann_late].status == "late" and entries[ben_late].status == "superseded"

    collect()  # nbgrader collect --update with the course's rule
    assert collected(hub.course, "ann") == ("ann-on-time", f"{ON_TIME} UTC")
    assert collected(hub.course, "ben") == ("ben-later", f"{LATER} UTC")
    # make grade reads the exchange's time beside the collected notebook, never the file's
    assert make_grade_lateness(hub.course, "ann") == {
        "at": "2026-12-05T11:59:00+00:00",
        "source": "nbgrader exchange timestamp.txt",
        "late": False,
        "penalty": 0.0,
    }
    ben = make_grade_lateness(hub.course, "ben")
    assert ben["late"] and ben["penalty"] == 0.25 and ben["at"] == "2026-12-06T09:00:00+00:00"
    assert entries[ben_later].late  # the service graded it as late too


def test_collect_puts_back_the_on_time_one_that_a_plain_collect_replaced(hub):
    ann_on_time = submit("ann", ON_TIME, "ann-on-time")
    ann_late = submit("ann", LATE, "ann-late")
    inbound = settings.EXCHANGE / settings.COURSE_ID / "inbound"
    # what nbgrader's own `collect --update` did before: the newest, a late one
    dest = hub.course / "autograder" / "submitted" / "ann" / SECTION
    shutil.copytree(inbound / ann_late, dest)
    collect()
    assert collected(hub.course, "ann") == ("ann-on-time", f"{ON_TIME} UTC")
    assert (inbound / ann_late).is_dir() and (inbound / ann_on_time).is_dir()  # nothing lost
    collect()  # again: nothing changes
    assert collected(hub.course, "ann") == ("ann-on-time", f"{ON_TIME} UTC")


def test_collect_takes_the_ledgers_time_over_a_timestamp_edited_later(hub):
    """The student owns their inbound folder: a timestamp.txt rewritten after the service
    recorded the submission does not move it before the deadline."""
    ann_on_time = submit("ann", ON_TIME, "ann-on-time")
    ann_late = submit("ann", LATE, "ann-late")
    hub.grader.scan()
    (settings.EXCHANGE / settings.COURSE_ID / "inbound" / ann_late / "timestamp.txt").write_text(
        "2026-12-05 11:59:30.000000 UTC"
    )
    collect()
    assert collected(hub.course, "ann")[0] == "ann-on-time"
    assert hub.grader.ledger.entries[ann_on_time].status == "queued"
