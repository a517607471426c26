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

Without ``[late]`` a late submission is flagged, never penalised. A submission's time is the
one :mod:`autograder.collect` recorded from the LMS download (``submitted/.collected.json``),
else the newest modification time of the notebooks in its folder (the report says which).
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


class SettingsError(ValueError):
    """class.toml cannot be used; the message says what to change."""


@dataclass(frozen=True)
class LatePolicy:
    grace: dt.timedelta = dt.timedelta(0)
    penalty_per_day: float = 0.0
    max_days: float = math.inf


@dataclass(frozen=True)
class Lateness:
    """How late one submission came, and what it costs (a share of the section's points)."""

    submitted_at: dt.datetime
    source: str  # where the time comes from: "canvas download", "file time", ...
    due: dt.datetime | None = None
    extended: bool = False
    late_by: dt.timedelta = dt.timedelta(0)
    penalty: float = 0.0  # share of the maximum score taken off (1.0: all of it)

    @property
    def late(self) -> bool:
        return self.late_by > dt.timedelta(0)

    def words(self) -> str:
        """The reason's words: empty when on time."""
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

    def deadline(self, student: str, section: str) -> tuple[dt.datetime | None, bool]:
        """(the deadline of this student and section or None, whether it is an extension)."""
        if (student, section) in self.extensions:
            return self.extensions[(student, section)], True
        return self.due.get(section), False

    def lateness(self, student: str, section: str) -> Lateness | None:
        """When the submission came and what being late costs; None if nothing was handed
        in."""
        when = submission_time(student, section, self.timezone)
        if when is None:
            return None
        submitted_at, source = when
        due, extended = self.deadline(student, section)
        if due is None:
            return Lateness(submitted_at, source)
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


def load(path: Path = CLASS_TOML) -> ClassSettings:
    """The class's settings (all defaults when there is no class.toml)."""
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
    return ClassSettings(tz, due, extensions, late, names)


def collected_times() -> dict[str, dict]:
    """What autograder.collect recorded: "student/section" -> {submitted_at, source, ...}."""
    if not COLLECTED.is_file():
        return {}
    return json.loads(COLLECTED.read_text(encoding="utf-8"))


def submission_time(
    student: str, section: str, tz: dt.tzinfo = dt.UTC
) -> tuple[dt.datetime, str] | None:
    """When a submission was handed in, and where that time comes from."""
    record = collected_times().get(f"{student}/{section}")
    if record and record.get("submitted_at"):
        return dt.datetime.fromisoformat(record["submitted_at"]), record.get("source", "LMS")
    folder = course.SUBMITTED / student / section
    notebooks = list(folder.glob("*.ipynb")) if folder.is_dir() else []
    if not notebooks:
        return None
    newest = max(p.stat().st_mtime for p in notebooks)
    return dt.datetime.fromtimestamp(newest, tz), "file time"
