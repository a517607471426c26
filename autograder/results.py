"""One row of grades.csv per student and section, its words, and writing grades.csv.

A row's ``status`` and ``reason`` are worded by :func:`words` from the outcomes its grading
ended in (:mod:`autograder.outcomes`, where each outcome's own phrase lives); instructors,
the report (:func:`category`) and the tests read them.

The final score is computed here and nowhere else (:func:`final_score`: the autograder's
score, the tests set by hand, the late penalty, a total set by hand); grades.csv keeps it with
``adjusted``, the words a student reads of what changed it. Every other place reads that
row: ``make grade``'s closing table, report.md, the LMS files (:mod:`autograder.exports`),
the feedback pages (:func:`stamp_pages`) and the course server's result.md
(:func:`final_row`, :func:`student_words`).
"""

from __future__ import annotations

import csv
import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autograder import course
from autograder.outcomes import (
    ERROR,
    GRADED,
    MISSING,
    CellOutcome,
    CellRaised,
    FailedTest,
    Graded,
    Missing,
    Outcome,
)

GRADES_CSV = course.AUTOGRADER / "grades.csv"
CSV_FIELDS = [
    "student_id",
    "section",
    "score",  # the final score: autograded, then scores set by hand and the late penalty
    "max_score",
    "status",
    "reason",
    "feedback",
    "autograded",  # the autograder's own score
    "submitted_at",
    "late",  # how late, empty when on time
    "adjusted",  # what changed the autograded score, as the student reads it
]


@dataclass
class Result:
    student_id: str
    section: str
    score: float
    max_score: float
    status: str
    feedback: str  # path of the feedback page(s), relative to the course root
    reason: str = ""  # what the instructor should know: failed tests, repairs, tampering

    @classmethod
    def of(
        cls,
        student_id: str,
        section: str,
        *,
        score: float,
        max_score: float,
        ended_in: Sequence[Outcome],
        pages: Sequence[str] = (),
    ) -> Result:
        """The row of a submission whose grading ``ended_in`` these outcomes."""
        status, reason = words(ended_in)
        return cls(student_id, section, score, max_score, status, " ".join(pages), reason)

    def row(self) -> dict[str, str]:
        return {
            "student_id": self.student_id,
            "section": self.section,
            "score": f"{self.score:g}",
            "max_score": f"{self.max_score:g}",
            "status": self.status,
            "reason": self.reason,
            "feedback": self.feedback,
        }


def _named(ended_in: Sequence[Outcome]) -> list[Outcome]:
    """The problems the status names: after a notebook's first tampering, later cells of
    that notebook would only say the same."""
    named, ended = [], False
    for outcome in ended_in:
        if isinstance(outcome, Graded):
            ended = False
        elif outcome.problem and not (ended and isinstance(outcome, CellOutcome)):
            named.append(outcome)
        ended = ended or (isinstance(outcome, CellOutcome) and outcome.ends_status)
    return named


def words(ended_in: Sequence[Outcome]) -> tuple[str, str]:
    """The ``status`` and ``reason`` of a submission whose grading ended in these outcomes."""
    if not ended_in:
        raise ValueError("a graded submission has at least one outcome")
    fatal = next((o for o in ended_in if o.fatal), None)
    if fatal is not None:
        return f"{ERROR}: {fatal.phrase()}", fatal.phrase()
    named = _named(ended_in)
    if not any(isinstance(o, Graded) for o in ended_in):
        reason = "; ".join(o.phrase() for o in named)
        others = [o.phrase() for o in named if not isinstance(o, Missing)]
        if others:
            return f"{ERROR}: " + "; ".join(others), reason
        found = next((o.found for o in named if isinstance(o, Missing) and o.found), ())
        return MISSING + (f" (found {', '.join(found)}: wrong name)" if found else ""), reason
    status = f"{ERROR}: " + "; ".join(o.phrase() for o in named) if named else GRADED
    failed = [o.phrase() for o in ended_in if isinstance(o, FailedTest)]
    raised = [o.phrase() for o in ended_in if isinstance(o, CellRaised)]
    parts = ["failed " + ", ".join(failed)] if failed else []
    if raised:
        more = f" and {len(raised) - 3} more" if len(raised) > 3 else ""
        parts.append("; ".join(raised[:3]) + more)
    parts += [o.phrase() for o in ended_in if o.note]
    return status, "; ".join(parts) or "every test passed"


def category(status: str) -> str:
    """``graded``, ``missing`` or ``error``: the kind of a status that :func:`words` wrote."""
    for kind in (GRADED, MISSING, ERROR):
        if status == kind or status.startswith((f"{kind} ", f"{kind}:")):
            return kind
    raise ValueError(f"not a status of grades.csv: {status!r}")


def write_csv(rows: list[dict[str, str]], path: Path) -> None:
    """Write grades.csv: ``rows`` (of :meth:`Result.row`) sorted by student and section."""
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in sorted(rows, key=lambda r: (r["student_id"], r["section"])):
            writer.writerow({k: row.get(k, "") for k in CSV_FIELDS})
    os.replace(tmp, path)  # a run killed while writing leaves the old file, never half a file


@dataclass(frozen=True)
class Final:
    """A submission's final score, and each change from the autograder's in words."""

    score: float
    changes: list[str] = field(default_factory=list)


def final_score(
    autograded: float,
    max_score: float,
    *,
    tests: Sequence = (),
    autos: dict[str, float] | None = None,
    lateness=None,
    total=None,
) -> Final:
    """THE final score: the autograder's, with the tests' scores set by hand (``tests``:
    :class:`autograder.overrides.Override`, the autograder's points per test in ``autos``),
    then the late penalty (a share of ``max_score``, never below 0; a
    :class:`autograder.class_settings.Lateness`), and a ``total`` set by hand replacing it
    all."""
    score, changes = autograded, []
    for o in tests:
        before = (autos or {}).get(o.test, 0.0)
        score += o.points - before
        why = f": {o.note}" if o.note else ""
        changes.append(f"{o.test} {before:g} -> {o.points:g} by hand ({o.source}{why})")
    if lateness is not None and (lateness.late or lateness.unknown):
        if lateness.penalty:
            score = max(0.0, score - lateness.penalty * max_score)
        changes.append(lateness.words())
    if total is not None:
        score = total.points
        why = f": {total.note}" if total.note else ""
        changes.append(f"total set to {total.points:g} by hand ({total.source}{why})")
    return Final(score, changes)


def read_csv(path: Path | None = None) -> dict[tuple[str, str], dict[str, str]]:
    """grades.csv by (student, section)."""
    path = path or course.AUTOGRADER / GRADES_CSV.name
    if not path.is_file():
        return {}
    with path.open(newline="", encoding="utf-8") as f:
        return {(r["student_id"], r["section"]): r for r in csv.DictReader(f)}


def final_row(student: str, section: str, path: Path | None = None) -> dict[str, str] | None:
    """The grades.csv row of one submission (its ``score`` is the final score), or None."""
    return read_csv(path).get((student, section))


# The words of a result that timed out on a busy machine (autograder.resume.busy_timeout).
BUSY_TIMEOUT = "timed out while the grading machine was busy"


def student_words(row: dict[str, str]) -> str:
    """The final score as a student reads it, with each change (penalty, a score set by hand
    and its note): the same words on the feedback page and in the course server's result.md."""
    text = f"{row['score']} of {row['max_score']} points"
    if row.get("adjusted"):
        text += f" (the autograder gave {row.get('autograded', '?')}; {row['adjusted']})"
    if BUSY_TIMEOUT in row.get("reason", ""):
        text += (
            "; a cell ran out of time while the grading machine was busy: it will be graded "
            "again, and this score may change"
        )
    return text


FINAL_BEGIN, FINAL_END = "<!-- final score -->", "<!-- /final score -->"
_FINAL_BLOCK = re.compile(re.escape(FINAL_BEGIN) + ".*?" + re.escape(FINAL_END), re.S)


def stamp_pages(rows: list[dict[str, str]], root: Path | None = None) -> int:
    """Write each row's final score at the top of its feedback pages (replacing the one an
    earlier report wrote); how many pages were stamped."""
    root = root or course.ROOT
    stamped = 0
    for row in rows:
        block = (
            f'{FINAL_BEGIN}<div class="final-score" id="final-score"><p><b>Your score for '
            f"{html.escape(row['section'])}: {html.escape(student_words(row))}</b></p></div>"
            f"{FINAL_END}"
        )
        for page in (row.get("feedback") or "").split():
            path = root / page
            if not path.is_file():
                continue
            text = path.read_text(encoding="utf-8")
            if FINAL_BEGIN in text:
                text = _FINAL_BLOCK.sub(lambda _, b=block: b, text, count=1)
            else:
                body = re.search(r"<body[^>]*>", text)
                at = body.end() if body else 0
                text = text[:at] + block + text[at:]
            path.write_text(text, encoding="utf-8")
            stamped += 1
    return stamped
