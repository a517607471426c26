"""Which submission counts: one rule for the grading service and the instructor's collect.

A submission's time is the exchange's own: the ``timestamp.txt`` that ``nbgrader submit``
writes into the submission's inbound folder (the time in the folder's name when there is
none), as the grading service recorded it in its ledger when it arrived. Never a file's
modification time, which the student controls. For each student and section:

- the newest submission on time counts (the deadline in ``autograder/class.toml``, the
  student's extension and the late policy's grace included);
- when none is on time, the newest late one counts, and ``make grade`` takes the late
  policy's penalty off its score (without ``[late]`` it is flagged, not penalised).

So a late submission never replaces one handed in on time: the grading service does not grade
it (the student is told which one counts), and the instructor's collect
(``python -m coursehub.instructor collect``, nbgrader's collect with :class:`CountedCollect`)
copies the counted one into ``autograder/submitted/``, with its ``timestamp.txt``, which
``make grade`` reads as the submission's time.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.utils import parse_utc


@dataclass(frozen=True)
class Submission:
    name: str  # the inbound folder's name: <student>+<section>+<timestamp>+<random>
    student: str
    section: str
    submitted_at: dt.datetime  # aware, UTC


def parse_name(name: str) -> tuple[str, str, str] | None:
    """(student, section, timestamp) of an inbound folder's name, None if it is not one."""
    parts = name.split("+")
    if len(parts) < 3:
        return None
    return parts[0], parts[1], parts[2]


def nbgrader_time(text: str) -> dt.datetime:
    """nbgrader's timestamp (``2026-12-05 07:00:00.123456 UTC``) as an aware UTC time."""
    when = parse_utc(text.strip())
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def exchange_time(folder: Path) -> dt.datetime:
    """The exchange's time of a submission: its timestamp.txt, else its folder's name."""
    stamp = folder / "timestamp.txt"
    if stamp.is_file():
        text = stamp.read_text(encoding="utf-8", errors="replace").strip()
        if text:
            try:
                return nbgrader_time(text)
            except (ValueError, OverflowError):
                pass
    parsed = parse_name(folder.name)
    if parsed is None:
        raise ValueError(f"{folder} is not a submission of nbgrader's exchange")
    return nbgrader_time(parsed[2])


def nbgrader_stamp(folder: Path):
    """The submission's time as nbgrader compares it with a collected one's timestamp.txt."""
    stamp = folder / "timestamp.txt"
    text = stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else ""
    return parse_utc(text or parse_name(folder.name)[2])


def due(rules, student: str, section: str) -> dt.datetime | None:
    """The last moment that is on time for this student and section (grace included)."""
    deadline, _ = rules.deadline(student, section)
    if deadline is None:
        return None
    return deadline + (rules.late.grace if rules.late else dt.timedelta(0))


def is_late(rules, submission: Submission) -> bool:
    last = due(rules, submission.student, submission.section)
    return last is not None and submission.submitted_at > last


def counted(submissions: Iterable[Submission], rules) -> Submission | None:
    """The submission that counts among one student's submissions of one section."""
    subs = sorted(submissions, key=lambda s: (s.submitted_at, s.name))
    on_time = [s for s in subs if not is_late(rules, s)]
    return (on_time or subs or [None])[-1]


def ledger_times(ledger: Path) -> dict[str, dt.datetime]:
    """The times the grading service recorded on arrival, by inbound folder name."""
    times = {}
    if ledger.is_file():
        for line in ledger.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                times[entry["name"]] = dt.datetime.fromisoformat(entry["submitted_at"])
    return times


def inbound(folder: Path, section: str, recorded: dict[str, dt.datetime]) -> list[Submission]:
    """The submissions of a section in the exchange's inbound folder, with their times."""
    found = []
    for path in sorted(folder.glob(f"*+{glob.escape(section)}+*")):
        parsed = parse_name(path.name)
        if parsed is None or parsed[1] != section or not path.is_dir():
            continue
        when = recorded.get(path.name) or exchange_time(path)
        found.append(Submission(path.name, parsed[0], section, when))
    return found


class CountedCollect(ExchangeCollect):
    """nbgrader's collect, with the submission that counts instead of the newest.

    ``nbgrader collect --update`` takes each student's newest submission; this takes the one
    :func:`counted` names and replaces what ``autograder/submitted/`` holds whenever that is
    another submission (told apart by their timestamp.txt). The class settings are the
    course's (``autograder/class.toml``); the times are the grading service's ledger's
    (``COURSEHUB_LEDGER``), else each submission's timestamp.txt.
    """

    def init_src(self):
        super().init_src()  # the inbound folder, its permissions, nbgrader's own records
        from autograder import class_settings

        rules = class_settings.load()
        recorded = ledger_times(Path(os.environ.get("COURSEHUB_LEDGER", "/nonexistent")))
        student = self.coursedir.student_id
        student = None if student in ("", "*") else student  # nbgrader's "everyone": *
        by_student: dict[str, list[Submission]] = {}
        for sub in inbound(Path(self.inbound_path), self.coursedir.assignment_id, recorded):
            if student is None or sub.student == student:
                by_student.setdefault(sub.student, []).append(sub)
        self.src_records = []
        for subs in by_student.values():
            chosen = counted(subs, rules)
            stamp = nbgrader_stamp(Path(self.inbound_path) / chosen.name)
            self.src_records.append(
                {"username": chosen.student, "filename": chosen.name, "timestamp": stamp}
            )
        # copy whenever what was collected is not the counted one (older or newer)
        self.before_duedate = True
