"""Grading on submit: which submissions the hub's grading service grades, and when.

The end-to-end runs (real accounts, the exchange, the class run) are e2e/test_coursehub.py;
these check the service's decisions on an inbound folder laid out as nbgrader's exchange
lays it: the rate limit (a submission waiting, its student told until when), the newest
submission superseding older queued ones, a late submission kept but not graded when one on
time counts, graded when none does, against a real ``class.toml``; and what the student reads.
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder import class_settings
from coursehub import grading_service, settings

SECTION = "01_data_parallel"


@pytest.fixture()
def service(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "EXCHANGE", tmp_path / "exchange")
    monkeypatch.setattr(settings, "LEDGER", tmp_path / "ledger.jsonl")
    monkeypatch.setattr(settings, "STUDENTS", ["ann", "ben"])
    monkeypatch.setattr(settings, "MIN_MINUTES", 10.0)
    toml = tmp_path / "class.toml"
    toml.write_text(f"[due]\n{SECTION} = 2026-12-05T12:00:00\n\n[late]\ngrace_minutes = 10\n")
    grader = grading_service.Grader()
    grader.class_settings = SimpleNamespace(load=lambda: class_settings.load(toml))
    told = []
    grader.tell = lambda entry, text, pages=(): told.append((entry.name, text))
    grader.told = told
    return grader


def submit(student: str, stamp: str, section: str = SECTION) -> str:
    """One submission folder, named and time-stamped as nbgrader's exchange does."""
    name = f"{student}+{section}+{stamp} UTC+abcdef"
    folder = settings.EXCHANGE / settings.COURSE_ID / "inbound" / name
    folder.mkdir(parents=True)
    (folder / "timestamp.txt").write_text(f"{stamp} UTC")
    return name


def test_the_newest_submission_is_graded_and_older_ones_are_kept_superseded(service):
    older = submit("ann", "2026-12-05 10:00:00.000000")
    newer = submit("ann", "2026-12-05 11:00:00.000000")
    other = submit("ben", "2026-12-05 10:30:00.000000")
    service.scan()
    chosen = {e.name for e in service.ready()}
    assert chosen == {newer, other}
    entries = service.ledger.entries
    assert entries[older].status == "superseded" and newer in entries[older].note
    assert [name for name, _ in service.told] == [older]  # its student is told why
    # the ledger on disk says the same: a restarted service resumes from it
    again = grading_service.Ledger(settings.LEDGER).entries
    assert again[older].status == "superseded" and again[newer].status == "queued"


def test_the_rate_limit_holds_a_students_next_grading_back(service):
    first = submit("ann", "2026-12-05 10:00:00.000000")
    service.scan()
    assert [e.name for e in service.ready()] == [first]
    service.ledger.entries[first].status = "graded"
    service.last_graded[("ann", SECTION)] = time.time()  # graded just now
    second = submit("ann", "2026-12-05 10:05:00.000000")
    service.scan()
    assert service.ready() == []  # within the 10 minutes: it waits, queued
    assert service.ledger.entries[second].status == "queued"
    service.last_graded[("ann", SECTION)] = time.time() - 11 * 60
    assert [e.name for e in service.ready()] == [second]


def test_a_late_submission_is_kept_and_not_graded_when_one_on_time_counts(service):
    on_time = submit("ann", "2026-12-05 12:09:00.000000")  # within the 10 minutes' grace
    late = submit("ann", "2026-12-05 12:11:00.000000")
    stranger = submit("eve", "2026-12-05 09:00:00.000000")
    service.scan()
    entries = service.ledger.entries
    assert entries[on_time].status == "queued" and not entries[on_time].late
    assert entries[late].status == "late" and on_time in entries[late].note
    assert entries[stranger].status == "ignored"
    assert [e.name for e in service.ready()] == [on_time]  # the late one never supersedes it
    assert [name for name, _ in service.told] == [late]
    text = service.told[0][1]
    assert text.startswith("# 01_data_parallel: late, not graded\n"), text
    # to the second, in the course's time zone (UTC here), and which submission counts
    assert "2026-12-05 12:11:00 UTC" in text and "2026-12-05 12:10:00 UTC" in text, text
    assert "2026-12-05 12:09:00 UTC, on time, is the one that counts" in text, text
    assert "feedback/2026-12-05 12:09:00.000000 UTC/" in text, text
    assert (settings.EXCHANGE / settings.COURSE_ID / "inbound" / late).is_dir()  # nothing lost


def test_a_late_submission_counts_when_nothing_was_on_time(service):
    late = submit("ben", "2026-12-05 12:11:00.000000")
    later = submit("ben", "2026-12-05 13:00:00.000000")
    service.scan()
    entries = service.ledger.entries
    assert entries[late].status == entries[later].status == "queued"
    assert entries[late].late and entries[later].late
    assert [e.name for e in service.ready()] == [later]  # the newest late one
    assert entries[late].status == "superseded"


def test_the_time_is_the_exchanges_never_the_files(service):
    """timestamp.txt decides, whatever the notebook's modification time says."""
    name = submit("ann", "2026-12-05 12:30:00.000000")  # late
    nb = settings.EXCHANGE / settings.COURSE_ID / "inbound" / name / "x.ipynb"
    nb.write_text("{}")
    early = dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
    os.utime(nb, (early, early))  # a student's touch -d cannot make it on time
    service.scan()
    entry = service.ledger.entries[name]
    assert entry.late and entry.submitted_at == "2026-12-05T12:30:00+00:00"


def test_a_submission_held_back_by_the_rate_limit_is_marked_waiting(service):
    first = submit("ann", "2026-12-05 10:00:00.000000")
    service.scan()
    service.ready()
    entry = service.ledger.entries[first]
    entry.status = "graded"
    service.last_graded[("ann", SECTION)] = time.time()
    second = submit("ann", "2026-12-05 10:05:00.000000")
    service.scan()
    assert service.ready() == []
    waiting = service.ledger.entries[second]
    assert waiting.status == "queued" and waiting.waiting_until > time.time() + 9 * 60
    name, text = service.told[-1]
    assert name == second and text.startswith("# 01_data_parallel: waiting, graded at "), text
    service.ready()  # told once, not at every scan
    assert [n for n, _ in service.told].count(second) == 1
    again = grading_service.Ledger(settings.LEDGER).entries[second]
    assert again.waiting_until == waiting.waiting_until


def test_result_md_is_in_the_students_words(service):
    name = submit("ann", "2026-12-05 11:59:58.250000")
    service.scan()
    entry = service.ledger.entries[name]
    entry.graded_at = dt.datetime(2026, 12, 5, 12, 0, 31, 900000, tzinfo=dt.UTC).timestamp()
    row = {
        "score": "11",
        "max_score": "22",
        "status": "graded",
        "reason": (
            "failed test_a (hidden), test_b; "
            f"{settings.ROOT}/autograder/submitted/ann/{SECTION}/x.ipynb cell 3 raised "
            "ValueError; autograder/feedback/ann/01_data_parallel/x.html written"
        ),
        "autograded": "11",
    }
    text = service.graded_words(entry, row, service.class_settings.load())
    lines = text.splitlines()
    assert lines[0] == "# 01_data_parallel: graded, 11.0 of 22.0 points", text
    assert "Your submission of 2026-12-05 11:59:58 UTC, graded 2026-12-05 12:00:31 UTC" in text
    assert "- failed test_a (hidden), test_b" in lines, text
    assert "- 01_data_parallel/x.ipynb cell 3 raised ValueError" in lines, text
    assert "autograder" not in text and str(settings.ROOT) not in text, text
    assert ".250000" not in text and "+00:00" not in text, text


def test_times_are_in_the_courses_time_zone(service, tmp_path):
    toml = tmp_path / "berlin.toml"
    toml.write_text(f'timezone = "Europe/Berlin"\n[due]\n{SECTION} = 2026-12-05T13:00:00\n')
    rules = class_settings.load(toml)
    name = submit("ann", "2026-12-05 12:30:00.000000")  # 13:30 in Berlin: late
    service.class_settings = SimpleNamespace(load=lambda: rules)
    service.scan()
    entry = service.ledger.entries[name]
    assert entry.late
    assert grading_service.when(entry.arrived, rules) == "2026-12-05 13:30:00 Europe/Berlin"


@pytest.mark.skipif(os.getuid() != 0, reason="writes as another account: root")
def test_feedback_is_written_with_the_students_rights_only():
    """The service runs as root and writes into a student's home: as the student, so that a
    link the student planted (say feedback -> a root-only folder) leads nowhere."""
    nobody = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="coursehub-writeas-", dir="/tmp"))
    try:
        os.chmod(top, 0o711)
        home, secret = top / "home", top / "root-only"
        home.mkdir()
        secret.mkdir(mode=0o700)
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        planted = home / "sec" / "feedback"
        planted.parent.mkdir()
        os.chown(planted.parent, nobody.pw_uid, nobody.pw_gid)
        planted.symlink_to(secret)
        files = {"result.md": b"# sec: graded, 1.0 of 2.0 points\n"}
        assert not grading_service.write_as(nobody, planted / "stamp", files)
        assert list(secret.iterdir()) == []  # root's folder untouched
        good = home / "sec2" / "feedback" / "stamp"
        assert grading_service.write_as(nobody, good, files)
        written = good / "result.md"
        assert written.read_bytes() == files["result.md"]
        assert (written.stat().st_uid, written.stat().st_mode & 0o777) == (nobody.pw_uid, 0o600)
        assert good.stat().st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(top)
