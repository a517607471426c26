"""Gradebook files an LMS imports, joined to the roster; a section not handed in is blank.

* ``grades_lms.csv``: one row per student, one column per section, ``total`` and
  ``max_total`` (any LMS or a spreadsheet; needs no roster);
* ``grades_canvas.csv``: Canvas's gradebook import (Grades > Import): the columns ``Student,
  ID, SIS User ID, SIS Login ID, Section``, one column per assignment named as in Canvas
  ("Name (assignment id)", from ``[lms.canvas]`` in class.toml; a name Canvas does not
  know becomes a new assignment), and a second row ``Points Possible``. Canvas finds each
  student by ``ID`` (the roster's ``lms_id``), else by the SIS ids;
* ``grades_moodle.csv``: for Moodle's "Import grades from CSV": the identifier columns
  ``Email address, ID number, Username`` (map one of them to the user in the import's
  form) and one column per grade item (``[lms.moodle]`` in class.toml).

An empty cell is "no grade", which both LMSs leave as it is: a student who handed nothing in
is not given a 0 that a late policy or a resubmission would then have to undo. The two LMS
files need the roster: without one only ``grades_lms.csv`` is written.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from autograder import course, results
from autograder.class_settings import ClassSettings
from autograder.outcomes import MISSING
from autograder.roster import Roster

LMS_CSV = course.AUTOGRADER / "grades_lms.csv"
CANVAS_CSV = course.AUTOGRADER / "grades_canvas.csv"
MOODLE_CSV = course.AUTOGRADER / "grades_moodle.csv"
CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_HEADER = ["Full name", "Email address", "ID number", "Username"]


def _write(path: Path, lines: list[list[str]]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(lines)
    os.replace(tmp, path)


def _scores(rows: list[dict[str, str]]) -> dict[tuple[str, str], str]:
    """(student, section) -> the score, or "" where nothing was handed in."""
    return {
        (r["student_id"], r["section"]): (
            "" if results.category(r["status"]) == MISSING else r["score"]
        )
        for r in rows
    }


def _maxima(rows: list[dict[str, str]]) -> dict[str, str]:
    return {r["section"]: r["max_score"] for r in rows}


def write_plain(rows: list[dict[str, str]], path: Path = LMS_CSV) -> None:
    scores, maxima = _scores(rows), _maxima(rows)
    sections = sorted(maxima)
    students = sorted({r["student_id"] for r in rows})
    lines = [["student_id", *sections, "total", "max_total"]]
    max_total = sum(float(m) for m in maxima.values())
    for student in students:
        mine = [scores.get((student, s), "") for s in sections]
        total = sum(float(v) for v in mine if v)
        lines.append([student, *mine, f"{total:g}", f"{max_total:g}"])
    _write(path, lines)


def write_canvas(
    rows: list[dict[str, str]], roster: Roster, settings: ClassSettings, path: Path = CANVAS_CSV
) -> None:
    scores, maxima = _scores(rows), _maxima(rows)
    sections = sorted(maxima)
    lines = [
        CANVAS_HEADER + [settings.lms_name("canvas", s) for s in sections],
        ["Points Possible", "", "", "", ""] + [maxima[s] for s in sections],
    ]
    for s in roster.students:
        marks = [scores.get((s.student_id, section), "") for section in sections]
        lines.append([s.name or s.student_id, s.lms_id, s.sis_id, s.login, "", *marks])
    _write(path, lines)


def write_moodle(
    rows: list[dict[str, str]], roster: Roster, settings: ClassSettings, path: Path = MOODLE_CSV
) -> None:
    scores, maxima = _scores(rows), _maxima(rows)
    sections = sorted(maxima)
    lines = [MOODLE_HEADER + [settings.lms_name("moodle", s) for s in sections]]
    for s in roster.students:
        marks = [scores.get((s.student_id, section), "") for section in sections]
        lines.append([s.name or s.student_id, s.email, s.sis_id, s.login, *marks])
    _write(path, lines)


def write_all(
    rows: list[dict[str, str]], roster: Roster | None, settings: ClassSettings
) -> list[Path]:
    """Write the LMS files; the paths written."""
    write_plain(rows)
    if roster is None:
        for stale in (CANVAS_CSV, MOODLE_CSV):
            stale.unlink(missing_ok=True)
        return [LMS_CSV]
    write_canvas(rows, roster, settings)
    write_moodle(rows, roster, settings)
    return [LMS_CSV, CANVAS_CSV, MOODLE_CSV]
