"""Grade every submission in autograder/submitted/ with nbgrader.

    python -m autograder.grade [--section S] [--student ID[,ID...]] [--jobs N] [--cell-timeout S]
                               [--no-sandbox] [--db URL] [--shard i/n]

Submissions are laid out as ``autograder/submitted/<student_id>/<section>/<notebook>.ipynb``.
Every student found there gets one row in ``autograder/grades.csv`` for each section that
anyone handed in (or for ``--section``), whatever happened: ``graded``, ``missing`` (no
notebook: 0 points), or ``error: ...`` with the reason (the points of the tests that ran
before a kernel death or a timeout still count), and a ``reason`` an instructor can read.
One feedback page per student, section and notebook lands in ``autograder/feedback/``;
``autograder/report.md`` summarizes the class and ``autograder/grades_lms.csv`` is the table
an LMS imports.

Grading runs in ``--jobs`` worker processes that each keep nbgrader loaded, and student code
runs in a sandbox (:mod:`autograder.sandbox`) when the machine allows it. A broken submission
never stops the run, and no submitted file is changed: nbgrader reads a private copy under
``autograder/.work/``. A run that is killed resumes where it stopped when started again with
the same arguments. The exit status is 0 whenever grading finished, whatever the scores;
2 for bad arguments or a gradebook that cannot be reached.

Several machines grade one class together against one gradebook (``--db
postgresql://...``): ``--shard i/n`` grades share i of n of the (student, section)
submissions, balanced by each section's expected cost (:mod:`autograder.shards`), and leaves
grades.csv and the report to ``python -m autograder.report`` once every shard is done.

This module is the class run (arguments, the workers, the progress bar); grading one
submission is :mod:`autograder.worker`, resuming a killed run :mod:`autograder.resume`,
grades.csv :mod:`autograder.results`, and their words :mod:`autograder.outcomes`; the
gradebook, where each result is stored once, :mod:`autograder.store`, the report
:mod:`autograder.report`.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, replace
from pathlib import Path

from tqdm import tqdm

from autograder import (
    class_settings,
    course,
    filing,
    kernels,
    overrides,
    release,
    report,
    resume,
    roster,
    sandbox,
    shards,
    stopwatch,
    store,
    worker,
    zygote,
)
from autograder.outcomes import MISSING
from autograder.results import GRADES_CSV, Result
from autograder.results import category as results_category
from autograder.resume import RunState
from autograder.shards import Shard

# One line on stderr, rewritten after each submission; the ETA is the mean time per
# submission graded in this run (smoothing=0: grading times vary too much for a moving rate).
PROGRESS_FORMAT = (
    "{desc} [{bar:24}] {n_fmt}/{total_fmt}  {elapsed} elapsed, ~{remaining} left{postfix}"
)


def register_sections(
    sections: list[str], settings: worker.Settings, student_ids: list[str]
) -> dict[str, float]:
    """Record each section's graded cells, the students and our results table in the
    gradebook; return each section's maximum score. One class run at a time does this, on
    any machine (:func:`autograder.store.exclusive`).

    The student notebooks go to the run's scratch folder, so grading never rewrites notebooks/.
    """
    with store.exclusive(settings.db_url):
        store.create_tables(settings.db_url)  # here, not in two workers at once
        release.generate_assignment(
            sections, release_dir=settings.release_dir, db_url=settings.db_url
        )
        store.add_students(settings.db_url, student_ids)
    with course.open_gradebook(settings.db_url) as gb:
        return {section: float(gb.find_assignment(section).max_score) for section in sections}


def _ready() -> None:
    """A job that only makes a worker start (and load nbgrader)."""


def grade_all(
    jobs: list[tuple[str, str]],
    prepare: Callable[[], dict[str, float]],
    settings: worker.Settings,
    workers: int,
    *,
    finished: dict[tuple[str, str], Result],
    keep: Callable[[Result], None],
    log: str,
) -> list[Result]:
    """Grade the ``jobs`` not ``finished`` (by an interrupted run of the same jobs) in
    ``workers`` processes; worker and kernel logs go to ``log``.

    ``prepare`` (registering the sections; it returns each section's maximum score) runs
    while the workers start. Each result goes to ``keep`` (the gradebook) as soon as it is
    graded.
    """
    finished = dict(finished)
    # The costliest sections first (their measured grading seconds, section_costs.json: the
    # longest-processing-time-first rule), so that no long one is left for the end alone.
    cost = shards.costs_for(sorted({s for _, s in jobs}), shards.load_costs())
    todo = sorted((job for job in jobs if job not in finished), key=lambda job: -cost[job[1]])
    # Sandboxed kernels are forked from a process that has done the imports of the sections
    # to grade, which it does while the workers start.
    sections = sorted({section for _, section in todo})
    warm = (
        zygote.Zygote(log, modules=zygote.modules_for(sections))
        if settings.sandbox and todo
        else None
    )
    with (
        warm or contextlib.nullcontext(),
        _ending_behind(
            ProcessPoolExecutor(
                max_workers=max(1, min(workers, len(todo))),
                mp_context=multiprocessing.get_context("spawn"),
                initializer=worker.init_worker,
                initargs=(settings, log, warm.socket if warm else ""),
            )
        ) as pool,
    ):
        for _ in range(min(workers, len(todo))):
            pool.submit(_ready)
        began = time.perf_counter()
        maxima = prepare()
        RUN_SECONDS["prepare"] = time.perf_counter() - began
        if warm is not None and not warm.ready():
            print(f"kernels start cold: their zygote failed (see {log})")
        pending = {
            pool.submit(worker.grade_safely, student, section, maxima[section]): (student, section)
            for student, section in todo
        }
        progress = _progress_bar(len(jobs), len(finished)) if todo else None
        began = time.perf_counter()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                student, section = pending.pop(future)
                try:
                    result = future.result()
                except Exception as exc:  # a worker that died (it never should)
                    result = worker.failed(student, section, maxima[section], exc)
                keep(result)
                finished[(student, section)] = result
                progress.set_postfix_str(f"{student}/{section}", refresh=False)
                progress.update()
        if progress is not None:
            progress.close()
        RUN_SECONDS["submissions"] = time.perf_counter() - began
        began = time.perf_counter()
    RUN_SECONDS["close"] = time.perf_counter() - began  # the workers and the zygote end
    return [finished[job] for job in jobs]


# The run's own seconds besides the submissions' (autograder.stopwatch has theirs): the
# sections registered while the workers start, the submissions from the first handed to a
# worker to the last graded, the workers and the zygote ending, and the report.
RUN_SECONDS: dict[str, float] = {}


@contextlib.contextmanager
def _ending_behind(pool: ProcessPoolExecutor):
    """``pool`` for a ``with`` block; when the block ends normally (every submission graded)
    the workers end while the report is built, not before it (each takes a few tenths of a
    second to end its interpreter); when it raises, they are stopped and waited for."""
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=False)


def _progress_bar(total: int, done: int) -> tqdm:
    """The progress line on stderr; ``done`` submissions were graded by an earlier run."""
    return tqdm(
        total=total,
        initial=done,
        desc="grading",
        file=sys.stderr,
        bar_format=PROGRESS_FORMAT,
        ascii="-#",
        smoothing=0,
        mininterval=0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", help="grade this section only")
    parser.add_argument(
        "--student",
        action="append",
        default=[],
        help="grade these students only (repeat it, or separate ids with commas)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="submissions graded at once (default: 2)",
    )
    parser.add_argument(
        "--cell-timeout",
        action="append",
        default=[],
        metavar="[SECTION=]S",
        help="seconds a cell may run, for every section or one (default: nbgrader_config.py)",
    )
    parser.add_argument(
        "--no-sandbox", action="store_true", help="run student code without the sandbox"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="regrade every submission, also those whose files, tests, grader and settings "
        "are unchanged since they were graded (make grade FORCE=1)",
    )
    parser.add_argument(
        "--report",
        choices=("class", "graded"),
        default="class",
        help="class: rebuild grades.csv, report.md and the LMS files for the whole class "
        "(default); graded: only the final rows of the submissions named, in "
        ".work/graded_rows.csv, and their pages (the course server; its cost does not grow "
        "with the class)",
    )
    parser.add_argument(
        "--run-all",
        action="store_true",
        help="also run the cells that only show (tagged show-only), as students do "
        "(make grade RUN_ALL=1)",
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        help="the gradebook: postgresql://USER@HOST/DBNAME to grade on several machines "
        "(default: autograder/gradebook.db)",
    )
    parser.add_argument(
        "--shard",
        metavar="i/n",
        help="grade share i of n of the submissions (one per machine; then autograder.report)",
    )
    args = parser.parse_args(argv)
    all_sections = course.sections()
    if args.section and args.section not in all_sections:
        parser.error(f"no section {args.section!r}; sections are: {', '.join(all_sections)}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    timeouts = _parse_timeouts(parser, args.cell_timeout)
    try:
        url = store.resolve(args.db)
        shard = Shard.parse(args.shard) if args.shard else Shard()
    except ValueError as exc:
        parser.error(str(exc))
    wanted = [s.strip() for value in args.student for s in value.split(",") if s.strip()]
    who = [s for s in course.students() if not wanted or s in wanted]
    where = course.SUBMITTED.relative_to(course.ROOT)
    unknown_students = [s for s in wanted if s not in who]
    if unknown_students and who:
        print(f"warning: no folder in {where}/ for {', '.join(map(repr, unknown_students))}")
    if not who:
        print(
            f"nothing to grade: no student folder in {where}/"
            + (f" named {', '.join(map(repr, wanted))}" if wanted else "")
            + f" (expected {where}/<student_id>/<section>/<notebook>.ipynb)"
        )
        return 0
    try:  # the instructor's files are read before grading, not after it
        people = roster.load()
        class_settings.load()
        overrides.load_file()
    except (roster.RosterError, class_settings.SettingsError, overrides.OverrideError) as exc:
        print(f"{exc}\n\nnothing was graded: fix that file, then run the grader again")
        return 2
    # The sections anyone handed in; every student then gets a row for each of them.
    handed_in = course.handed_in()
    sections = [args.section] if args.section else sorted(handed_in & set(all_sections))
    if not sections:
        print(f"nothing to grade: no section folder in {where}/<student_id>/")
        return 0
    why_not = store.unreachable(url)
    if why_not:
        print(why_not, file=sys.stderr)
        return 2

    start = time.perf_counter()
    sandbox_note = _sandbox_note(args.no_sandbox)
    # the first line of every class run: the sandbox, and how each submission is bounded
    bound = f"; bounds: {kernels.bounds_note()}" if sandbox_note == "on" else ""
    print(f"sandbox: {sandbox_note}{bound}")
    for unknown in sorted(handed_in - set(all_sections)):
        print(f"warning: ignoring {where}/*/{unknown}/: no such section in solutions/")
    class_run = [(student, section) for student in who for section in sections]
    for warning in filing.warnings(class_run, people if not wanted else None):
        print(f"warning: {warning.line()}")
    costs = shards.costs_for(sections, shards.load_costs())
    jobs = shards.share(class_run, shard, costs)
    if not shard.whole:
        print(
            f"shard {shard.name}: {len(jobs)} of {len(class_run)} submissions, expected "
            f"{shards.cost(jobs, costs):.0f} of {shards.cost(class_run, costs):.0f} s of grading"
            f" (gradebook {store.redact(url)})"
        )
        if not jobs:
            return 0
    settings = worker.Settings(
        timeouts,
        sandbox_note == "on",
        db_url=url,
        work=shard.work.relative_to(course.ROOT).as_posix(),
        run_all=args.run_all,
    )
    # An unfinished run is known by its arguments (the gradebook's password left out).
    run_key = {"jobs": jobs, "settings": {**asdict(settings), "db_url": store.redact(url)}}
    bearing = {s: {"cell_timeout_s": settings.timeout_for(s, 0), "sandbox": settings.sandbox,
                   **({"run_all": True} if settings.run_all else {})}
               for s in sections}  # fmt: skip
    state = RunState(work=shard.work, keys=resume.grading_keys(sections, bearing))
    table = store.Results(url)
    by = store.graded_by(shard.name)
    run_id, finished = state.start(jobs, run_key, table)
    if finished:
        print(f"resuming an interrupted run: {len(finished)} of {len(jobs)} already graded")
    kept = {} if args.force else state.unchanged(table, set(jobs) - set(finished))
    if kept:
        print(
            f"{len(kept)} of {len(jobs)} submissions kept as graded before: their files, "
            "the section's tests, the grader and the settings are unchanged "
            "(make grade FORCE=1 regrades them)"
        )
    finished = {**kept, **finished}

    def keep(result: Result) -> None:
        job = (result.student_id, result.section)
        digest = state.digest(job)
        busy = resume.busy_timeout(result)
        if busy:  # said in the reason, and graded again by the next run (no digest matches)
            result, digest = replace(result, reason=f"{result.reason}; {busy}"), ""
        table.save(result, sandbox=sandbox_note, graded_by=by, digest=digest, run_id=run_id)

    def prepare() -> dict[str, float]:
        maxima = register_sections(sections, settings, course.students())
        # a regrade removes the submission from nbgrader's tables, manual scores included
        overrides.copy_formgrader_scores(url, jobs)
        return maxima

    try:
        log = str(shard.work / "grading.log")
        (shard.work / worker.TIMINGS).unlink(missing_ok=True)  # this run's steps only
        results = grade_all(
            jobs, prepare, settings, args.jobs, finished=finished, keep=keep, log=log
        )
        state.finish()
    except release.ReleaseError as exc:  # a reference notebook nbgrader cannot release
        print(
            f"{exc}\n\nnothing was graded: fix the reference notebook in solutions/ "
            "(`make release` shows the same error), then run the grader again",
            file=sys.stderr,
        )
        return 2
    finally:
        table.close()

    took = time.perf_counter() - start
    if not shard.whole:
        _print_final_scores(results, [])  # autograded only: the final scores need every shard
        db = f" DB={store.redact(url)}" if args.db else ""
        print(
            f"shard {shard.name}: graded {len(results)} submissions in {took:.1f} s; "
            f"when every shard is done: make grade-report{db}"
        )
        return 0
    if args.report == "graded":
        rows, _ = report.build_for(url, [(r.student_id, r.section) for r in results])
        _note_run(shard.work, start, took)
        _print_final_scores(results, rows)
        print(
            f"graded {len(results)} submissions in {took:.1f} s -> "
            f"{report.LAST_RUN_ROWS.relative_to(course.ROOT)} (the class's grades.csv and "
            "report.md: make grade-report)"
        )
        return 0
    rows, missing = report.build(url, course.class_jobs())
    _note_run(shard.work, start, took)
    _print_final_scores(results, rows)
    graded_now = [r for r in results if (r.student_id, r.section) not in finished]
    unchanged = f" ({len(kept)} more kept unchanged)" if kept else ""
    print(
        f"graded {len(graded_now)} submissions in {took:.1f} s{unchanged} "
        f"-> {GRADES_CSV.relative_to(course.ROOT)}, {report.REPORT.relative_to(course.ROOT)}"
    )
    _print_seconds_per_section(graded_now, took, args.jobs)
    if missing:
        print(
            f"{len(missing)} submission(s) of the class have no grade yet (no run graded "
            f"them): {report.not_graded_words(missing)}; make grade STUDENT=... grades them"
        )
    return 0


def _note_run(work: Path, start: float, graded_by: float) -> None:
    """The run's line of timings.jsonl: RUN_SECONDS, the report, and main's whole time."""
    now = time.perf_counter()
    seconds = {**RUN_SECONDS, "report": now - start - graded_by, "main": now - start}
    try:
        stopwatch.write_run(work / worker.TIMINGS, seconds)
    except OSError:
        pass


def _print_final_scores(results: list[Result], rows: list[dict[str, str]]) -> None:
    """The closing table: the final score of each submission graded, as grades.csv has it
    (autograded, then scores set by hand and the late penalty: results.final_score)."""
    final = {(r["student_id"], r["section"]): r for r in rows}
    width = max(len(r.student_id) for r in results)
    for r in results:
        row = final.get((r.student_id, r.section))
        score = row["score"] if row else f"{r.score:g}"
        differs = row and float(row["autograded"]) != float(row["score"])
        changed = f" (autograded {row['autograded']})" if differs else ""
        print(f"{r.student_id:{width}s}  {r.section}  {score:>5s} / {r.max_score:g}  {r.status}"
              + changed)  # fmt: skip


def _print_seconds_per_section(results: list[Result], took: float, jobs: int) -> None:
    """Wall seconds per submission graded, by section: the figure to plan a class's grading
    with. A student with nothing for a section costs no grading and is not counted."""
    graded = [r for r in results if results_category(r.status) != MISSING]
    counts: dict[str, int] = {}
    for r in graded:
        counts[r.section] = counts.get(r.section, 0) + 1
    if len(graded) > 1:
        per = took / len(graded)
        skipped = len(results) - len(graded)
        nothing = f"; {skipped} with nothing handed in, not counted" if skipped else ""
        print(
            f"about {per:.1f} s of wall time per submission graded with JOBS={jobs} "
            f"({len(graded)} submissions; {', '.join(f'{n} of {s}' for s, n in counts.items())}"
            f"{nothing})"
        )


def _parse_timeouts(parser: argparse.ArgumentParser, values: list[str]) -> dict[str, int]:
    timeouts = {}
    for value in values:
        section, _, seconds = value.rpartition("=")
        if not seconds.isdigit() or int(seconds) < 1:
            parser.error(f"--cell-timeout {value!r}: expected seconds >= 1, or SECTION=seconds")
        timeouts[section or "*"] = int(seconds)
    return timeouts


def _sandbox_note(disabled: bool) -> str:
    """ "on", or why student code runs without the sandbox."""
    if disabled:
        return "off (--no-sandbox)"
    why_not = sandbox.probe()
    if why_not is None:
        kernels.clean_stale_runtimes()
    return "on" if why_not is None else f"off: {why_not}"


if __name__ == "__main__":
    # Through the package, so that worker processes find the functions they are sent.
    from autograder.grade import main as grade_main

    sys.exit(grade_main())
