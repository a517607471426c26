"""Warnings before zeros: filing mistakes in ``submitted/`` that would otherwise grade as 0.

What the latest LMS download could not place (unknown names, strangers, other files), a
notebook one folder too high or too deep, a folder named like a section where a student's
id belongs, the blank released notebook handed in (alone, or beside copies that hold the
answers: the newest is graded), students on the roster who handed in nothing, folders of
students who are not on it, and submissions whose time nothing records. Each is a
:class:`FilingWarning` whose words say what to move or rename; `make grade` prints
them before it grades and ``report.md`` lists them first.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder import class_settings, collect, course, staging
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


def misplaced(submitted: Path | None = None) -> list[FilingWarning]:
    """Notebooks at the wrong depth, and folders named like a section at a student's place."""
    submitted = submitted or course.SUBMITTED
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


_NUMBER = re.compile(r"(\d+)\)?$")  # "nb-2", "nb (2)", "nb-Copy2": a later copy


def _answered(path: Path, released: nbformat.NotebookNode) -> int:
    try:
        return staging.answered_cells(nbformat.read(path, as_version=4), released)
    except Exception:
        return 0  # unreadable: the grader says so itself


def graded_copy(
    folder: Path, notebook: str, released: nbformat.NotebookNode
) -> tuple[Path | None, str]:
    """When ``<notebook>.ipynb`` in ``folder`` is the blank released notebook: the copy beside
    it that holds answers and is graded instead (None if none does), and why that one.

    With several answered copies the newest is graded: by the LMS's own order (Canvas's
    attachment ids, recorded by autograder.collect), else by the copy's number ("-2",
    " (2)", "Copy2"); never by a file's modification time (the time of a copy)."""
    named = folder / f"{notebook}.ipynb"
    if not named.is_file() or _answered(named, released):
        return None, ""
    answered = [p for p in sorted(folder.glob("*.ipynb")) if p != named and _answered(p, released)]
    if not answered:
        return None, ""
    if len(answered) == 1:
        return answered[0], f"{named.name} is the blank released notebook"
    record = class_settings.collected_times().get(f"{folder.parent.name}/{folder.name}", {})
    order = record.get("order", {})
    if all(p.name in order for p in answered):
        chosen = max(answered, key=lambda p: order[p.name])
        how = "the LMS's upload order (Canvas's attachment ids)"
    else:
        numbered = {p: _NUMBER.search(p.stem) for p in answered}
        chosen = max(answered, key=lambda p: (int(n[1]) if (n := numbered[p]) else -1, p.name))
        how = "its copy number" if numbered[chosen] else "its name (no copy number, no LMS order)"
    others = ", ".join(p.name for p in answered if p != chosen)
    return chosen, (
        f"{named.name} is the blank released notebook; of the answered copies "
        f"{chosen.name} is the newest by {how} (also answered: {others})"
    )


def graded_file(folder: Path, notebook: str, released: nbformat.NotebookNode) -> Path | None:
    """The file the grader grades as ``<notebook>.ipynb`` in ``folder`` (autograder.worker's
    choice): the notebook, or the answered copy beside it when it is blank, or the one other
    notebook holding its cells when it is missing; None when there is none."""
    named = folder / f"{notebook}.ipynb"
    if named.is_file():
        copy, _ = graded_copy(folder, notebook, released)
        return copy or named
    return staging.find_renamed(folder, notebook, released) if folder.is_dir() else None


def blank(student: str, section: str, submitted: Path | None = None) -> list[FilingWarning]:
    """The released notebook handed in without an answer (and the copy graded instead, if
    any)."""
    found = []
    folder = (submitted or course.SUBMITTED) / student / section
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
        copy, why = graded_copy(folder, notebook, released)
        if copy is not None:
            words = f"{_rel(path)}: {why}; the answers in {copy.name} are graded instead"
        else:
            others = sorted(p.name for p in folder.glob("*.ipynb") if p != path)
            beside = f" (beside it: {', '.join(others)}, without answers)" if others else ""
            words = f"{_rel(path)} is the blank released notebook: nothing answered{beside}"
        found.append(FilingWarning("blank", f"{student}/{section}", words))
    return found


def not_collected() -> list[FilingWarning]:
    """What the latest collect of each section could not place (autograder.collect)."""
    found = []
    for section, by_lms in sorted(collect.unplaced().items()):
        for done in by_lms.values():
            for item in done.get("files", []):
                words = f"{section}, {done.get('download', 'download')}: {item}"
                found.append(FilingWarning("not collected", section, words))
    return found


def unknown_times(jobs: list[tuple[str, str]]) -> list[FilingWarning]:
    """Submissions under a deadline whose time nothing records (copied in by hand): flagged,
    never penalised."""
    settings = class_settings.load()
    by_section: dict[str, list[str]] = {}
    for student, section in jobs:
        late = settings.lateness(student, section)
        if late is not None and late.unknown:
            by_section.setdefault(section, []).append(student)
    return [
        FilingWarning(
            "time unknown",
            section,
            f"{section}: no submission time for {', '.join(students)} (copied in by hand, or "
            "an LMS download without its times): not penalised; give the LMS's times (make "
            "collect ... TIMES=...) or [submitted] in class.toml",
        )
        for section, students in sorted(by_section.items())
    ]


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
    found = not_collected() + misplaced()
    for student, section in jobs:
        found += blank(student, section)
    return found + roster_gaps(roster, jobs) + unknown_times(jobs)
