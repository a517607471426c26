"""Collect an LMS's bulk download of one section into ``submitted/<student_id>/<section>/``.

    python -m autograder.collect DOWNLOAD --section S [--lms canvas|moodle] [--times FILE]
                                 [--keep] [--roster autograder/roster.csv] [--dry-run]
    make collect FROM=DOWNLOAD SECTION=S [LMS=canvas|moodle] [TIMES=FILE] [KEEP=1]

``DOWNLOAD`` is the zip the LMS gives (or the folder it was unpacked into). The file names
each LMS writes, from its own source code (the patterns below cite it):

* **Canvas** ("Download Submissions"): one flat folder of
  ``<sortable name>[_LATE]_<user id>_<attachment id>_<the student's file name>``; the
  sortable name keeps letters of any alphabet and drops spaces, commas, apostrophes and
  hyphens (``díazcarol``, ``obrienseán``); under anonymous grading ``anon_<id>`` stands for
  the name and the user id. A file the student uploaded twice may carry ``-1``, ``-2``...;
* **Moodle** ("Download all submissions"), 4.1 and later: a folder per participant
  ``<Full Name>_<participant id>_assignsubmission_file/<the student's file>`` ("download
  submissions in folders", the default), else flat names
  ``<Full Name>_<participant id>_assignsubmission_file_<file>``; before 4.1 the folder ended
  in ``_file_``. With blind marking the name is ``Participant``.

Each file is joined to the roster (:mod:`autograder.roster`): Canvas by user id (the roster's
``lms_id``), Moodle by participant id when the roster has it, else by full name; an anonymous
Canvas id only through ``--times`` (the submissions API gives ``anonymous_id`` and
``user_id``). A notebook whose name, less the LMS's suffixes, is one of the section's
notebooks is stored under that name; any other ``.ipynb`` keeps its own name.

**Submission times come from where the LMS keeps them, never from the download's file
times**: both LMSs stamp every entry of the zip with the time the download was built
(Canvas: rubyzip's ``get_output_stream``, ``DOSTime.now``; Moodle: ZipStream, the current
time), so a download made after the deadline would make everyone late. The times are:

* ``--times`` Canvas: the submissions API's JSON
  (``GET /api/v1/courses/:course/assignments/:assignment/submissions?per_page=100``:
  ``user_id``, ``submitted_at``, ``anonymous_id``; one ``--times`` per page, or the pages
  saved as one list of lists) or a CSV with the columns ``user_id`` (or ``ID``) and
  ``submitted_at``; without it, Canvas's ``LATE`` mark (it already reflects the due dates and
  extensions set in Canvas): not marked is on time, marked is late by an unknown time;
* ``--times`` Moodle: the assignment's "Download grading worksheet" CSV (``Identifier``
  "Participant <id>", ``Last modified (submission)``);
* otherwise unknown: the report flags it, and no late penalty is taken.

Recorded in ``submitted/.collected.json`` for the deadlines (:mod:`autograder.class_settings`).

**A new download of a section is the student's submission**: a held file that differs is
replaced, and a file of that student's section folder that the new download lacks is moved
aside; both go to ``autograder/.work/replaced/<time>/`` (kept, never deleted) and are listed.
``--keep`` keeps held files that differ instead. Files that cannot be placed (no roster match,
a name matching two students, not a notebook) are listed with the reason, and recorded in
``submitted/.unplaced.json`` for the report's first section. The exit status is 0 whenever the
download could be read, 2 when it, the times file or the roster could not.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import re
import shutil
import sys
import time
import unicodedata
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from autograder import class_settings, course, roster

# Canvas, lib/content_zipper.rb (instructure/canvas-lms), ContentZipper#get_filename:
#   [sanitize_user_name(sortable_name), submission.late? ? "LATE" : nil,
#    anonymize_students? ? "anon_#{anonymous_id}" : user_id].compact.join("_")
# then sanitize_file_name: gsub(/[^[[:word:]]]/, "") (any letter, mark, digit or "_" stays:
# accents stay, spaces, commas, apostrophes and hyphens go), and #add_upload_submission:
#   "#{filename}_#{attachment.id}_#{display_name with \x00 / \ : * ? " < > | as _}".
# Older Canvas wrote "_late" in lower case; the name is absent under anonymous grading.
CANVAS = re.compile(
    r"^(?:(?P<who>.+?)_)??(?P<late>LATE_)?(?:anon_(?P<anon>[A-Za-z0-9]+)|(?P<uid>\d+))"
    r"_(?P<attachment>\d+)_(?P<file>.+)$",
    re.IGNORECASE,
)
# Moodle, mod/assign/classes/downloader.php (4.1+), get_student_prefix:
#   clean_filename(str_replace('_', ' ', fullname) . '_' . get_uniqueid_for_user(id))
# ("Participant" for fullname under blind marking; "_" in a name becomes a space, so the
# name holds no "_"), then load_submissionplugin_filelist:
#   folders: clean_filename(prefix . '_' . subtype . '_' . type) . filepath . filename
#   flat:    clean_filename(prefix . '_' . subtype . '_' . type . '_' . filename)
# Before 4.1 (mod/assign/locallib.php, download_submissions) the folder was
#   clean_filename(prefix . '_' . subtype . '_' . type . '_') . filepath . filename.
# clean_filename drops & < > " ` | ' : \ / (apostrophes go, accents and hyphens stay).
MOODLE = re.compile(
    r"^(?P<who>[^_]+)_(?P<uid>\d+)_assignsubmission_(?P<plugin>[a-z]+)(?:_(?P<file>.*))?$"
)
# A re-uploaded file: Canvas's Attachment.make_unique_filename writes "name-1.ipynb"; Moodle's
# file picker and browsers write "name (1).ipynb".
RESUBMITTED = re.compile(r"(?:-(?P<dash>\d+)| \((?P<paren>\d+)\))$")
# Moodle's grading worksheet (mod/assign/gradingtable.php, downloaded through
# assignfeedback_offline): "Identifier" is get_string('hiddenuser') . recordid ("Participant
# 123"), "Last modified (submission)" is userdate(timemodified): strftimedaydatetime in the
# downloading user's language and timezone, "-" when nothing was submitted.
MOODLE_ID = "Identifier"
MOODLE_SUBMITTED = "Last modified (submission)"
MOODLE_TIME_FORMATS = ("%A, %d %B %Y, %I:%M %p", "%A, %d %B %Y, %H:%M", "%d %B %Y, %I:%M %p")


class CollectError(ValueError):
    """The download, the times file or the roster cannot be used; the message says what to
    do."""


@dataclass(frozen=True)
class Entry:
    """One file of the download."""

    path: str  # inside the download
    modified: dt.datetime  # the zip's entry time: the time the download was built
    read: object  # () -> bytes


@dataclass(frozen=True)
class Parsed:
    lms: str
    uid: str  # Canvas's user id, "anon_<id>", or Moodle's participant id
    who: str  # Canvas's sortable name, Moodle's full name ("" when anonymous)
    file: str  # the student's own file name
    late: bool
    order: int = 0  # Canvas's attachment id: a later upload has a larger one


@dataclass(frozen=True)
class Submitted:
    """What the LMS's own records say of one student's submission."""

    at: dt.datetime | None
    source: str


@dataclass
class Collected:
    placed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # held and different: not replaced (--keep)
    replaced: list[str] = field(default_factory=list)
    moved_aside: list[str] = field(default_factory=list)  # held, not in the new download
    unplaced: list[str] = field(default_factory=list)  # "<file>: why"
    notes: list[str] = field(default_factory=list)
    times: dict[str, dict] = field(default_factory=dict)


def entries(download: Path) -> Iterator[Entry]:
    """The files of a zip or a folder."""
    if download.is_dir():
        for path in sorted(p for p in download.rglob("*") if p.is_file()):
            stamp = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
            yield Entry(path.relative_to(download).as_posix(), stamp, path.read_bytes)
        return
    if not zipfile.is_zipfile(download):
        raise CollectError(f"{download} is neither a zip file nor a folder")
    with zipfile.ZipFile(download) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            stamp = dt.datetime(*info.date_time, tzinfo=dt.UTC)
            data = archive.read(info)
            yield Entry(info.filename, stamp, lambda data=data: data)


def parse(path: str, lms: str) -> Parsed | None:
    """The LMS's fields of one file of its download, or None if the name is not its pattern."""
    parts = PurePosixPath(unicodedata.normalize("NFC", path)).parts
    if lms == "canvas":
        if len(parts) != 1:
            return None  # Canvas's download is one flat folder
        found = CANVAS.match(parts[0])
        if not found:
            return None
        uid = f"anon_{found['anon']}" if found["anon"] else found["uid"]
        return Parsed(
            "canvas",
            uid,
            found["who"] or "",
            found["file"],
            bool(found["late"]),
            int(found["attachment"]),
        )
    for i, part in enumerate(parts):  # Moodle: the prefix is on the folder or on the file
        found = MOODLE.match(part)
        if not found:
            continue
        if i == len(parts) - 1:  # a flat name: the student's file follows the prefix
            own = found["file"] or ""
        else:  # a folder (4.1: "..._file/", before: "..._file_/"), maybe with subfolders
            own = "/".join(parts[i + 1 :])
        if not own:
            return None
        return Parsed("moodle", found["uid"], found["who"], own, False)
    return None


def detect(paths: list[str]) -> str:
    """ "canvas" or "moodle", from the file names; CollectError if neither fits."""
    votes = {lms: sum(parse(p, lms) is not None for p in paths) for lms in ("moodle", "canvas")}
    best = max(votes, key=votes.get)
    if not votes[best]:
        raise CollectError(
            "the file names follow neither Canvas's download (sortablename[_LATE]_userid_"
            "fileid_file) nor Moodle's (Full Name_id_assignsubmission_file/...): pass --lms, or "
            "unpack and copy the notebooks to submitted/<student_id>/<section>/ by hand"
        )
    return best


def resubmission(file: str) -> int:
    """The re-upload number of a file name ("nb-2.ipynb": 2, "nb (1).ipynb": 1, "nb": 0)."""
    stem = PurePosixPath(file).name.removesuffix(".ipynb")
    found = RESUBMITTED.search(stem)
    return int(found["dash"] or found["paren"]) if found else 0


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
    if parsed.uid.startswith("anon_"):
        return None, (
            f"anonymous ({parsed.uid}): give --times the submissions API's JSON (it pairs "
            "anonymous_id with user_id), or grade after Canvas shows the names"
        )
    blind = parsed.lms == "moodle" and parsed.who == "Participant"
    if not blind and (parsed.lms == "moodle" or not any(s.lms_id for s in people.students)):
        named = people.by_name(parsed.who)
        if len(named) == 1:
            return named[0], ""
        if len(named) > 1:
            ids = ", ".join(s.student_id for s in named)
            return None, f"the name {parsed.who!r} matches {ids}: add lms_id to the roster"
    who = "blind marking" if blind else f"or the name {parsed.who!r}"
    return None, f"no student with lms_id {parsed.uid} ({who}) in {people.path.name}"


# -- the LMS's own submission times ----------------------------------------------------------


def _utc(text: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _moodle_time(text: str, tz: dt.tzinfo) -> dt.datetime | None:
    text = text.strip()
    if not text or text == "-":
        return None
    for form in MOODLE_TIME_FORMATS:
        try:
            return dt.datetime.strptime(text, form).replace(tzinfo=tz)
        except ValueError:
            continue
    try:
        return _utc(text)
    except ValueError:
        raise CollectError(
            f"grading worksheet: {MOODLE_SUBMITTED!r} {text!r} is not a date Moodle writes in "
            "English (e.g. 'Wednesday, 14 October 2026, 11:59 PM'): download the worksheet with "
            "English as your language"
        ) from None


def read_times(path: Path, lms: str, tz: dt.tzinfo) -> tuple[dict[str, Submitted], dict]:
    """(uid -> the LMS's submission time, anonymous id -> user id) from the LMS's records.

    Canvas: the submissions API's JSON, or a CSV with ``user_id``/``ID`` and ``submitted_at``;
    Moodle: the grading worksheet CSV (its times are in ``tz``, the class's timezone: download
    it with that timezone in your Moodle profile)."""
    if not path.is_file():
        raise CollectError(f"--times {path}: no such file")
    text = path.read_text(encoding="utf-8-sig")
    times: dict[str, Submitted] = {}
    anonymous: dict[str, str] = {}
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CollectError(f"--times {path}: not JSON ({exc})") from None
        if isinstance(data, dict):
            data = data.get("submissions", [data])
        # pages of the API (per_page is at most 100) saved as one list of lists
        data = [x for item in data for x in (item if isinstance(item, list) else [item])]
        for item in data:
            if not isinstance(item, dict) or "user_id" not in item:
                raise CollectError(
                    f"--times {path}: expected the submissions API's list of objects with "
                    "user_id and submitted_at"
                )
            uid = str(item["user_id"])
            when = item.get("submitted_at")
            times[uid] = Submitted(_utc(when) if when else None, "Canvas submissions API")
            if item.get("anonymous_id"):
                anonymous[f"anon_{item['anonymous_id']}"] = uid
        return times, anonymous
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    if lms == "moodle" or MOODLE_SUBMITTED in header:
        if MOODLE_ID not in header or MOODLE_SUBMITTED not in header:
            raise CollectError(
                f"--times {path}: Moodle's grading worksheet has the columns {MOODLE_ID!r} "
                f"and {MOODLE_SUBMITTED!r} (found {', '.join(header)}); download it from the "
                "assignment's 'Download grading worksheet'"
            )
        for row in reader:
            found = re.search(r"(\d+)\s*$", row[MOODLE_ID] or "")
            if found:
                when = _moodle_time(row[MOODLE_SUBMITTED] or "", tz)
                times[found[1]] = Submitted(when, "Moodle grading worksheet")
        return times, anonymous
    uid_col = next((c for c in ("user_id", "ID", "id") if c in header), None)
    if uid_col is None or "submitted_at" not in header:
        raise CollectError(
            f"--times {path}: a Canvas times CSV has the columns user_id (or ID) and "
            f"submitted_at (found {', '.join(header)})"
        )
    for row in reader:
        when = (row["submitted_at"] or "").strip()
        times[row[uid_col].strip()] = Submitted(_utc(when) if when else None, "Canvas CSV")
        if row.get("anonymous_id"):
            anonymous[f"anon_{row['anonymous_id'].strip()}"] = row[uid_col].strip()
    return times, anonymous


def _record(parsed: Parsed, lms: str, times: dict[str, Submitted], download: str) -> dict:
    """What .collected.json keeps of one student's submission: its time only from the LMS's
    records, else unknown (Canvas's LATE mark is kept beside it)."""
    known = times.get(parsed.uid)
    record = {
        "lms": lms,
        "download": download,
        "submitted_at": known.at.isoformat() if known and known.at else None,
        "source": known.source if known else None,
        "lms_late": parsed.late if lms == "canvas" else None,
        "files": [],
        "order": {},  # stored name -> Canvas's attachment id (a later upload: a larger one)
    }
    return record


# -- placing the files -----------------------------------------------------------------------


def replaced_folder() -> Path:
    return course.WORK / "replaced"


def _newer(a: tuple[Entry, Parsed], b: tuple[Entry, Parsed]) -> tuple[Entry, Parsed]:
    """The newer of two files of one notebook in one download: Canvas's attachment id (a later
    upload has a larger one), else the re-upload number; never the zip's entry times."""
    key = lambda pair: (pair[1].order, resubmission(pair[1].file), pair[1].file)  # noqa: E731
    return max(a, b, key=key)


def collect(
    download: Path,
    section: str,
    people: roster.Roster,
    *,
    lms: str | None = None,
    times_file: Path | list[Path] | None = None,
    keep: bool = False,
    dry_run: bool = False,
    tz: dt.tzinfo = dt.UTC,
) -> Collected:
    files = list(entries(download))
    lms = lms or detect([e.path for e in files])
    times: dict[str, Submitted] = {}
    anonymous: dict[str, str] = {}
    files_of_times = times_file if isinstance(times_file, list) else [times_file] * bool(times_file)
    for path in files_of_times:  # several files: the API's pages, one file each
        more, more_anonymous = read_times(path, lms, tz)
        times.update(more)
        anonymous.update(more_anonymous)
    done = Collected()
    stamps = {e.modified for e in files}
    if len(stamps) == 1 and len(files) > 1:
        done.notes.append(
            f"every file of the download carries one time ({next(iter(stamps)):%Y-%m-%d %H:%M}, "
            "when the download was built): not read as submission times"
        )
    chosen: dict[Path, tuple[Entry, Parsed]] = {}
    records: dict[str, dict] = {}
    for entry in files:
        parsed = parse(entry.path, lms)
        if parsed is None:
            done.unplaced.append(f"{entry.path}: not a {lms} submission file name")
            continue
        if parsed.uid in anonymous:
            parsed = Parsed(lms, anonymous[parsed.uid], "", parsed.file, parsed.late, parsed.order)
        name = notebook_name(parsed.file, section)
        if name is None:
            done.unplaced.append(f"{entry.path}: not a notebook (.ipynb)")
            continue
        student, why = student_of(parsed, people)
        if student is None:
            done.unplaced.append(f"{entry.path}: {why}")
            continue
        key = f"{student.student_id}/{section}"
        records.setdefault(key, _record(parsed, lms, times, download.name))
        target = course.SUBMITTED / student.student_id / section / name
        if target in chosen:  # two uploads of one notebook in one download: the newer counts
            newer = _newer(chosen[target], (entry, parsed))
            older = chosen[target] if newer is not chosen[target] else (entry, parsed)
            how = "attachment id" if lms == "canvas" else "re-upload number"
            done.unplaced.append(
                f"{older[0].path}: an older upload of {name} than "
                f"{PurePosixPath(newer[0].path).name} (by {how}), not used"
            )
            chosen[target] = newer
            continue
        chosen[target] = (entry, parsed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backups = replaced_folder() / stamp

    def move_aside(path: Path) -> str:
        backup = backups / path.relative_to(course.SUBMITTED)
        if not dry_run:
            backup.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, backup)
        return _rel(backup)

    new_files: dict[Path, set[str]] = {}
    for target, (_, parsed) in chosen.items():
        new_files.setdefault(target.parent, set()).add(target.name)
        record = records[f"{target.parent.parent.name}/{section}"]
        record["files"].append(target.name)
        if parsed.order:
            record["order"][target.name] = parsed.order
    for target, (entry, _) in sorted(chosen.items()):
        where = _rel(target)
        data = entry.read()
        if target.is_file():
            if target.read_bytes() == data:
                done.unchanged.append(where)
                continue
            if keep:
                done.kept.append(f"{where}: kept the file already there (it differs; --keep)")
                continue
            done.replaced.append(f"{where} (the old file: {move_aside(target)})")
        else:
            done.placed.append(where)
        if not dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    if not keep:  # what the student's new submission no longer holds is moved aside
        for folder, names in sorted(new_files.items()):
            if not folder.is_dir():
                continue
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                if path.relative_to(folder).as_posix() not in names:
                    done.moved_aside.append(
                        f"{_rel(path)}: not in the new download (moved to {move_aside(path)})"
                    )
    done.times = records
    if not dry_run:
        if records:
            _write_json(class_settings.collected_path(), records)
        held = unplaced().get(section, {})  # the latest download of each LMS counts
        held[lms] = {"download": download.name, "at": stamp, "files": done.unplaced}
        _write_json(unplaced_path(), {section: held})
    return done


def _rel(path: Path) -> str:
    try:
        return path.relative_to(course.ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def unplaced_path() -> Path:
    return course.SUBMITTED / ".unplaced.json"


def unplaced() -> dict[str, dict[str, dict]]:
    """What the latest collect of each section and LMS could not place: section -> lms ->
    {download, at, files: ["<file>: why"]}."""
    path = unplaced_path()
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _write_json(path: Path, update: dict) -> None:
    held = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    held.update(update)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(held, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def summary(done: Collected, section: str, people: roster.Roster) -> str:
    lines = [
        f"{section}: {len(done.placed)} placed, {len(done.replaced)} replaced, "
        f"{len(done.unchanged)} already there, {len(done.moved_aside)} moved aside, "
        f"{len(done.kept)} kept (differ), {len(done.unplaced)} not placed"
    ]
    lines += [f"note: {note}" for note in done.notes]
    for title, items in (
        ("replaced (the old file kept)", done.replaced),
        ("moved aside: the new download lacks them", done.moved_aside),
        ("kept, not replaced", done.kept),
        ("not placed", done.unplaced),
    ):
        if items:
            lines += [f"{title}:"] + [f"  {item}" for item in items]
    unknown = sorted(k.split("/")[0] for k, r in done.times.items() if not r["submitted_at"])
    if unknown:
        how = (
            "Canvas's LATE mark only"
            if any(r["lms"] == "canvas" for r in done.times.values())
            else "unknown: late penalties are not taken"
        )
        lines.append(
            f"no submission time from the LMS for {len(unknown)} student(s) ({how}); give "
            "--times (Canvas: the submissions API's JSON; Moodle: the grading worksheet CSV)"
        )
    have = {key.split("/")[0] for key in done.times}
    have |= {p.parent.name for p in course.SUBMITTED.glob(f"*/{section}") if p.is_dir()}
    nothing = [s.student_id for s in people.students if s.student_id not in have]
    if nothing:
        lines.append(f"on the roster, nothing for {section}: {', '.join(nothing)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("download", type=Path, help="the LMS's zip, or the folder it unpacked")
    parser.add_argument("--section", required=True, help="the section this download is of")
    parser.add_argument("--lms", choices=("canvas", "moodle"), help="default: from the names")
    parser.add_argument(
        "--times",
        type=Path,
        action="append",
        help="the LMS's submission times: Canvas's submissions API JSON or CSV (user_id, "
        "submitted_at), Moodle's grading worksheet CSV; repeat it for the API's pages",
    )
    parser.add_argument("--roster", type=Path, default=roster.ROSTER_CSV)
    parser.add_argument(
        "--keep", action="store_true", help="keep held files that differ (default: replace)"
    )
    parser.add_argument("--replace", action="store_true", help=argparse.SUPPRESS)  # the default
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
            times_file=args.times,
            keep=args.keep,
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
