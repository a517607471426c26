"""The instructor's report and the LMS table, written after each class run.

* ``autograder/report.md``: per section, the score distribution and the tests the class
  found hardest (how many graded submissions failed each, hardest first, from the gradebook);
  then one line per student and section with score, status and reason.
* ``autograder/grades_lms.csv``: one row per student, one column per section, and the total:
  the shape learning-management systems import.
"""

from __future__ import annotations

import csv
import os
import time
from collections import Counter
from pathlib import Path

from autograder import course, results

REPORT = course.AUTOGRADER / "report.md"
LMS_CSV = course.AUTOGRADER / "grades_lms.csv"


def hardest_tests(section: str, student_ids: list[str]) -> list[tuple[str, int, int]]:
    """(test name, submissions failing it, submissions graded), hardest first."""
    from nbgrader.api import MissingEntry

    failed: Counter[str] = Counter()
    graded: Counter[str] = Counter()
    with course.open_gradebook() as gb:
        for student in student_ids:
            try:
                submission = gb.find_submission(section, student)
            except MissingEntry:
                continue
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    if not grade.max_score_gradecell or grade.cell_type != "code":
                        continue
                    graded[grade.name] += 1
                    if (grade.score or 0) < grade.max_score:
                        failed[grade.name] += 1
    return sorted(((t, failed[t], graded[t]) for t in graded), key=lambda x: (-x[1], x[0]))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[dict[str, str]], sections: list[str], sandbox_note: str) -> str:
    lines = [
        "# Grades report",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M')}; sandbox for student code: {sandbox_note}.",
        "",
    ]
    for section in sections:
        mine = [r for r in rows if r["section"] == section]
        if not mine:
            continue
        scores = sorted(float(r["score"]) for r in mine)
        statuses = Counter(results.category(r["status"]) for r in mine)
        lines += [
            f"## {section}",
            "",
            f"{len(mine)} students; score median {scores[len(scores) // 2]:g} of "
            f"{mine[0]['max_score']}, mean {sum(scores) / len(scores):.1f}; "
            + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())),
            "",
            "| test | failed | of graded |",
            "|---|---|---|",
        ]
        for test, failed, graded in hardest_tests(section, [r["student_id"] for r in mine]):
            lines.append(f"| {test} | {failed} | {graded} |")
        lines.append("")
    lines += [
        "## Students",
        "",
        "| student | section | score | status | reason |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {_cell(r['student_id'])} | {r['section']} | {r['score']} / {r['max_score']} "
            f"| {_cell(r['status'])} | {_cell(r.get('reason', ''))} |"
        )
    return "\n".join(lines) + "\n"


def write_lms_csv(rows: list[dict[str, str]], path: Path = LMS_CSV) -> None:
    sections = sorted({r["section"] for r in rows})
    table: dict[str, dict[str, str]] = {}
    for r in rows:
        table.setdefault(r["student_id"], {})[r["section"]] = r["score"]
    maxima = {r["section"]: float(r["max_score"]) for r in rows}
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", *sections, "total", "max_total"])
        for student in sorted(table):
            scores = [table[student].get(s, "0") for s in sections]
            total = sum(float(s) for s in scores)
            writer.writerow([student, *scores, f"{total:g}", f"{sum(maxima.values()):g}"])
    os.replace(tmp, path)


def write_all(rows: list[dict[str, str]], sections: list[str], sandbox_note: str) -> None:
    """report.md and grades_lms.csv from the rows of grades.csv."""
    all_sections = sorted({r["section"] for r in rows} | set(sections))
    REPORT.write_text(markdown(rows, all_sections, sandbox_note), encoding="utf-8")
    write_lms_csv(rows)
