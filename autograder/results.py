"""One row of grades.csv per student and section, its words, and writing grades.csv.

A row's ``status`` and ``reason`` are worded by :func:`words` from the outcomes its grading
ended in (:mod:`autograder.outcomes`, where each outcome's own phrase lives); instructors,
the report (:func:`category`) and the tests read them.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
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
