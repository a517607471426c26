"""Grade every submission in autograder/submitted/ with nbgrader.

    python -m autograder.grade [--section S] [--student ID] [--jobs N] [--cell-timeout S]
                               [--no-sandbox]

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
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from autograder import course, report, staging
from autograder.nbgrader_plugins import KERNEL_DIED, TAMPERED

GRADES_CSV = course.AUTOGRADER / "grades.csv"
CSV_FIELDS = ["student_id", "section", "score", "max_score", "status", "reason", "feedback"]
# Relative to the course root; nbgrader joins these onto it.
STAGED_SUBMISSIONS = "autograder/.work/submitted"
RELEASE_SCRATCH = "autograder/.work/release"
RUN_STATE = course.WORK / "run.json"  # present while a run is unfinished
JOURNAL = course.WORK / "journal.jsonl"  # one line per graded submission of that run
LAST_JOURNAL = course.WORK / "last-run.jsonl"


@dataclass
class Result:
    student_id: str
    section: str
    score: float
    max_score: float
    status: str
    feedback: str  # path of the feedback page(s), relative to the course root
    reason: str = ""  # what the instructor should know: failed tests, repairs, tampering

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


@dataclass
class Settings:
    """How the workers grade: the same for every submission of a run."""

    cell_timeout_s: dict[str, int]  # section (or "*") -> seconds; else nbgrader_config.py's
    sandbox: bool  # run kernels in autograder.sandbox


def _gradebook():
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{course.AUTOGRADER / 'gradebook.db'}")


def register_sections(sections: list[str]) -> None:
    """Record each section's graded cells in the gradebook (nbgrader's generate_assignment).

    The student notebooks go to a scratch folder, so grading never rewrites notebooks/.
    """
    for section in sections:
        done = course.nbgrader(
            "generate_assignment",
            section,
            "--force",
            "--log-level=WARN",
            f"--CourseDirectory.release_directory={RELEASE_SCRATCH}",
        )
        if done.returncode != 0:
            raise RuntimeError(f"cannot register {section} in the gradebook:\n{done.stderr}")


def max_score(section: str) -> float:
    with _gradebook() as gb:
        return float(gb.find_assignment(section).max_score)


def _write_page(student_id: str, section: str, notebook: str, message: str) -> str:
    """A feedback page of our own, for submissions nbgrader could not grade."""
    folder = course.FEEDBACK / student_id / section
    folder.mkdir(parents=True, exist_ok=True)
    page = folder / f"{notebook}.html"
    page.write_text(
        "<!doctype html><meta charset='utf-8'>"
        f"<title>{html.escape(section)}: {html.escape(notebook)}</title>"
        f"<h1>{html.escape(section)} / {html.escape(notebook)}.ipynb</h1>"
        f"<p>Student: {html.escape(student_id)}</p><p><b>{html.escape(message)}</b></p>",
        encoding="utf-8",
    )
    return str(page.relative_to(course.ROOT))


def _problems_in(notebook: Path) -> str | None:
    """Why nbgrader cannot grade this file, or None if it is a readable notebook."""
    try:
        nb = nbformat.read(notebook, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # any unreadable file is the student's problem, not ours
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if notebook.stat().st_size == 0:
            first_line = "the file is empty"
        return f"{notebook.name} is not a valid notebook ({first_line[:120]})"
    return None


def _where(index: int, cell) -> str:
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    return f"cell {index + 1}" + (f" ({grade_id})" if grade_id else "")


def _execution_problems(notebook: Path) -> list[str]:
    """Kernel deaths, cell timeouts and tampering recorded in an autograded notebook."""
    nb = nbformat.read(notebook, as_version=4)
    problems = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            evalue = output.get("evalue", "")
            if output.get("ename") == KERNEL_DIED and "while running this cell" in evalue:
                problems.append(f"kernel died in {_where(index, cell)}")
            elif output.get("ename") == "CellTimeoutError":
                problems.append(f"timeout in {_where(index, cell)}")
            elif output.get("ename") == TAMPERED:
                what = evalue.split("rely on: ", 1)[-1]
                problems.append(f"tampering detected at {_where(index, cell)}: {what}")
                return problems  # later tests say the same
    return problems


def _failures(notebook: Path) -> list[str]:
    """Failed tests and failing ordinary cells of an autograded notebook, in words."""
    nb = nbformat.read(notebook, as_version=4)
    failed, broken = [], []
    for index, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if not errors:
            continue
        meta = cell.metadata.get("nbgrader", {})
        why = {KERNEL_DIED: "kernel died", TAMPERED: "tampering"}.get(errors[-1].get("ename"))
        if meta.get("grade") and not meta.get("solution"):
            failed.append(f"{meta.get('grade_id')} ({why or errors[0].get('ename')})")
        elif why is None:
            broken.append(f"{_where(index, cell)} raised {errors[0].get('ename')}")
    words = []
    if failed:
        words.append("failed " + ", ".join(failed))
    if broken:
        more = f" and {len(broken) - 3} more" if len(broken) > 3 else ""
        words.append("; ".join(broken[:3]) + more)
    return words


def _last_error_line(log: str) -> str:
    lines = [
        line
        for line in log.splitlines()
        if ("[ERROR]" in line or "Error" in line) and "see the the above traceback" not in line
    ]
    return (lines[-1] if lines else (log.strip().splitlines() or ["no output"])[-1])[:200]


# --- the worker processes ---------------------------------------------------------------------

_API = None  # the worker's NbGraderAPI, loaded once
_SETTINGS: Settings | None = None


def _init_worker(settings: Settings, log_path: str) -> None:
    """Load nbgrader once per worker; the worker dies with the grader (Linux)."""
    global _API, _SETTINGS
    try:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    # nbgrader and kernels write their logs here, not over the progress bar.
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.environ["PATH"] = course.tool_env()["PATH"]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from nbgrader.apps.api import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course.AUTOGRADER)).load_config()
    config.CourseDirectory.submitted_directory = STAGED_SUBMISSIONS
    _API = NbGraderAPI(config=config)
    _SETTINGS = settings


def sandbox_policy(workdir: Path):
    """What a kernel grading in ``workdir`` may see (see autograder.sandbox)."""
    import importlib.util

    from autograder import sandbox

    hidden = {course.ROOT}
    visible = {Path(sys.prefix), Path(sys.base_prefix)}
    spec = importlib.util.find_spec("distopt")
    if spec and spec.origin:
        package_parent = Path(spec.origin).resolve().parents[1]  # e.g. <repo>/shared
        visible.add(package_parent)
        if (package_parent.parent / "solutions").is_dir():  # the course's own repository
            hidden.add(package_parent.parent)
    home = Path.home()
    if Path(sys.base_prefix).resolve().is_relative_to(home):
        hidden.add(home)  # e.g. /root/.pyenv: the interpreter stays visible, the rest not
    return sandbox.Policy(
        hidden_roots=sorted(str(p.resolve()) for p in hidden),
        visible=sorted(str(p.resolve()) for p in visible),
        workdir=str(workdir),
    )


def _autograde(student_id: str, section: str, valid: list[str]) -> str | None:
    """Run nbgrader's autograde and feedback in this worker; None, or why it failed."""
    from autograder import sandbox

    autograded = course.AUTOGRADED / student_id / section
    timeouts = _SETTINGS.cell_timeout_s
    timeout = timeouts.get(section, timeouts.get("*"))
    if timeout is not None:
        _API.config.Execute.timeout = timeout
    if _SETTINGS.sandbox:
        os.environ[sandbox.ENV_POLICY] = sandbox_policy(autograded).to_json()
    else:
        os.environ.pop(sandbox.ENV_POLICY, None)
    start = time.perf_counter()
    for attempt in range(3):
        try:
            done = _API.autograde(section, student_id, force=True, create=True)
        finally:
            sandbox.clean_runtime()  # a kernel that died leaves its sockets behind
        story = done.get("log", "") + done.get("error", "")
        # Two workers share one SQLite gradebook; a write that found it locked is retried.
        if done["success"] or "database is locked" not in story:
            break
        time.sleep(1 + attempt)
    graded_s = time.perf_counter() - start
    if not done["success"]:  # the whole story goes to the log, the last line to the report
        print(f"autograde {student_id}/{section} failed:\n{story}", file=sys.stderr)
    if not done["success"] or not all((autograded / f"{nb}.ipynb").is_file() for nb in valid):
        return f"nbgrader could not grade it: {_last_error_line(story)}"
    feedback = _API.generate_feedback(section, student_id, force=True)
    print(
        f"timing {student_id}/{section}: autograde {graded_s:.1f} s, "
        f"feedback {time.perf_counter() - start - graded_s:.1f} s",
        file=sys.stderr,
    )
    return None if feedback["success"] else "no feedback page"


def grade_one(student_id: str, section: str, section_max: float) -> Result:
    """Grade one student's section in this process (a worker)."""
    notebooks = course.section_notebooks(section)
    submitted = course.SUBMITTED / student_id / section
    released_dir = course.ROOT / RELEASE_SCRATCH / section
    feedback_pages: list[str] = []
    problems: list[str] = []
    notes: list[str] = []
    sources: dict[str, Path] = {}

    for nb in notebooks:
        path = submitted / f"{nb}.ipynb"
        if not path.is_file() and submitted.is_dir():
            released = nbformat.read(released_dir / f"{nb}.ipynb", as_version=4)
            renamed = staging.find_renamed(submitted, nb, released)
            if renamed is not None:
                notes.append(f"graded {renamed.name} as {nb}.ipynb")
                path = renamed
        if not path.is_file():
            others = sorted(p.name for p in submitted.glob("*.ipynb")) if submitted.is_dir() else []
            hint = f"; found {', '.join(others)}: rename it to {nb}.ipynb" if others else ""
            problems.append(f"missing {nb}.ipynb{hint}")
            feedback_pages.append(
                _write_page(
                    student_id,
                    section,
                    nb,
                    f"No submission of {nb}.ipynb was found{hint}. It scores 0.",
                )
            )
            continue
        problem = _problems_in(path)
        if problem:
            problems.append(problem)
            feedback_pages.append(_write_page(student_id, section, nb, problem + ". It scores 0."))
        else:
            sources[nb] = path

    if not sources:
        if any(not p.startswith("missing") for p in problems):
            status = "error: " + "; ".join(p for p in problems if not p.startswith("missing"))
        else:
            found = sorted(p.name for p in submitted.glob("*.ipynb")) if submitted.is_dir() else []
            status = "missing" + (f" (found {', '.join(found)}: wrong name)" if found else "")
        return Result(
            student_id,
            section,
            0.0,
            section_max,
            status,
            " ".join(feedback_pages),
            "; ".join(problems),
        )

    # nbgrader reads a private, repaired copy: the submitted folder stays as it was.
    staged_dir = course.ROOT / STAGED_SUBMISSIONS / student_id / section
    shutil.rmtree(staged_dir, ignore_errors=True)
    try:
        staged = staging.stage(submitted, staged_dir, sources, released_dir)
    except Exception as exc:
        reason = f"cannot read the notebook's cells ({type(exc).__name__}: {exc})"[:200]
        return Result(student_id, section, 0.0, section_max, "error: " + reason, "", reason)
    notes += staged.notes
    with _gradebook() as gb:  # no stale grades from an earlier run may survive a failure
        try:
            gb.remove_submission(section, student_id)
        except Exception:
            pass
    autograded = course.AUTOGRADED / student_id / section
    shutil.rmtree(autograded, ignore_errors=True)

    failure = _autograde(student_id, section, staged.graded)
    if failure and failure.startswith("nbgrader"):
        for nb in staged.graded:
            feedback_pages.append(_write_page(student_id, section, nb, failure + ". It scores 0."))
        return Result(
            student_id,
            section,
            0.0,
            section_max,
            "error: " + failure,
            " ".join(feedback_pages),
            failure,
        )
    failures = []
    for nb in staged.graded:
        problems.extend(_execution_problems(autograded / f"{nb}.ipynb"))
        failures.extend(_failures(autograded / f"{nb}.ipynb"))
        page = course.FEEDBACK / student_id / section / f"{nb}.html"
        if failure is None and page.is_file():
            feedback_pages.append(str(page.relative_to(course.ROOT)))
        else:
            problems.append(f"no feedback page for {nb}")
    with _gradebook() as gb:
        score = float(gb.find_submission(section, student_id).score)
    status = "graded" if not problems else "error: " + "; ".join(problems)
    reason = "; ".join([*failures, *notes]) or "every test passed"
    return Result(student_id, section, score, section_max, status, " ".join(feedback_pages), reason)


def _grade_safely(student_id: str, section: str, section_max: float) -> Result:
    try:
        return grade_one(student_id, section, section_max)
    except Exception as exc:  # one submission must never stop the class
        reason = f"autograder failure ({type(exc).__name__}: {exc})"
        return Result(student_id, section, 0.0, section_max, "error: " + reason, "", reason)


# --- the class run ----------------------------------------------------------------------------


def students(only: str | None) -> list[str]:
    if not course.SUBMITTED.is_dir():
        return []
    found = sorted(
        p.name for p in course.SUBMITTED.iterdir() if p.is_dir() and not p.name.startswith(".")
    )
    return [s for s in found if only is None or s == only]


def write_csv(results: list[Result], path: Path, *, keep_others: bool) -> list[dict[str, str]]:
    """Write the CSV; with ``keep_others``, earlier rows not graded this time are kept."""
    rows: dict[tuple[str, str], dict[str, str]] = {}
    if keep_others and path.is_file():
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                rows[(row["student_id"], row["section"])] = row
    for result in results:
        rows[(result.student_id, result.section)] = result.row()
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for key in sorted(rows):
            writer.writerow({k: rows[key].get(k, "") for k in CSV_FIELDS})
    os.replace(tmp, path)
    return [rows[key] for key in sorted(rows)]


class Progress:
    """One line on stderr, rewritten: done/total, elapsed time and an estimate of time left."""

    def __init__(self, total: int, done: int = 0, width: int = 24):
        self.total, self.done, self.width = total, done, width
        self.start = time.perf_counter()
        self.graded_here = 0

    def update(self, last: str) -> None:
        self.done += 1
        self.graded_here += 1
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.graded_here * (self.total - self.done)
        filled = round(self.width * self.done / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        line = (
            f"\rgrading [{bar}] {self.done}/{self.total}  {_clock(elapsed)} elapsed, "
            f"~{_clock(left)} left  ({last})"
        )
        sys.stderr.write(line[:160].ljust(100))
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _resume(jobs: list[tuple[str, str]], run_key: dict) -> dict[tuple[str, str], Result]:
    """Results an interrupted run with the same arguments already journaled (unchanged files)."""
    if not (RUN_STATE.is_file() and JOURNAL.is_file()):
        RUN_STATE.unlink(missing_ok=True)
        JOURNAL.unlink(missing_ok=True)
        return {}
    if json.loads(RUN_STATE.read_text()) != json.loads(json.dumps(run_key)):  # tuples: lists
        JOURNAL.unlink()
        return {}
    done = {}
    for line in JOURNAL.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill
        key = (entry["student_id"], entry["section"])
        if key in jobs and entry["digest"] == staging.digest(course.SUBMITTED / key[0] / key[1]):
            done[key] = Result(**entry["result"])
    return done


def _journal(result: Result) -> None:
    entry = {
        "student_id": result.student_id,
        "section": result.section,
        "digest": staging.digest(course.SUBMITTED / result.student_id / result.section),
        "result": asdict(result),
    }
    with JOURNAL.open("a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _ready() -> None:
    """A job that only makes a worker start (and load nbgrader)."""


def grade_all(
    jobs: list[tuple[str, str]],
    prepare: Callable[[], dict[str, float]],
    settings: Settings,
    workers: int,
    run_key: dict,
) -> list[Result]:
    """Grade ``jobs`` in ``workers`` processes; resume an interrupted run of the same jobs.

    ``prepare`` (registering the sections; it returns each section's maximum score) runs
    while the workers start.
    """
    import multiprocessing

    course.WORK.mkdir(parents=True, exist_ok=True)
    finished = _resume(jobs, run_key)
    RUN_STATE.write_text(json.dumps(run_key))
    if finished:
        print(f"resuming an interrupted run: {len(finished)} of {len(jobs)} already graded")
    # The sections with the most cells first, so that no long one is left for the end alone.
    size = {
        s: sum(len(p.read_bytes()) for p in (course.SOLUTIONS / s).glob("*.ipynb")) for _, s in jobs
    }
    todo = sorted((job for job in jobs if job not in finished), key=lambda job: -size[job[1]])
    progress = Progress(len(jobs), len(finished))
    with ProcessPoolExecutor(
        max_workers=max(1, min(workers, len(todo))),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(settings, str(course.WORK / "grading.log")),
    ) as pool:
        for _ in range(min(workers, len(todo))):
            pool.submit(_ready)
        maxima = prepare()
        pending = {
            pool.submit(_grade_safely, student, section, maxima[section]): (student, section)
            for student, section in todo
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                student, section = pending.pop(future)
                try:
                    result = future.result()
                except Exception as exc:  # a worker that died (it never should)
                    reason = f"autograder failure ({type(exc).__name__}: {exc})"
                    result = Result(
                        student, section, 0.0, maxima[section], "error: " + reason, "", reason
                    )
                _journal(result)
                finished[(student, section)] = result
                progress.update(f"{student}/{section}")
    if todo:
        progress.close()
    if JOURNAL.is_file():
        os.replace(JOURNAL, LAST_JOURNAL)
    RUN_STATE.unlink(missing_ok=True)
    return [finished[job] for job in jobs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", help="grade this section only")
    parser.add_argument("--student", help="grade this student only")
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
    args = parser.parse_args(argv)
    all_sections = course.sections()
    if args.section and args.section not in all_sections:
        parser.error(f"no section {args.section!r}; sections are: {', '.join(all_sections)}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    timeouts = _parse_timeouts(parser, args.cell_timeout)
    who = students(args.student)
    where = course.SUBMITTED.relative_to(course.ROOT)
    if not who:
        print(
            f"nothing to grade: no student folder in {where}/"
            + (f" named {args.student!r}" if args.student else "")
            + f" (expected {where}/<student_id>/<section>/<notebook>.ipynb)"
        )
        return 0
    # The sections anyone handed in; every student then gets a row for each of them.
    handed_in = {
        p.name for s in students(None) for p in (course.SUBMITTED / s).iterdir() if p.is_dir()
    }
    for unknown in sorted(handed_in - set(all_sections)):
        print(f"warning: ignoring {where}/*/{unknown}/: no such section in solutions/")
    sections = [args.section] if args.section else sorted(handed_in & set(all_sections))
    if not sections:
        print(f"nothing to grade: no section folder in {where}/<student_id>/")
        return 0

    start = time.perf_counter()
    sandbox_note = _sandbox_note(args.no_sandbox)
    print(f"sandbox: {sandbox_note}")
    jobs = [(student, section) for student in who for section in sections]
    settings = Settings(timeouts, sandbox_note == "on")
    run_key = {"jobs": jobs, "settings": asdict(settings)}

    def prepare() -> dict[str, float]:
        register_sections(sections)
        return {section: max_score(section) for section in sections}

    results = grade_all(jobs, prepare, settings, args.jobs, run_key)
    rows = write_csv(results, GRADES_CSV, keep_others=bool(args.section or args.student))
    report.write_all(rows, sections, sandbox_note)

    width = max(len(r.student_id) for r in results)
    for r in results:
        print(f"{r.student_id:{width}s}  {r.section}  {r.score:5g} / {r.max_score:g}  {r.status}")
    print(
        f"graded {len(results)} submissions in {time.perf_counter() - start:.1f} s "
        f"-> {GRADES_CSV.relative_to(course.ROOT)}, {report.REPORT.relative_to(course.ROOT)}"
    )
    return 0


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
    from autograder import sandbox

    why_not = sandbox.probe()
    if why_not is None:
        sandbox.clean_stale_runtimes()
    return "on" if why_not is None else f"off: {why_not}"


if __name__ == "__main__":
    # Through the package, so that worker processes find the functions they are sent.
    from autograder.grade import main as grade_main

    sys.exit(grade_main())
