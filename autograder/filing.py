"""Warnings before zeros: filing mistakes in ``submitted/`` that would otherwise grade as 0.

A notebook one folder too high or too deep, a folder named like a section where a student's
id belongs, the blank released notebook handed in (alone, or beside a copy that holds the
answers), students on the roster who handed in nothing, and folders of students who are not
on it. Each is a :class:`FilingWarning` whose words say what to move or rename; `make grade` prints
them before it grades and ``report.md`` lists them first.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder import course, staging
from autograder.roster import Roster


@dataclass(frozen=True)
class FilingWarning:
    kind: str  # "wrong depth", "section as student", "blank", "not on roster", "nothing"
    where: str  # the path or the student concerned
    words: str

    def line(self) -> str:
        return f"{self.kind}: {self.words}"


@functools.cache
def _released(section: str, notebook: str) -> nbformat.NotebookNode:
    return nbformat.read(course.NOTEBOOKS / section / f"{notebook}.ipynb", as_version=4)


def _section_of(notebook: str) -> str | None:
    return next((s for s in course.sections() if notebook in course.section_notebooks(s)), None)


def _rel(path: Path) -> str:
    return path.relative_to(course.ROOT).as_posix()


def misplaced(submitted: Path = course.SUBMITTED) -> list[FilingWarning]:
    """Notebooks at the wrong depth, and folders named like a section at a student's place."""
    found = []
    if not submitted.is_dir():
        return found
    sections = set(course.sections())
    for path in sorted(submitted.rglob("*.ipynb")):
        parts = path.relative_to(submitted).parts
        if ".ipynb_checkpoints" in parts or any(p.startswith(".") for p in parts):
            continue
        if len(parts) == 3 and parts[1] in sections:
            continue
        section = _section_of(path.stem) or "<section>"
        if len(parts) == 1:
            fix = f"it belongs in {_rel(submitted)}/<student_id>/{section}/"
            found.append(
                FilingWarning("wrong depth", _rel(path), f"{_rel(path)}: no student; {fix}")
            )
        elif len(parts) == 2 and parts[0] not in sections:
            fix = f"move it to {_rel(submitted)}/{parts[0]}/{section}/"
            words = f"{_rel(path)} is one folder too high (not graded): {fix}"
            found.append(FilingWarning("wrong depth", _rel(path), words))
        elif len(parts) > 3 and parts[1] in sections:
            fix = f"move it up to {_rel(submitted)}/{parts[0]}/{parts[1]}/"
            words = f"{_rel(path)} is {len(parts) - 3} folder(s) too deep (not graded): {fix}"
            found.append(FilingWarning("wrong depth", _rel(path), words))
    for folder in sorted(p for p in submitted.iterdir() if p.is_dir()):
        if folder.name in sections or _section_of(folder.name):
            words = (
                f"{_rel(folder)}/ is named like a section, where a student's id belongs: the "
                f"grader takes {folder.name!r} for a student; expected "
                f"{_rel(submitted)}/<student_id>/{_section_of(folder.name) or folder.name}/"
            )
            found.append(FilingWarning("section as student", _rel(folder), words))
    return found


def blank(student: str, section: str, submitted: Path = course.SUBMITTED) -> list[FilingWarning]:
    """The released notebook handed in without an answer (and a copy beside it, if any)."""
    found = []
    folder = submitted / student / section
    for notebook in course.section_notebooks(section):
        path = folder / f"{notebook}.ipynb"
        if not path.is_file():
            continue
        released = _released(section, notebook)
        try:
            if staging.answered_cells(nbformat.read(path, as_version=4), released):
                continue
        except Exception:
            continue  # unreadable: the grader says so itself
        copy = staging.answered_copy(folder, notebook, released)
        if copy is not None:
            words = (
                f"{_rel(path)} is the blank released notebook; the answers are in "
                f"{copy.name}, which is graded instead"
            )
        else:
            others = sorted(p.name for p in folder.glob("*.ipynb") if p != path)
            beside = f" (beside it: {', '.join(others)}, without answers)" if others else ""
            words = f"{_rel(path)} is the blank released notebook: nothing answered{beside}"
        found.append(FilingWarning("blank", f"{student}/{section}", words))
    return found


def roster_gaps(roster: Roster | None, jobs: list[tuple[str, str]]) -> list[FilingWarning]:
    """Students on the roster who handed in nothing for a section the class handed in, and
    submissions of students who are not on the roster."""
    if roster is None:
        return []
    found = []
    sections = sorted({section for _, section in jobs})
    students = sorted({student for student, _ in jobs})
    enrolled = set(roster.ids())
    for section in sections:
        nothing = [sid for sid in roster.ids() if not (course.SUBMITTED / sid / section).is_dir()]
        if nothing:
            words = f"on the roster, nothing submitted for {section}: {', '.join(nothing)}"
            found.append(FilingWarning("nothing", section, words))
    strangers = [s for s in students if s not in enrolled]
    if strangers:
        words = (
            f"submissions of students not on {roster.path.name}: {', '.join(strangers)} "
            "(a typo in a folder name, or a student to add to the roster)"
        )
        found.append(FilingWarning("not on roster", ", ".join(strangers), words))
    return found


def warnings(jobs: list[tuple[str, str]], roster: Roster | None) -> list[FilingWarning]:
    """Every filing warning of the class ``jobs`` (student, section)."""
    found = misplaced()
    for student, section in jobs:
        found += blank(student, section)
    return found + roster_gaps(roster, jobs)
