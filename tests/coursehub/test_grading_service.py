"""Grading on submit: which submissions the hub's grading service grades, and when.

The end-to-end runs (real accounts, the exchange, the class run) are e2e/test_coursehub.py;
these check the service's decisions on an inbound folder laid out as nbgrader's exchange
lays it: the rate limit, the newest submission superseding older queued ones, and a late
submission kept but not graded, against a real ``class.toml``.
"""

from __future__ import annotations

import time
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
    grader.tell = lambda entry, text, pages=(), name="result.md": told.append((entry, name))
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
    assert entries[older].status == "superseded" and "newer submission" in entries[older].note
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


def test_a_late_submission_is_kept_and_not_graded_and_the_student_is_told(service):
    on_time = submit("ann", "2026-12-05 12:09:00.000000")  # within the 10 minutes' grace
    late = submit("ben", "2026-12-05 12:11:00.000000")
    stranger = submit("eve", "2026-12-05 09:00:00.000000")
    service.scan()
    entries = service.ledger.entries
    assert entries[on_time].status == "queued"
    assert entries[late].status == "late" and "before the deadline" in entries[late].note
    assert entries[stranger].status == "ignored"
    assert [e.name for e in service.ready()] == [on_time]
    assert [(e.name, name) for e, name in service.told] == [(late, "late.md")]
    assert (settings.EXCHANGE / settings.COURSE_ID / "inbound" / late).is_dir()  # nothing lost
