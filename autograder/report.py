"""The instructor's report, grades.csv and the LMS files, built from the gradebook alone.

    python -m autograder.report [--db URL]        (or: make grade-report [DB=...])

`make grade` calls :func:`build` when it has graded; after a class graded in shards on several
machines (``make grade SHARD=i/n``), `make grade-report` builds the same files from the
gradebook the shards wrote, whichever machine graded what:

* ``autograder/grades.csv``: one row per student found in ``submitted/`` and per section
  anyone handed in (a row graded earlier and not graded again is kept). ``score`` is the
  final score: the autograder's (``autograded``) with the scores set by hand
  (:mod:`autograder.overrides`) and the late penalty (:mod:`autograder.class_settings`)
  applied, each said in ``reason``; ``submitted_at`` and ``late`` say when it came;
* ``autograder/report.md``: first the filing warnings (:mod:`autograder.filing`), then per
  section the score distribution (a figure in ``report_figures/``) and per test its
  difficulty, discrimination and flags, hardest first (:mod:`autograder.item_stats`), the
  regrades that
  changed a grade, and one line per student and section with score, status and reason;
  Last, the similar answers (:mod:`autograder.similarity`): pairs of students, and copies of
  the package's functions, for a person to judge;
* the LMS files (:mod:`autograder.exports`), and ``grades_history.csv``: every grade a
  regrade replaced.

A submission of the class that no run has graded yet is listed, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from autograder import (
    class_settings,
    course,
    exports,
    filing,
    item_stats,
    likely_bugs,
    overrides,
    results,
    roster,
    similarity,
    store,
)
from autograder.class_settings import ClassSettings
from autograder.outcomes import MISSING
from autograder.results import GRADES_CSV, Result

REPORT = course.AUTOGRADER / "report.md"
LMS_CSV = exports.LMS_CSV
HISTORY_CSV = course.AUTOGRADER / "grades_history.csv"


def section_scores(
    section: str, student_ids: list[str], url: str = course.GRADEBOOK_URL
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(each test's points, in notebook order; student -> test -> points earned) for the
    graded submissions of ``section`` in nbgrader's gradebook."""
    from nbgrader.api import MissingEntry

    points: dict[str, float] = {}
    scores: dict[str, dict[str, float]] = {}
    with course.open_gradebook(url) as gb:
        for student in student_ids:
            try:
                submission = gb.find_submission(section, student)
            except MissingEntry:
                continue
            mine = scores.setdefault(student, {})
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    if not grade.max_score_gradecell or grade.cell_type != "code":
                        continue
                    points[grade.name] = float(grade.max_score)
                    mine[grade.name] = float(grade.score or 0.0)
    return points, scores


def item_table(section: str, student_ids: list[str], url: str) -> list[str]:
    """The report's table of a section's tests, hardest first: failures, the share passing,
    the discrimination and the flags (autograder.item_stats)."""
    points, scores = section_scores(section, student_ids, url)
    stats = item_stats.item_statistics(scores, points)
    lines = [
        "| test | failed | of graded | share passing | discrimination | flags |",
        "|---|---|---|---|---|---|",
    ]
    for item in sorted(stats, key=lambda i: (i.passed - i.graded, i.test)):
        r = "n/a" if item.discrimination is None else f"{item.discrimination:+.2f}"
        lines.append(
            f"| {item.test} | {item.graded - item.passed} | {item.graded} "
            f"| {item.difficulty:.2f} | {r} | {', '.join(item.flags())} |"
        )
    return lines


def bug_table(rows: list[dict[str, str]]) -> list[str]:
    """The report's table of the named bugs of a section: per exercise and test, each
    catalogued mistake the failures looked like, and how many students (most first)."""
    named = item_stats.named_bugs(r.get("reason", "") for r in rows)
    if not named:
        return []
    exercise = {
        test: cases[0].get("exercise", "")
        for test, cases in likely_bugs.table().get("tests", {}).items()
        if cases
    }
    lines = [
        "Named bugs: the catalogued mistakes the failed tests looked like "
        "(autograder/likely_bugs.py), and how many students each:",
        "",
        "| exercise | test | likely bug | students |",
        "|---|---|---|---|",
    ]
    for test in sorted(named, key=lambda t: (exercise.get(t, ""), t)):
        for label, n in sorted(named[test].items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"| {exercise.get(test, '')} | {test} | {_cell(label)} | {n} |")
    return lines + [""]


def shortcut_list(rows: list[dict[str, str]]) -> list[str]:
    """The report's list of suspected shortcuts of a section, apart from the named bugs: a
    catalogued shortcut named because the answer shows it (autograder/evidence.py), with
    what it shows, for a person to read before anything is said to the student."""
    found = [
        (r, test, label, shows)
        for r in rows
        for test, label, shows in item_stats.suspected_shortcuts([r.get("reason", "")])
    ]
    if not found:
        return []
    lines = [
        f"Suspected shortcuts ({len(found)}): failures that look like a catalogued shortcut "
        "and answers that show one (a person should read them; the student's page says the same):",
        "",
    ]
    for r, test, label, shows in found:
        lines.append(
            f"- {_cell(r['student_id'])}, {test}: {_cell(label)}; the answer holds {_cell(shows)}"
        )
    return lines + [""]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def distribution(rows: list[dict[str, str]]) -> str:
    """One line on a section's scores: median and mean of those who handed something in (a
    missing submission scores 0 but is not a grade of the work), and the statuses."""
    handed_in = [float(r["score"]) for r in rows if results.category(r["status"]) != MISSING]
    statuses = Counter(results.category(r["status"]) for r in rows)
    unknown = sum(r.get("late") == "time unknown" for r in rows)
    late = sum(bool(r.get("late")) for r in rows) - unknown
    parts = [f"{len(rows)} students"]
    if handed_in:
        parts.append(
            f"of the {len(handed_in)} who handed in, score median "
            f"{statistics.median(handed_in):g} of {rows[0]['max_score']}, "
            f"mean {statistics.fmean(handed_in):.1f}"
        )
    parts.append(", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
    if late:
        parts.append(f"{late} late")
    if unknown:
        parts.append(f"{unknown} handed in at an unknown time (not penalised)")
    return "; ".join(parts)


def markdown(
    rows: list[dict[str, str]],
    sections: list[str],
    sandbox: str,
    url: str,
    warnings: list[filing.FilingWarning] = (),
    history: list[dict] = (),
) -> str:
    lines = [
        "# Grades report",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M')}; sandbox for student code: {sandbox}.",
        "",
    ]
    if warnings:
        lines += [
            "## Warnings before zeros",
            "",
            "Filing mistakes that score 0 or grade another file than the one you may expect; "
            "fix the folder and grade again (make grade STUDENT=...):",
            "",
        ]
        lines += [f"- {w.line()}" for w in warnings] + [""]
    for section in sections:
        mine = [r for r in rows if r["section"] == section]
        if not mine:
            continue
        lines += [f"## {section}", "", distribution(mine), ""]
        handed_in = [r for r in mine if results.category(r["status"]) != MISSING]
        if handed_in:
            item_stats.score_figure(
                section,
                [float(r["score"]) for r in handed_in],
                float(mine[0]["max_score"]),
                REPORT.parent / item_stats.FIGURES,
            )
            figure = f"{item_stats.FIGURES}/{section}.png"
            lines += [f"![scores of {section}]({figure})", ""]
        lines += item_table(section, [r["student_id"] for r in mine], url)
        lines += [
            "",
            "Share passing: of the graded submissions, those with the test's full points. "
            "Discrimination: the correlation of the test's score with the rest of the "
            "section's score (negative: stronger students fail it more often; look at it).",
            "",
        ]
        lines += bug_table(handed_in)
        lines += shortcut_list(handed_in)
    if history:
        lines += [
            "## Regrades",
            "",
            f"{len(history)} grade(s) replaced by a later run (all in grades_history.csv):",
            "",
            "| student | section | before | replaced on |",
            "|---|---|---|---|",
        ]
        for h in history[-20:]:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(h["replaced_at"]))
            lines.append(
                f"| {_cell(h['student_id'])} | {h['section']} | {h['score']:g} "
                f"({_cell(h['status'])}) | {when} |"
            )
        lines.append("")
    lines += [
        "## Students",
        "",
        "| student | section | score | late | status | reason |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {_cell(r['student_id'])} | {r['section']} | {r['score']} / {r['max_score']} "
            f"| {r.get('late', '')} | {_cell(r['status'])} | {_cell(r.get('reason', ''))} |"
        )
    return "\n".join(lines + review_list(rows)) + "\n"


def review_list(rows: list[dict[str, str]]) -> list[str]:
    """The report's section of answers a person should read whatever they scored
    (integrity.needs_review: private attributes, frames, child processes, code objects,
    saved-tensor hooks, the recorder, the meter), with their lines."""
    from autograder.integrity import REVIEW_WORDS

    found = [
        (r, part.strip())
        for r in rows
        for part in r.get("reason", "").split(REVIEW_WORDS + ": ")[1:2]
    ]
    if not found:
        return []
    lines = ["", f"## Answers that need a person's review ({len(found)})", "",
             "Lines of graded answer cells that reach into what the tests cannot watch; "
             "a grade does not prove them. Read them whatever they scored:", ""]  # fmt: skip
    for r, part in found:
        hits = part.split("; cell ")
        shown = [hits[0], *(f"cell {h}" for h in hits[1:])]
        lines.append(
            f"- {_cell(r['student_id'])} / {r['section']} ({r['score']} / {r['max_score']}):"
        )
        lines += [f"  - {_cell(h)}" for h in shown]
    return lines


def sandbox_note(notes: list[str]) -> str:
    """What the report says of the sandbox, from each row's note."""
    counts = Counter(notes)
    if len(counts) == 1:
        return notes[0]
    return "mixed: " + "; ".join(f"{note} for {n}" for note, n in sorted(counts.items()))


def finalize(
    rows: list[dict[str, str]],
    url: str,
    settings: ClassSettings,
    warnings: list[filing.FilingWarning] = (),
) -> list[dict[str, str]]:
    """The rows with the scores set by hand and the late penalties applied, in place: the
    grader's own score moves to ``autograded``, and the instructor's notes open ``reason``."""
    decided = overrides.decisions(url)
    jobs = [(r["student_id"], r["section"]) for r in rows]
    autos = overrides.auto_scores(url, [job for job in jobs if job in decided])
    for row, job in zip(rows, jobs, strict=True):
        notes = [  # a blank notebook (a copy graded instead says so in its own note)
            w.words
            for w in warnings
            if w.kind == "blank" and w.where == "/".join(job) and "instead" not in w.words
        ]
        chosen = decided.get(job, [])
        late = None
        if results.category(row["status"]) != MISSING:
            late = settings.lateness(*job)
        final = results.final_score(  # the one place the final score is computed
            float(row["score"]),
            float(row["max_score"]),
            tests=[o for o in chosen if o.test != overrides.TOTAL],
            autos=autos.get(job, {}),
            lateness=late,
            total=overrides.total_of(chosen),
        )
        if late is not None:
            if late.submitted_at is not None:
                when = late.submitted_at.astimezone(settings.timezone)
                row["submitted_at"] = when.isoformat(timespec="minutes")
            row["late"] = late.column()
        row["autograded"] = row["score"]
        row["score"] = f"{final.score:g}"
        row["adjusted"] = "; ".join(final.changes)
        notes += final.changes
        if notes:
            row["reason"] = "; ".join(notes + [row["reason"]] * bool(row["reason"]))
    return rows


def write_history(history: list[dict], path: Path = HISTORY_CSV) -> None:
    fields = ["student_id", "section", "score", "status", "reason", "graded_at", "replaced_at"]
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for h in history:
            stamps = {
                k: dt.datetime.fromtimestamp(h[k], dt.UTC).isoformat(timespec="seconds")
                for k in ("graded_at", "replaced_at")
            }
            writer.writerow({**h, **stamps, "score": f"{h['score']:g}"})
    os.replace(tmp, path)


def build(url: str, jobs: list[tuple[str, str]]) -> tuple[list[dict[str, str]], list]:
    """Write grades.csv, report.md and the LMS files for the class ``jobs`` from the
    gradebook at ``url``: (the rows written, the submissions without a grade yet)."""
    settings = class_settings.load()
    people = roster.load()
    overrides.copy_formgrader_scores(url, jobs)
    table = store.Results(url)
    try:
        stored, history = table.load(), table.history()
    finally:
        table.close()
    graded = [job for job in jobs if job in stored]
    rows = [
        Result(**{f: stored[job][f] for f in Result.__dataclass_fields__}).row() for job in graded
    ]
    warnings = filing.warnings(jobs, people)
    finalize(rows, url, settings, warnings)
    results.write_csv(rows, GRADES_CSV)
    results.stamp_pages(rows)  # the final score on each feedback page, as in grades.csv
    sections = sorted({section for _, section in jobs})
    note = sandbox_note([stored[job]["sandbox"] for job in graded]) if graded else "no grades"
    text = markdown(rows, sections, note, url, warnings, history)
    text += "\n".join(similarity.markdown(similarity.class_flags(graded))) + "\n"
    REPORT.write_text(text, encoding="utf-8")
    exports.write_all(rows, people, settings)
    write_history(history)
    return rows, [job for job in jobs if job not in stored]


LAST_RUN_ROWS = course.WORK / "graded_rows.csv"  # build_for's rows: the course server reads them


def build_for(url: str, jobs: list[tuple[str, str]]) -> tuple[list[dict[str, str]], list]:
    """The final rows of ``jobs`` alone (scores set by hand and late penalties applied), with
    their feedback pages stamped and the rows written to :data:`LAST_RUN_ROWS`: what the
    course server needs after grading one student, at a cost that does not grow with the
    class (grades.csv, report.md, the similarity pairs and the LMS files are the whole
    class's: :func:`build`, which the server runs once the submissions stop arriving).
    Returns (the rows, the jobs without a grade)."""
    settings = class_settings.load()
    people = roster.load()
    overrides.copy_formgrader_scores(url, jobs)
    table = store.Results(url)
    try:
        stored = table.load()
    finally:
        table.close()
    graded = [job for job in jobs if job in stored]
    rows = [
        Result(**{f: stored[job][f] for f in Result.__dataclass_fields__}).row() for job in graded
    ]
    finalize(rows, url, settings, filing.warnings(graded, people))
    results.stamp_pages(rows)
    LAST_RUN_ROWS.parent.mkdir(parents=True, exist_ok=True)
    results.write_csv(rows, LAST_RUN_ROWS)
    return rows, [job for job in jobs if job not in stored]


def not_graded_words(missing: list[tuple[str, str]]) -> str:
    shown = ", ".join(f"{student}/{section}" for student, section in missing[:10])
    more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
    return f"{shown}{more}"


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
    try:
        rows, missing = build(url, jobs)
    except (
        class_settings.SettingsError,
        overrides.OverrideError,
        roster.RosterError,
    ) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(
        f"{len(rows)} of {len(jobs)} submissions graded -> {GRADES_CSV.relative_to(course.ROOT)}"
        f", {REPORT.relative_to(course.ROOT)}, {LMS_CSV.relative_to(course.ROOT)}"
    )
    if missing:
        print(
            f"not graded yet: {not_graded_words(missing)}; run the shard(s) that hold them "
            "(make grade SHARD=i/n, same DB), then make grade-report again"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
