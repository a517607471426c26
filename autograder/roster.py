"""The class roster: who is enrolled, and under which ids the LMS knows them.

``autograder/roster.csv`` is a file the instructor keeps (export the class list from the LMS
and rename the columns). One row per student; the header names the columns, in any order and
any case; only ``student_id`` is required:

=============  ==========================================================================
``student_id`` the course's id of the student: their folder under ``submitted/``
``name``       the full name as the LMS shows it ("Ivan Petrov"); Moodle's download is
               matched by it when ``lms_id`` is not given
``lms_id``     Canvas's user id (the number in its download's file names), or Moodle's
               participant id (the number after the name in its download)
``login``      Canvas's SIS Login ID, or Moodle's username
``email``      the e-mail address (Moodle's grade import can match students by it)
``sis_id``     Canvas's SIS User ID, or Moodle's ID number
=============  ==========================================================================

:mod:`autograder.collect` joins an LMS download to it, :mod:`autograder.filing` warns about
students on it who handed in nothing (and submissions of students not on it), and
:mod:`autograder.exports` writes the LMS gradebooks through it.
"""

from __future__ import annotations

import csv
import re
import unicodedata
from dataclasses import dataclass, fields
from pathlib import Path

from autograder import course

ROSTER_CSV = course.AUTOGRADER / "roster.csv"
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$")


class RosterError(ValueError):
    """The roster cannot be used; the message says what to change."""


@dataclass(frozen=True)
class Student:
    student_id: str
    name: str = ""
    lms_id: str = ""
    login: str = ""
    email: str = ""
    sis_id: str = ""


COLUMNS = tuple(f.name for f in fields(Student))


def name_key(name: str) -> str:
    """A name compared without case, accents, punctuation or spacing ("Ivan  Petrov" and
    "ivan petrov" match; Canvas's "petrovivan" is the sortable name in the same form)."""
    plain = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]", "", plain.lower())


@dataclass(frozen=True)
class Roster:
    students: tuple[Student, ...]
    path: Path = ROSTER_CSV

    def ids(self) -> list[str]:
        return [s.student_id for s in self.students]

    def get(self, student_id: str) -> Student | None:
        return next((s for s in self.students if s.student_id == student_id), None)

    def by_lms_id(self, lms_id: str) -> Student | None:
        return next((s for s in self.students if s.lms_id and s.lms_id == lms_id), None)

    def by_name(self, name: str) -> list[Student]:
        """Every student whose full name matches (compared by :func:`name_key`), or whose
        name reversed does (Canvas writes the sortable name, family name first)."""
        key = name_key(name)
        found = []
        for s in self.students:
            words = s.name.split()
            reversed_name = " ".join(words[-1:] + words[:-1])
            if key and key in (name_key(s.name), name_key(reversed_name)):
                found.append(s)
        return found


def load(path: Path = ROSTER_CSV) -> Roster | None:
    """The roster at ``path``, or None when there is none (the course then works without one:
    no join to an LMS, no "nothing submitted" warnings)."""
    if not path.is_file():
        return None
    with path.open(newline="", encoding="utf-8-sig") as f:  # Excel writes a byte-order mark
        reader = csv.DictReader(f)
        header = {(h or "").strip().lower(): h for h in reader.fieldnames or []}
        if "student_id" not in header:
            raise RosterError(
                f"{path}: no student_id column (found: {', '.join(header) or 'nothing'}); the "
                f"header names the columns {', '.join(COLUMNS)} (only student_id is required)"
            )
        students, seen = [], set()
        for line, row in enumerate(reader, start=2):
            values = {c: (row.get(header[c]) or "").strip() for c in COLUMNS if c in header}
            sid = values["student_id"]
            if not sid:
                continue
            if not STUDENT_ID.match(sid) or sid in course.sections():
                raise RosterError(
                    f"{path}, line {line}: student_id {sid!r} cannot name a folder of "
                    "submitted/ (letters, digits and . _ @ + - only, not a section's name)"
                )
            if sid in seen:
                raise RosterError(f"{path}, line {line}: student_id {sid!r} appears twice")
            seen.add(sid)
            students.append(Student(**values))
    return Roster(tuple(students), path)
