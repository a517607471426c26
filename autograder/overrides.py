"""Scores an instructor sets by hand, kept through every re-run of the grader.

Two ways in, both applied whenever grades.csv is written (:mod:`autograder.report`):

* **nbgrader's formgrader**: a manual score given to a graded cell. Each class run copies the
  formgrader's manual scores into the ``autograder_manual`` table before it grades (a regrade
  removes the submission from nbgrader's tables, and its manual scores with it), and the
  report copies them again, so a score set after the run counts too;
* **``autograder/overrides.csv``**, a file the instructor keeps, one row per decision::

      student_id,section,test,points,note
      alice,02_memory_sharding,test_min_gpus_to_fit,2,"right idea, off by one in the hidden case"
      bob,02_memory_sharding,total,20,"oral exam replaces the notebook"

  ``test`` is a graded test's name (its grade id), or ``total`` for the section's final score
  (it replaces everything else, the late penalty included). The file wins over the
  formgrader for the same test.

A test's override replaces what the autograder gave that test; the row's ``reason`` says
what changed and why (the note), and ``autograded`` keeps the grader's own score. Points
outside 0 to the test's (or the section's) points are refused with the line's number. The
final score is computed in :func:`autograder.results.final_score`.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path

from autograder import course

OVERRIDES_CSV = course.AUTOGRADER / "overrides.csv"
TOTAL = "total"


class OverrideError(ValueError):
    """overrides.csv cannot be used; the message says which line and what to change."""


@dataclass(frozen=True)
class Override:
    student_id: str
    section: str
    test: str  # a grade id, or TOTAL
    points: float
    note: str
    source: str  # "overrides.csv line 3", "formgrader"


def test_points(section: str) -> dict[str, float]:
    """The graded cells' grade ids of a section's reference notebooks, with their points."""
    import nbformat

    points = {}
    for notebook in course.section_notebooks(section):
        nb = nbformat.read(course.SOLUTIONS / section / f"{notebook}.ipynb", as_version=4)
        for c in nb.cells:
            meta = c.metadata.get("nbgrader", {})
            if meta.get("grade"):
                points[meta["grade_id"]] = float(meta.get("points", 0) or 0)
    return points


def test_names(section: str) -> set[str]:
    """The graded cells' grade ids of a section's reference notebooks."""
    return set(test_points(section))


def load_file(path: Path = OVERRIDES_CSV) -> list[Override]:
    if not path.is_file():
        return []
    sections = set(course.sections())
    found = []
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        wanted = {"student_id", "section", "test", "points"}
        missing = wanted - set(reader.fieldnames or [])
        if missing:
            raise OverrideError(
                f"{path}: no column {', '.join(sorted(missing))}; the header is "
                "student_id,section,test,points,note"
            )
        for line, row in enumerate(reader, start=2):
            where = f"{path.name} line {line}"
            if not any((v or "").strip() for v in row.values()):
                continue
            section, test = row["section"].strip(), row["test"].strip()
            if section not in sections:
                raise OverrideError(f"{where}: no section {section!r}")
            if test != TOTAL and test not in test_names(section):
                raise OverrideError(
                    f"{where}: {section} has no graded test {test!r}; write one of "
                    f"{', '.join(sorted(test_names(section)))}, or {TOTAL!r}"
                )
            try:
                points = float(row["points"])
            except ValueError:
                raise OverrideError(f"{where}: points {row['points']!r} is not a number") from None
            most = (
                sum(test_points(section).values())
                if test == TOTAL
                else (test_points(section)[test])
            )
            what = f"{section}'s total" if test == TOTAL else f"{test} of {section}"
            if not 0 <= points <= most:
                raise OverrideError(
                    f"{where}: {points:g} points for {what}, which is worth {most:g}: write "
                    f"0 to {most:g} (a bonus belongs in the LMS's gradebook, not here)"
                )
            note = (row.get("note") or "").strip()
            found.append(Override(row["student_id"].strip(), section, test, points, note, where))
    return found


def copy_formgrader_scores(url: str, jobs: list[tuple[str, str]]) -> int:
    """Copy the formgrader's manual scores of ``jobs`` into our table; how many there were."""
    from nbgrader.api import MissingEntry

    from autograder import store

    rows = []
    with course.open_gradebook(url) as gb:
        for student, section in jobs:
            try:
                submission = gb.find_submission(section, student)
            except MissingEntry:
                continue
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    if grade.manual_score is None:
                        continue
                    rows.append(
                        {
                            "student_id": student,
                            "section": section,
                            "test": grade.name,
                            "points": float(grade.manual_score),
                            "auto_score": grade.auto_score,
                            "copied_at": time.time(),
                        }
                    )
    table = store.Results(url)
    try:
        table.keep_manual(rows)
    finally:
        table.close()
    return len(rows)


def from_formgrader(url: str) -> list[Override]:
    from autograder import store

    table = store.Results(url)
    try:
        kept = table.manual()
    finally:
        table.close()
    return [
        Override(s, sec, test, row["points"], "set in the formgrader", "formgrader")
        for (s, sec, test), row in sorted(kept.items())
    ]


def auto_scores(url: str, jobs: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, float]]:
    """The autograder's score of every graded cell, by (student, section)."""
    from nbgrader.api import MissingEntry

    found: dict[tuple[str, str], dict[str, float]] = {}
    with course.open_gradebook(url) as gb:
        for student, section in jobs:
            try:
                submission = gb.find_submission(section, student)
            except MissingEntry:
                continue
            found[(student, section)] = {
                grade.name: float(grade.auto_score or 0.0)
                for notebook in submission.notebooks
                for grade in notebook.grades
            }
    return found


def decisions(url: str) -> dict[tuple[str, str], list[Override]]:
    """Every override that counts, by (student, section): the file's over the formgrader's."""
    chosen: dict[tuple[str, str, str], Override] = {}
    for override in from_formgrader(url) + load_file():
        chosen[(override.student_id, override.section, override.test)] = override
    by_job: dict[tuple[str, str], list[Override]] = {}
    for (student, section, _), override in sorted(chosen.items()):
        by_job.setdefault((student, section), []).append(override)
    return by_job


def total_of(overrides: list[Override]) -> Override | None:
    return next((o for o in overrides if o.test == TOTAL), None)
