"""Deadlines, extensions, the late policy and the LMS's names: ``autograder/class.toml``.

The one file an instructor keeps for a class (TOML; every part optional)::

    timezone = "Europe/Berlin"        # for times written without an offset (default UTC)

    [due]                             # per section
    02_memory_sharding = 2026-10-14T23:59:00

    [extensions]                      # per student and section: a later deadline
    alice = { 02_memory_sharding = 2026-10-16T23:59:00 }

    [late]
    grace_minutes = 10                # a submission this late is on time
    penalty_per_day = 0.10            # share of the section's points lost per started day
    max_days = 7                      # later than this: 0 points (no value: no limit)

    [lms.canvas]                      # column names of the Canvas gradebook import
    02_memory_sharding = "Memory and sharding (4512)"
    [lms.moodle]                      # grade items of the Moodle import
    02_memory_sharding = "Memory and sharding"

    [submitted]                       # a time the instructor vouches for (a file by e-mail)
    erin = { 02_memory_sharding = 2026-10-14T20:00:00 }

Without ``[late]`` a late submission is flagged, never penalised. A submission's time comes
from where it was handed in, never from a file's modification time (a copy made by hand, an
unzipped download: the time of the copy):

1. ``timestamp.txt`` beside the notebooks: nbgrader's exchange writes it at ``nbgrader
   submit`` (the course server's path, and ``nbgrader collect``);
2. what :mod:`autograder.collect` recorded from the LMS (``submitted/.collected.json``): the
   LMS's own time (Canvas's submissions API or CSV, Moodle's grading worksheet), else only
   Canvas's ``LATE`` mark;
3. ``[submitted]`` in class.toml;
4. else unknown: flagged in the report, never penalised.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from autograder import course

CLASS_TOML = course.AUTOGRADER / "class.toml"
COLLECTED = course.SUBMITTED / ".collected.json"  # written by autograder.collect
EXCHANGE_TIMESTAMP = "timestamp.txt"  # nbgrader's exchange, beside a submitted notebook


class SettingsError(ValueError):
    """class.toml cannot be used; the message says what to change."""


@dataclass(frozen=True)
class LatePolicy:
    grace: dt.timedelta = dt.timedelta(0)
    penalty_per_day: float = 0.0
    max_days: float = math.inf


@dataclass(frozen=True)
class Lateness:
    """How late one submission came, and what it costs (a share of the section's points).

    ``submitted_at`` is None when no record gives the time: then ``lms_late`` is Canvas's
    ``LATE`` mark (True/False) or None (nothing known). An unknown time is never penalised."""

    submitted_at: dt.datetime | None
    source: str  # where the time comes from: "nbgrader exchange", "Canvas submissions API"...
    due: dt.datetime | None = None
    extended: bool = False
    late_by: dt.timedelta = dt.timedelta(0)
    penalty: float = 0.0  # share of the maximum score taken off (1.0: all of it)
    lms_late: bool | None = None

    @property
    def late(self) -> bool:
        return self.late_by > dt.timedelta(0) or (self.submitted_at is None and bool(self.lms_late))

    @property
    def unknown(self) -> bool:
        """A deadline applies, and nothing says whether the submission met it."""
        return self.due is not None and self.submitted_at is None and self.lms_late is None

    def column(self) -> str:
        """grades.csv's ``late``: how late, "" when on time."""
        if self.unknown:
            return "time unknown"
        if self.submitted_at is None and self.lms_late:
            return "marked late by the LMS"
        return describe(self.late_by) if self.late else ""

    def words(self) -> str:
        """The reason's words: empty when on time."""
        if self.unknown:
            return (
                f"handed in at an unknown time ({self.source}): no late penalty taken; the "
                "instructor can give the time (collect --times, or [submitted] in class.toml)"
            )
        if self.submitted_at is None and self.lms_late:
            return (
                f"marked late by the LMS ({self.source}), at an unknown time: no late penalty "
                "taken without the LMS's submission time (collect --times)"
            )
        if not self.late:
            return ""
        deadline = "extended deadline" if self.extended else "deadline"
        cost = f": -{self.penalty:.0%} of the points" if self.penalty else " (no penalty set)"
        return (
            f"late by {describe(self.late_by)} ({deadline} {self.due:%Y-%m-%d %H:%M %z}, "
            f"handed in {self.submitted_at:%Y-%m-%d %H:%M %z}, {self.source}){cost}"
        )


def describe(delta: dt.timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [f"{days} d"] * bool(days) + [f"{hours} h"] * bool(hours) + [f"{minutes} min"]
    return " ".join(parts[:2])


@dataclass(frozen=True)
class ClassSettings:
    timezone: dt.tzinfo = dt.UTC
    due: dict[str, dt.datetime] = field(default_factory=dict)
    extensions: dict[tuple[str, str], dt.datetime] = field(default_factory=dict)
    late: LatePolicy | None = None
    lms_names: dict[str, dict[str, str]] = field(default_factory=dict)  # lms -> section -> name
    submitted: dict[tuple[str, str], dt.datetime] = field(default_factory=dict)  # by hand

    def deadline(self, student: str, section: str) -> tuple[dt.datetime | None, bool]:
        """(the deadline of this student and section or None, whether it is an extension)."""
        if (student, section) in self.extensions:
            return self.extensions[(student, section)], True
        return self.due.get(section), False

    def lateness(self, student: str, section: str) -> Lateness | None:
        """When the submission came and what being late costs; None if nothing was handed
        in."""
        when = submission_time(student, section, self.timezone, self.submitted)
        if when is None:
            return None
        submitted_at, source, lms_late = when
        due, extended = self.deadline(student, section)
        if submitted_at is None or due is None:
            return Lateness(submitted_at, source, due, extended, lms_late=lms_late)
        policy = self.late or LatePolicy()
        late_by = submitted_at - due
        if late_by <= policy.grace:
            return Lateness(submitted_at, source, due, extended)
        days = math.ceil(late_by / dt.timedelta(days=1))
        penalty = 1.0 if days > policy.max_days else min(1.0, days * policy.penalty_per_day)
        return Lateness(submitted_at, source, due, extended, late_by, penalty)

    def lms_name(self, lms: str, section: str) -> str:
        return self.lms_names.get(lms, {}).get(section, section)


def _when(value, tz: dt.tzinfo, where: str) -> dt.datetime:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time(23, 59, 59))  # a date: the end of that day
    if not isinstance(value, dt.datetime):
        raise SettingsError(
            f"class.toml, {where}: {value!r} is not a date-time; write it unquoted, as "
            "2026-10-14T23:59:00 (the class's timezone) or 2026-10-14T23:59:00+02:00"
        )
    return value if value.tzinfo else value.replace(tzinfo=tz)


def load(path: Path | None = None) -> ClassSettings:
    """The class's settings (all defaults when there is no class.toml)."""
    path = path or course.AUTOGRADER / CLASS_TOML.name
    if not path.is_file():
        return ClassSettings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML: {exc}") from None
    try:
        tz = ZoneInfo(data.get("timezone", "UTC"))
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(
            f"{path}: timezone {data.get('timezone')!r} is not an IANA name such as "
            "'Europe/Berlin' or 'America/New_York'"
        ) from None
    known = set(course.sections())
    due = {}
    for section, value in data.get("due", {}).items():
        if section not in known:
            raise SettingsError(f"{path}, [due]: no section {section!r} ({', '.join(known)})")
        due[section] = _when(value, tz, f"[due] {section}")
    extensions = {}
    for student, per_section in data.get("extensions", {}).items():
        if not isinstance(per_section, dict):
            raise SettingsError(
                f"{path}, [extensions] {student}: expected {{ section = date-time, ... }}"
            )
        for section, value in per_section.items():
            if section not in known:
                raise SettingsError(f"{path}, [extensions] {student}: no section {section!r}")
            extensions[(student, section)] = _when(value, tz, f"[extensions] {student}")
    late = None
    if "late" in data:
        rules = data["late"]
        unknown = set(rules) - {"grace_minutes", "penalty_per_day", "max_days"}
        if unknown:
            raise SettingsError(f"{path}, [late]: unknown {', '.join(sorted(unknown))}")
        penalty = float(rules.get("penalty_per_day", 0.0))
        if not 0.0 <= penalty <= 1.0:
            raise SettingsError(f"{path}, [late] penalty_per_day: a share, 0 to 1 (0.1 = 10 %)")
        late = LatePolicy(
            dt.timedelta(minutes=float(rules.get("grace_minutes", 0))),
            penalty,
            float(rules.get("max_days", math.inf)),
        )
    names = {lms: dict(table) for lms, table in data.get("lms", {}).items()}
    submitted = {}
    for student, per_section in data.get("submitted", {}).items():
        if not isinstance(per_section, dict):
            raise SettingsError(
                f"{path}, [submitted] {student}: expected {{ section = date-time, ... }}"
            )
        for section, value in per_section.items():
            if section not in known:
                raise SettingsError(f"{path}, [submitted] {student}: no section {section!r}")
            submitted[(student, section)] = _when(value, tz, f"[submitted] {student}")
    return ClassSettings(tz, due, extensions, late, names, submitted)


def collected_path() -> Path:
    """``submitted/.collected.json`` (autograder.collect writes it)."""
    return course.SUBMITTED / COLLECTED.name


def collected_times() -> dict[str, dict]:
    """What autograder.collect recorded: "student/section" -> {submitted_at, source, ...}."""
    path = collected_path()
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def exchange_time(folder: Path) -> dt.datetime | None:
    """nbgrader's ``timestamp.txt`` in a submission folder ("2026-10-14 21:59:00.123456 UTC",
    written by ``nbgrader submit``), as an aware time; None without one."""
    stamp = folder / EXCHANGE_TIMESTAMP
    if not stamp.is_file():
        return None
    from nbgrader.utils import parse_utc

    try:
        when = parse_utc(stamp.read_text(encoding="utf-8").strip())
    except Exception:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def submission_time(
    student: str,
    section: str,
    tz: dt.tzinfo = dt.UTC,
    by_hand: dict[tuple[str, str], dt.datetime] | None = None,
) -> tuple[dt.datetime | None, str, bool | None] | None:
    """(when, where that comes from, the LMS's late mark) of a submission; None if nothing was
    handed in. ``when`` is None when no record gives it (then it is never penalised): a
    file's modification time is never read, it is the time of the copy."""
    folder = course.SUBMITTED / student / section
    if not (folder.is_dir() and any(folder.glob("*.ipynb"))):
        return None
    stamped = exchange_time(folder)
    if stamped is not None:
        return stamped, "nbgrader exchange timestamp.txt", None
    record = collected_times().get(f"{student}/{section}")
    if record and record.get("submitted_at"):
        source = record.get("source") or f"{record.get('lms', 'LMS')} records"
        return dt.datetime.fromisoformat(record["submitted_at"]), source, None
    if by_hand and (student, section) in by_hand:
        return by_hand[(student, section)], "class.toml [submitted]", None
    if record:
        late = record.get("lms_late")
        source = f"{record.get('lms', 'LMS')} download {record.get('download', '')}".strip()
        if late is not None:
            source += ", LATE mark" if late else ", not marked LATE"
        return None, source, late
    return None, "copied in by hand, no record of when it was handed in", None
