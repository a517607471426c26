"""LMS downloads built the way the LMSs' own source writes them, for the collect tests.

* Canvas, ``lib/content_zipper.rb`` (instructure/canvas-lms): ``get_filename`` joins
  ``sanitize_user_name(sortable_name)``, ``"LATE"`` when the submission is late, and the user
  id (``"anon_<anonymous_id>"`` under anonymous grading) with ``_``, then
  ``sanitize_file_name`` drops every character outside ``[[:word:]]`` (Unicode letters,
  marks, decimal digits, ``_``); ``add_upload_submission`` appends ``_<attachment id>_`` and
  the display name with ``\\x00 / \\ : * ? " < > |`` made ``_``. rubyzip's
  ``get_output_stream`` stamps every entry with ``DOSTime.now``: the download's build time.
* Moodle, ``mod/assign/classes/downloader.php`` (4.1+): the prefix is
  ``clean_filename(str_replace('_', ' ', fullname) . '_' . uniqueid)`` ("Participant" under
  blind marking); "download in folders" writes ``clean_filename(prefix . '_assignsubmission_
  file') . '/' . filename``, flat names ``clean_filename(prefix . '_assignsubmission_file_' .
  filename)``; before 4.1 the folder ended ``_file_``. ZipStream stamps entries with the
  current time. ``clean_filename`` (PARAM_FILE) drops control characters and
  ``& < > " ` | ' : \\ /``.
* Moodle's grading worksheet CSV (``mod/assign/gradingtable.php``): ``Identifier`` is
  "Participant <id>", ``Last modified (submission)`` is ``userdate()``:
  "Wednesday, 14 October 2026, 11:59 PM", "-" when nothing was submitted.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
import zipfile
from pathlib import Path


def _word(ch: str) -> bool:
    """Onigmo's [[:word:]]: a letter, a mark, a decimal digit or connector punctuation."""
    return unicodedata.category(ch) in {"Nd", "Pc"} or unicodedata.category(ch)[0] in "LM"


def canvas_name(
    sortable_name: str,
    user_id: int,
    attachment_id: int,
    display_name: str,
    *,
    late: bool = False,
    anonymous_id: str | None = None,
) -> str:
    """The file name Canvas writes for one attachment of a submission."""
    users_name = None
    if anonymous_id is None:  # sanitize_user_name
        users_name = re.sub(r"_(\d+)_", r"\1", sortable_name)
        users_name = re.sub(r"^(\d+)$", r"\1", users_name).lower()
    ident = f"anon_{anonymous_id}" if anonymous_id is not None else str(user_id)
    filename = "_".join(p for p in (users_name, "LATE" if late else None, ident) if p)
    filename = "".join(ch for ch in filename if _word(ch))  # sanitize_file_name
    shown = re.sub(r'[\x00/\\:*?"<>|]+', "_", display_name)  # sanitize_attachment_filename
    return f"{filename}_{attachment_id}_{shown}"


def _clean_filename(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f&<>\"`|':\\/]", "", text)


def moodle_prefix(full_name: str, participant_id: int, *, blind: bool = False) -> str:
    name = "Participant" if blind else full_name
    return _clean_filename(name.replace("_", " ") + f"_{participant_id}")


def moodle_name(
    full_name: str,
    participant_id: int,
    filename: str,
    *,
    folders: bool = True,
    before_4_1: bool = False,
    blind: bool = False,
) -> str:
    """The path Moodle writes for one file of a submission (plugin assignsubmission_file)."""
    prefix = moodle_prefix(full_name, participant_id, blind=blind)
    if not folders:
        return _clean_filename(f"{prefix}_assignsubmission_file_{filename}")
    folder = _clean_filename(f"{prefix}_assignsubmission_file" + ("_" if before_4_1 else ""))
    return f"{folder}/{filename}"


def zip_download(path: Path, files: dict[str, bytes], built_at: dt.datetime) -> Path:
    """A zip whose entries all carry the time the download was built, as both LMSs write."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=built_at.timetuple()[:6]), data)
    return path


def moodle_userdate(when: dt.datetime) -> str:
    """userdate() with strftimedaydatetime, English: 'Wednesday, 14 October 2026, 11:59 PM'."""
    return when.strftime("%A, %d %B %Y, %I:%M %p")


def moodle_worksheet(path: Path, rows: list[tuple[int, str, dt.datetime | None]]) -> Path:
    """Moodle's grading worksheet: (participant id, full name, last modified or None)."""
    import csv

    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "Identifier",
                "Full name",
                "Email address",
                "Status",
                "Grade",
                "Maximum Grade",
                "Grade can be changed",
                "Last modified (submission)",
                "Last modified (grade)",
                "Feedback comments",
            ]
        )
        for pid, name, when in rows:
            writer.writerow(
                [
                    f"Participant {pid}",
                    name,
                    "",
                    "Submitted for grading" if when else "No submission",
                    "",
                    "100.00",
                    "Yes",
                    moodle_userdate(when) if when else "-",
                    "-",
                    "",
                ]
            )
    return path
