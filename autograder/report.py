"""The instructor's report and the LMS table, built from the gradebook alone.

    python -m autograder.report [--db URL]        (or: make grade-report [DB=...])

`make grade` calls :func:`build` when it has graded; after a class graded in shards on several
machines (``make grade SHARD=i/n``), `make grade-report` builds the same files from the
gradebook the shards wrote, whichever machine graded what:

* ``autograder/grades.csv``: one row per student found in ``submitted/`` and per section
  anyone handed in (a row graded earlier and not graded again is kept);
* ``autograder/report.md``: per section, the score distribution and the tests the class
  found hardest (how many graded submissions failed each, hardest first, from the gradebook);
  then one line per student and section with score, status and reason;
* ``autograder/grades_lms.csv``: one row per student, one column per section, and the total:
  the shape learning-management systems import.

A submission of the class that no run has graded yet is listed, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections import Counter
from pathlib import Path

from autograder import course, results, store
from autograder.results import GRADES_CSV, Result

REPORT = course.AUTOGRADER / "report.md"
LMS_CSV = course.AUTOGRADER / "grades_lms.csv"


def hardest_tests(
    section: str, student_ids: list[str], url: str = course.GRADEBOOK_URL
) -> list[tuple[str, int, int]]:
    """(test name, submissions failing it, submissions graded), hardest first."""
    from nbgrader.api import MissingEntry

    failed: Counter[str] = Counter()
    graded: Counter[str] = Counter()
    with course.open_gradebook(url) as gb:
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


def markdown(rows: list[dict[str, str]], sections: list[str], sandbox: str, url: str) -> str:
    lines = [
        "# Grades report",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M')}; sandbox for student code: {sandbox}.",
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
        for test, failed, graded in hardest_tests(section, [r["student_id"] for r in mine], url):
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


def sandbox_note(notes: list[str]) -> str:
    """What the report says of the sandbox, from each row's note."""
    counts = Counter(notes)
    if len(counts) == 1:
        return notes[0]
    return "mixed: " + "; ".join(f"{note} for {n}" for note, n in sorted(counts.items()))


def build(url: str, jobs: list[tuple[str, str]]) -> tuple[list[dict[str, str]], list]:
    """Write grades.csv, report.md and grades_lms.csv for the class ``jobs`` from the
    gradebook at ``url``: (the rows written, the submissions without a grade yet)."""
    stored = store.load_results(url)
    graded = [job for job in jobs if job in stored]
    rows = [
        Result(**{f: stored[job][f] for f in Result.__dataclass_fields__}).row() for job in graded
    ]
    results.write_csv(rows, GRADES_CSV)
    sections = sorted({section for _, section in jobs})
    note = sandbox_note([stored[job]["sandbox"] for job in graded]) if graded else "no grades"
    REPORT.write_text(markdown(rows, sections, note, url), encoding="utf-8")
    write_lms_csv(rows)
    return rows, [job for job in jobs if job not in stored]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="the gradebook's URL (default: autograder/gradebook.db)")
    args = parser.parse_args(argv)
    try:
        url = store.resolve(args.db)
    except store.GradebookError as exc:
        parser.error(str(exc))
    why_not = store.unreachable(url)
    if why_not:
        print(why_not, file=sys.stderr)
        return 2
    jobs = course.class_jobs()
    if not jobs:
        print(f"no class: no <student>/<section>/ folder in {course.SUBMITTED}")
        return 0
    rows, missing = build(url, jobs)
    print(
        f"{len(rows)} of {len(jobs)} submissions graded -> {GRADES_CSV.relative_to(course.ROOT)}"
        f", {REPORT.relative_to(course.ROOT)}, {LMS_CSV.relative_to(course.ROOT)}"
    )
    if missing:
        shown = ", ".join(f"{student}/{section}" for student, section in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        print(
            f"not graded yet: {shown}{more}; run the shard(s) that hold them "
            "(make grade SHARD=i/n, same DB), then make grade-report again"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
