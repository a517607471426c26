"""Collect an LMS's bulk download of one section into ``submitted/<student_id>/<section>/``.

    python -m autograder.collect DOWNLOAD --section S [--lms canvas|moodle] [--replace]
                                 [--roster autograder/roster.csv] [--dry-run]
    make collect FROM=DOWNLOAD SECTION=S [LMS=canvas|moodle] [REPLACE=1]

``DOWNLOAD`` is the zip the LMS gives (or the folder it was unpacked into):

* **Canvas** ("Download Submissions"): one flat folder of files named
  ``<sortablename>[_late]_<user id>_<attachment id>_<the student's file name>``, where a
  re-submitted file's name may carry ``-1``, ``-2``... before its extension;
* **Moodle** ("Download all submissions"): a folder per participant,
  ``<Full Name>_<participant id>_assignsubmission_file_/<the student's file>``, or the same
  prefix on flat file names when "download submissions in folders" is off.

Each file is joined to the roster (:mod:`autograder.roster`): Canvas by user id (the roster's
``lms_id``), Moodle by participant id when the roster has it, else by full name. A notebook
whose name, less the LMS's suffixes, is one of the section's notebooks is stored under that
name; any other ``.ipynb`` keeps its own name (the grader then decides whether it is the
notebook, renamed). The time of each file in the download and Canvas's "late" mark are kept
in ``submitted/.collected.json`` for the deadlines (:mod:`autograder.class_settings`).

Nothing already held is overwritten without saying so: an identical file is left as it is; a
different one is kept and reported, unless ``--replace``, which first moves the held file to
``autograder/.work/replaced/<time>/``. Files that cannot be placed (no roster match, a name
matching two students, not a notebook) are listed with the reason; the exit status is 0
whenever the download could be read, 2 when it or the roster could not.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from autograder import class_settings, course, roster

CANVAS = re.compile(
    r"^(?P<who>[a-z0-9]+)(?P<late>_late)?_(?P<uid>\d+)_(?P<attachment>\d+)_(?P<file>.+)$",
    re.IGNORECASE,
)
MOODLE = re.compile(r"^(?P<who>.+?)_(?P<uid>\d+)_assignsubmission_(?P<plugin>[a-z]+)_(?P<file>.*)$")
RESUBMITTED = re.compile(r"(?:-\d+| \(\d+\))$")  # "name-1.ipynb", "name (2).ipynb"
REPLACED = course.WORK / "replaced"


class CollectError(ValueError):
    """The download or the roster cannot be used; the message says what to do."""


@dataclass(frozen=True)
class Entry:
    """One file of the download."""

    path: str  # inside the download
    modified: dt.datetime
    read: object  # () -> bytes


@dataclass(frozen=True)
class Parsed:
    lms: str
    uid: str
    who: str  # Canvas's sortable name, Moodle's full name
    file: str  # the student's own file name
    late: bool


@dataclass
class Collected:
    placed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # held and different: not replaced
    replaced: list[str] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)  # "<file>: why"
    times: dict[str, dict] = field(default_factory=dict)


def entries(download: Path, tz: dt.tzinfo) -> Iterator[Entry]:
    """The files of a zip or a folder, with their times (a zip's are local: ``tz``)."""
    if download.is_dir():
        for path in sorted(p for p in download.rglob("*") if p.is_file()):
            stamp = dt.datetime.fromtimestamp(path.stat().st_mtime, tz)
            yield Entry(path.relative_to(download).as_posix(), stamp, path.read_bytes)
        return
    if not zipfile.is_zipfile(download):
        raise CollectError(f"{download} is neither a zip file nor a folder")
    with zipfile.ZipFile(download) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            stamp = dt.datetime(*info.date_time, tzinfo=tz)
            data = archive.read(info)
            yield Entry(info.filename, stamp, lambda data=data: data)


def parse(path: str, lms: str) -> Parsed | None:
    """The LMS's fields of one file of its download, or None if the name is not its pattern."""
    parts = PurePosixPath(path).parts
    if lms == "canvas":
        found = CANVAS.match(parts[-1])
        if not found:
            return None
        late = bool(found["late"])
        return Parsed("canvas", found["uid"], found["who"], found["file"], late)
    for i, part in enumerate(parts):  # Moodle: the prefix is on the folder or on the file
        found = MOODLE.match(part)
        if found:
            own = found["file"] if i == len(parts) - 1 else parts[-1]
            return Parsed("moodle", found["uid"], found["who"], own, False)
    return None


def detect(paths: list[str]) -> str:
    """ "canvas" or "moodle", from the file names; CollectError if neither fits."""
    votes = {lms: sum(parse(p, lms) is not None for p in paths) for lms in ("moodle", "canvas")}
    best = max(votes, key=votes.get)
    if not votes[best]:
        raise CollectError(
            "the file names follow neither Canvas's download (name_userid_fileid_file) nor "
            "Moodle's (Full Name_id_assignsubmission_file_...): pass --lms, or unpack and copy "
            "the notebooks to submitted/<student_id>/<section>/ by hand"
        )
    return best


def notebook_name(file: str, section: str) -> str | None:
    """The name the file is stored under; None if it is not a notebook."""
    name = PurePosixPath(file).name
    if not name.endswith(".ipynb") or name.startswith("."):
        return None
    stem = name[: -len(".ipynb")]
    plain = RESUBMITTED.sub("", stem)
    if plain in course.section_notebooks(section):
        return f"{plain}.ipynb"
    return name


def student_of(parsed: Parsed, people: roster.Roster) -> tuple[roster.Student | None, str]:
    """The roster's student of a file, or None and why not."""
    by_id = people.by_lms_id(parsed.uid)
    if by_id is not None:
        return by_id, ""
    if parsed.lms == "moodle" or not any(s.lms_id for s in people.students):
        named = people.by_name(parsed.who)
        if len(named) == 1:
            return named[0], ""
        if len(named) > 1:
            ids = ", ".join(s.student_id for s in named)
            return None, f"the name {parsed.who!r} matches {ids}: add lms_id to the roster"
    return None, (
        f"no student with lms_id {parsed.uid} (or the name {parsed.who!r}) in {people.path.name}"
    )


def collect(
    download: Path,
    section: str,
    people: roster.Roster,
    *,
    lms: str | None = None,
    replace: bool = False,
    dry_run: bool = False,
    tz: dt.tzinfo = dt.UTC,
) -> Collected:
    files = list(entries(download, tz))
    lms = lms or detect([e.path for e in files])
    done = Collected()
    chosen: dict[Path, tuple[Entry, Parsed]] = {}
    for entry in files:
        parsed = parse(entry.path, lms)
        if parsed is None:
            done.unplaced.append(f"{entry.path}: not a {lms} submission file name")
            continue
        name = notebook_name(parsed.file, section)
        if name is None:
            done.unplaced.append(f"{entry.path}: not a notebook (.ipynb)")
            continue
        student, why = student_of(parsed, people)
        if student is None:
            done.unplaced.append(f"{entry.path}: {why}")
            continue
        target = course.SUBMITTED / student.student_id / section / name
        if target in chosen:  # two attempts in one download: the newer counts
            older = min((chosen[target][0], entry), key=lambda e: e.modified)
            done.unplaced.append(f"{older.path}: an older file of the same notebook, not used")
            if older is entry:
                continue
        chosen[target] = (entry, parsed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for target, (entry, parsed) in sorted(chosen.items()):
        where = target.relative_to(course.ROOT).as_posix()
        data = entry.read()
        key = f"{target.parent.parent.name}/{section}"
        record = {
            "submitted_at": entry.modified.isoformat(),
            "source": f"{lms} download",
            "file": PurePosixPath(entry.path).name,
            "lms_late": parsed.late,
        }
        if target.is_file():
            if target.read_bytes() == data:
                done.unchanged.append(where)
                done.times.setdefault(key, record)
                continue
            if not replace:
                done.kept.append(f"{where}: kept the file already there (it differs; --replace)")
                continue
            backup = REPLACED / stamp / target.relative_to(course.SUBMITTED)
            if not dry_run:
                backup.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(target, backup)
            done.replaced.append(f"{where} (the old file: {backup.relative_to(course.ROOT)})")
        else:
            done.placed.append(where)
        done.times[key] = record
        if not dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            seconds = entry.modified.timestamp()
            os.utime(target, (seconds, seconds))
    if not dry_run and done.times:
        _record_times(done.times)
    return done


def _record_times(times: dict[str, dict]) -> None:
    held = class_settings.collected_times()
    held.update(times)
    path = class_settings.COLLECTED
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(held, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def summary(done: Collected, section: str, people: roster.Roster) -> str:
    lines = [
        f"{section}: {len(done.placed)} placed, {len(done.replaced)} replaced, "
        f"{len(done.unchanged)} already there, {len(done.kept)} kept (differ), "
        f"{len(done.unplaced)} not placed"
    ]
    for title, items in (
        ("replaced", done.replaced),
        ("kept, not replaced", done.kept),
        ("not placed", done.unplaced),
    ):
        if items:
            lines += [f"{title}:"] + [f"  {item}" for item in items]
    have = {key.split("/")[0] for key in done.times}
    have |= {p.name for p in course.SUBMITTED.glob(f"*/{section}") if p.is_dir()}
    nothing = [s.student_id for s in people.students if s.student_id not in have]
    if nothing:
        lines.append(f"on the roster, nothing for {section}: {', '.join(nothing)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("download", type=Path, help="the LMS's zip, or the folder it unpacked")
    parser.add_argument("--section", required=True, help="the section this download is of")
    parser.add_argument("--lms", choices=("canvas", "moodle"), help="default: from the names")
    parser.add_argument("--roster", type=Path, default=roster.ROSTER_CSV)
    parser.add_argument("--replace", action="store_true", help="replace files that differ")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done")
    args = parser.parse_args(argv)
    if args.section not in course.sections():
        parser.error(f"no section {args.section!r}; sections are: {', '.join(course.sections())}")
    if not args.download.exists():
        parser.error(f"{args.download}: no such file or folder")
    try:
        people = roster.load(args.roster)
        tz = class_settings.load().timezone
    except (roster.RosterError, class_settings.SettingsError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if people is None:
        print(
            f"no roster at {args.roster}: export the class list from the LMS as CSV with the "
            "columns student_id (the course's id), name and lms_id (Canvas user id or Moodle "
            "participant id); see autograder/roster.py",
            file=sys.stderr,
        )
        return 2
    try:
        done = collect(
            args.download,
            args.section,
            people,
            lms=args.lms,
            replace=args.replace,
            dry_run=args.dry_run,
            tz=tz,
        )
    except (CollectError, zipfile.BadZipFile) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(
        ("dry run, nothing written: " if args.dry_run else "") + summary(done, args.section, people)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
