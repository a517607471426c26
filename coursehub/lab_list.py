"""The lab's Assignment List with each submission's state beside its time (students' side).

`make hub` copies this file into the students' environment as ``coursehub_lab_list`` and
names :class:`StateList` as nbgrader's list in the students' nbgrader configuration
(``c.ExchangeFactory.list``), so it must import nothing but nbgrader: students cannot read the
course checkout.

nbgrader's Assignment List shows, under "Submitted assignments", one line per submission: its
time, and "(view feedback)" when the feedback folder ``~/<section>/feedback/<timestamp>/``
holds a page. The grading service writes ``result.md`` into that same folder for every state a
submission can be in (coursehub/grading_service.py); its headline, ``# <section>: <state>``,
is shown after the time:

    2026-12-07 05:40:12 UTC: graded, 11.0 of 22.0 points (view feedback)
    2026-12-07 06:10:03 UTC: late, not graded
    2026-12-07 06:12:44 UTC: waiting, graded at 2026-12-07 06:20:12 UTC

A submission the service has not answered yet reads "received, not graded yet".
"""

from __future__ import annotations

import os
import re

from nbgrader.exchange.default.list import ExchangeList

RECEIVED = "received, not graded yet"
FRACTION = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d+")


def state(result_md: str, section: str) -> str:
    """The state a result.md's headline gives (``# <section>: <state>``)."""
    lines = [line for line in result_md.splitlines() if line.strip()]
    if not lines:
        return RECEIVED
    headline = lines[0].lstrip("#").strip()
    prefix = f"{section}:"
    return headline[len(prefix) :].strip() if headline.startswith(prefix) else headline


def shown(timestamp: str, what: str) -> str:
    """The submission's line: its time to the second, then its state."""
    return FRACTION.sub(r"\1", timestamp) + f": {what}"


class StateList(ExchangeList):
    """nbgrader's list; a submitted assignment's submissions carry their state."""

    def parse_assignments(self):
        assignments = super().parse_assignments()
        if not (self.inbound or self.cached):
            return assignments
        for assignment in assignments:
            section = assignment["assignment_id"]
            parts = [self.assignment_dir]
            if self.path_includes_course:
                parts.append(assignment["course_id"])
            for sub in assignment.get("submissions", []):
                folder = os.path.join(*parts, section, "feedback", sub["timestamp"])
                try:
                    with open(os.path.join(folder, "result.md"), encoding="utf-8") as f:
                        what = state(f.read(), section)
                except OSError:
                    what = RECEIVED
                sub["timestamp"] = shown(sub["timestamp"], what)
        return assignments
