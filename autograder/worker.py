"""Grading one student's section, in a worker process that keeps nbgrader loaded.

:func:`grade_safely` finds the section's notebooks in the student's folder (a notebook handed
in under another name is used if it is the only candidate), stages a private repaired copy
(:mod:`autograder.staging`: the submitted files are never changed), runs nbgrader's autograde
and feedback on it, and returns the row of grades.csv. What happened is collected as
:mod:`autograder.outcomes` records: the ones the execute step wrote into the autograded
notebook, the failed tests from the gradebook, and what this module found itself. Whatever
goes wrong, the result is a row: one submission never stops the class.

What grading one submission depends on (its student and section, its folders, its cell
timeout, its sandbox policy, the gradebook) is fixed before it starts, in one frozen
:class:`Submission` that is passed down. nbgrader reads it as a configuration of its own: each
submission gets a fresh ``NbGraderAPI`` whose configuration is nbgrader_config.py's (loaded
once per worker, never changed) with the submission's settings merged into a copy.
"""

from __future__ import annotations

import copy
import html
import os
import re
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import nbformat
from traitlets.config import Config

from autograder import (
    course,
    evidence,
    filing,
    kernels,
    likely_bugs,
    outcomes,
    sandbox,
    staging,
    stopwatch,
    store,
)
from autograder.results import Result

# Relative to the course root; nbgrader joins these onto it. (A shard's released notebooks
# are in its own scratch folder, Settings.release_dir; the staged copies of different
# submissions never meet.)
WORK = course.WORK.relative_to(course.ROOT).as_posix()  # a whole class run's scratch folder
STAGED_SUBMISSIONS = f"{WORK}/submitted"
RELEASE_SCRATCH = f"{WORK}/release"  # a whole class run's Settings.release_dir
TIMINGS = "timings.jsonl"  # in the run's scratch folder: seconds per step (autograder.stopwatch)


@dataclass(frozen=True)
class Settings:
    """How the workers grade: the same for every submission of a run."""

    cell_timeout_s: dict[str, int]  # section (or "*") -> seconds; else nbgrader_config.py's
    sandbox: bool  # run kernels in autograder.sandbox
    db_url: str = course.GRADEBOOK_URL  # the gradebook (autograder.store.resolve)
    work: str = WORK  # the run's scratch folder (a shard's own), relative to the course root
    run_all: bool = False  # also run the cells tagged show-only (autograder.show_only)

    @property
    def release_dir(self) -> str:
        """Where the run's student notebooks are generated (relative to the course root)."""
        return f"{self.work}/release"

    def timeout_for(self, section: str, configured: int) -> int:
        """Seconds a cell of ``section`` may run: its own, else everyone's, else ``configured``."""
        return self.cell_timeout_s.get(section, self.cell_timeout_s.get("*", configured))


@dataclass(frozen=True)
class Submission:
    """Everything grading one student's section depends on, fixed before it starts."""

    student_id: str
    section: str
    section_max: float
    cell_timeout_s: int  # seconds a cell may run (Settings.timeout_for)
    policy: str  # the JSON of the kernels' autograder.sandbox.Policy; "": no sandbox
    db_url: str  # the gradebook
    submitted: Path  # the student's section folder, never changed
    released: Path  # the section's released notebooks (the run's own)
    staged: Path  # the private, repaired copy nbgrader grades
    autograded: Path  # nbgrader's autograded notebooks of this submission
    feedback: Path  # the feedback pages of this submission
    run_all: bool = False  # run every cell (else autograder.show_only skips what only shows)

    @classmethod
    def of(
        cls,
        settings: Settings,
        student_id: str,
        section: str,
        section_max: float,
        *,
        configured_timeout_s: int,
        zygote: str = "",
    ) -> Submission:
        """The submission of ``student_id``'s ``section`` in a run of ``settings``; a cell
        timeout the run does not set is ``configured_timeout_s``, and sandboxed kernels are
        forked by the ``zygote`` at that socket (empty: they start cold)."""
        autograded = course.AUTOGRADED / student_id / section
        policy = ""
        if settings.sandbox:  # a PostgreSQL gradebook's unix socket is out of the kernel's sight
            database = store.socket_dir(settings.db_url)
            hidden = [database] if database else []
            kernel = sandbox.policy_for(autograded, course.ROOT, also_hidden=hidden)
            kernel.zygote = zygote
            policy = kernel.to_json()
        return cls(
            student_id,
            section,
            section_max,
            cell_timeout_s=settings.timeout_for(section, configured_timeout_s),
            policy=policy,
            db_url=settings.db_url,
            submitted=course.SUBMITTED / student_id / section,
            released=course.ROOT / settings.release_dir / section,
            staged=course.ROOT / STAGED_SUBMISSIONS / student_id / section,
            autograded=autograded,
            feedback=course.FEEDBACK / student_id / section,
            run_all=settings.run_all,
        )

    def nbgrader_config(self, base: Config) -> Config:
        """nbgrader's configuration for this submission: a copy of ``base`` (the course's
        nbgrader_config.py) with this submission's settings; ``base`` is left as it was."""
        config = copy.deepcopy(base)
        config.merge(
            Config(
                {
                    "CourseDirectory": {
                        "submitted_directory": STAGED_SUBMISSIONS,
                        "db_url": self.db_url,
                    },
                    "Execute": {"timeout": self.cell_timeout_s},
                    "SandboxedKernelManager": {"policy": self.policy},
                    "ExecuteUntilKernelDeath": {
                        "show_only_from": "" if self.run_all else str(self.released)
                    },
                }
            )
        )
        return config


_CONFIG = None  # nbgrader_config.py's configuration, loaded once per worker and never changed
_SETTINGS: Settings | None = None
_ZYGOTE = ""  # the socket of the run's autograder.zygote, or "": kernels start cold


def init_worker(settings: Settings, log_path: str, zygote: str = "") -> None:
    """Load nbgrader once per worker; the worker dies with the grader (Linux)."""
    global _CONFIG, _SETTINGS, _ZYGOTE
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
    import nbgrader.apps.api  # noqa: F401 (loaded here, once, not for the first submission)
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course.AUTOGRADER)).load_config()
    course.stamp_in_process()
    _CONFIG = config
    _SETTINGS = settings
    _ZYGOTE = zygote


def failed(student_id: str, section: str, section_max: float, exc: BaseException) -> Result:
    """The row of a submission on which the autograder itself failed."""
    failure = outcomes.AutograderFailure(error=f"{type(exc).__name__}: {exc}")
    return Result.of(student_id, section, score=0.0, max_score=section_max, ended_in=[failure])


def grade_safely(student_id: str, section: str, section_max: float) -> Result:
    """Grade one student's section in this process (a worker): always a row."""
    stopwatch.reset()
    try:
        configured = _CONFIG.Execute.timeout
        job = Submission.of(
            _SETTINGS, student_id, section, section_max, configured_timeout_s=configured,
            zygote=_ZYGOTE,
        )  # fmt: skip
        return grade_one(job)
    except Exception as exc:  # one submission must never stop the class
        return failed(student_id, section, section_max, exc)
    finally:
        try:  # where the time went, for make bench-grade (autograder.stopwatch)
            stopwatch.write(course.ROOT / _SETTINGS.work / TIMINGS, student_id, section)
        except OSError:
            pass


def grade_one(job: Submission) -> Result:
    """Grade ``job`` in this process (a worker)."""
    student_id, section, section_max = job.student_id, job.section, job.section_max
    ended_in: list[outcomes.Outcome] = []
    pages: list[str] = []
    what_file: list[outcomes.Repaired] = []  # which file was graded, when not the named one

    def result(score: float = 0.0) -> Result:
        return Result.of(
            student_id, section, score=score, max_score=section_max, ended_in=ended_in, pages=pages
        )

    with stopwatch.step("stage"):
        graded = _stage(job, ended_in, pages, what_file)
    if not graded:
        return result()
    autograded = job.autograded
    failure, feedback_ok = _autograde(job, graded)
    if failure is None and not job.run_all and _needed_after_all(autograded, graded):
        # an error named what a show-only cell makes: graded again, every cell run
        with course.open_gradebook(job.db_url) as gb:
            try:
                gb.remove_submission(section, student_id)
            except Exception:
                pass
        shutil.rmtree(autograded, ignore_errors=True)
        job = replace(job, run_all=True)
        failure, feedback_ok = _autograde(job, graded)
        ended_in.append(outcomes.Repaired(what=RAN_EVERY_CELL))
    if failure is not None:
        ended_in.append(failure)
        pages += [_write_page(student_id, section, nb, failure.page()) for nb in graded]
        return result()
    with stopwatch.step("read back"), course.open_gradebook(job.db_url) as gb:
        for nb in graded:
            ended_in.append(outcomes.Graded(notebook=nb))
            ended_in += _ran(gb, section, student_id, nb, autograded / f"{nb}.ipynb")
            page = job.feedback / f"{nb}.html"
            if feedback_ok and page.is_file():
                _announce(page, [o.what for o in what_file if o.what.startswith("graded ")])
                pages.append(str(page.relative_to(course.ROOT)))
            else:
                ended_in.append(outcomes.NoFeedback(notebook=nb))
        score = float(gb.find_submission(section, student_id).score)
    return result(score)


def _stage(
    job: Submission,
    ended_in: list[outcomes.Outcome],
    pages: list[str],
    what_file: list[outcomes.Repaired],
) -> list[str]:
    """Find the submission's notebooks, stage the private repaired copy nbgrader grades and
    clear earlier grades: the notebooks to grade (none: nothing to grade). What was found
    goes to ``ended_in``, pages of notebooks not found to ``pages``, and which file was
    graded, when not the one named like the notebook, to ``what_file``."""
    student_id, section = job.student_id, job.section
    sources: dict[str, Path] = {}
    for nb in course.section_notebooks(section):
        found, what = _find(job.submitted, nb, job.released / f"{nb}.ipynb")
        ended_in += what
        what_file += [o for o in what if isinstance(o, outcomes.Repaired)]
        if found is not None:
            sources[nb] = found
        else:  # nothing of this name to grade: a page says why
            pages.append(_write_page(student_id, section, nb, what[-1].page()))
    if not sources:
        return []
    # nbgrader reads a private, repaired copy: the submitted folder stays as it was.
    shutil.rmtree(job.staged, ignore_errors=True)
    try:
        staged = staging.stage(job.submitted, job.staged, sources, job.released)
    except Exception as exc:
        ended_in.append(outcomes.UnreadableCells(error=f"{type(exc).__name__}: {exc}"))
        return []
    ended_in += [outcomes.Repaired(what=note) for note in staged.notes]
    from autograder import integrity  # answers a person should read, whatever they score

    for name in staged.graded:
        review = integrity.needs_review(nbformat.read(job.staged / f"{name}.ipynb", as_version=4))
        ended_in += [outcomes.Repaired(what=review)] if review else []
    # no stale grades from an earlier run may survive
    with course.open_gradebook(job.db_url) as gb:
        try:
            gb.remove_submission(section, student_id)
        except Exception:
            pass
    shutil.rmtree(job.autograded, ignore_errors=True)
    return list(staged.graded)


RAN_EVERY_CELL = (
    "graded running every cell: an error named what a show-only cell makes, so none was left out"
)


def _needed_after_all(autograded: Path, notebooks: list[str]) -> bool:
    from autograder import show_only

    for name in notebooks:
        path = autograded / f"{name}.ipynb"
        if path.is_file() and show_only.needed_after_all(nbformat.read(path, as_version=4)):
            return True
    return False


def _find(submitted: Path, nb: str, released: Path) -> tuple[Path | None, list[outcomes.Outcome]]:
    """The student's readable file of notebook ``nb`` (None: it scores 0), and what was found:
    a renamed file, or why there is none (the last outcome then)."""
    path, what = submitted / f"{nb}.ipynb", []
    if not path.is_file() and submitted.is_dir():
        renamed = staging.find_renamed(submitted, nb, nbformat.read(released, as_version=4))
        if renamed is not None:
            what.append(outcomes.Repaired(what=f"graded {renamed.name} as {nb}.ipynb"))
            path = renamed
    elif path.is_file():
        # the newest answered copy beside a blank notebook (filing.graded_copy says why)
        copy, why = filing.graded_copy(submitted, nb, nbformat.read(released, as_version=4))
        if copy is not None:
            what.append(outcomes.Repaired(what=f"graded {copy.name}: {why}"))
            path = copy
    if not path.is_file():
        found = sorted(p.name for p in submitted.glob("*.ipynb")) if submitted.is_dir() else []
        return None, [*what, outcomes.Missing(notebook=nb, found=tuple(found))]
    invalid = _invalid(path)
    if invalid is not None:
        return None, [*what, outcomes.InvalidNotebook(file=path.name, why=invalid)]
    return path, what


def _invalid(notebook: Path) -> str | None:
    """Why nbgrader cannot grade this file, or None if it is a readable notebook."""
    try:
        nbformat.validate(nbformat.read(notebook, as_version=4))
    except Exception as exc:  # any unreadable file is the student's problem, not ours
        if notebook.stat().st_size == 0:
            return "the file is empty"
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
    return None


def _ran(gb, section: str, student_id: str, nb: str, path: Path) -> list[outcomes.Outcome]:
    """What happened in an autograded notebook: the execute step's records, the failed
    tests (from the gradebook, why from the cell, and the catalogued mistake its error looks
    like: autograder.likely_bugs) and the other cells that raised."""
    notebook = nbformat.read(path, as_version=4)
    grades = gb.find_submission_notebook(nb, section, student_id).grades
    lost = {  # tests the autograder scored (manually graded answers have no auto_score)
        g.name
        for g in grades
        if g.max_score_gradecell and g.auto_score is not None and g.score < g.max_score
    }
    failed = set(lost)
    found: list[outcomes.Outcome] = []
    for index, cell in enumerate(notebook.cells):
        records = outcomes.recorded(cell)
        found += records
        meta = cell.metadata.get("nbgrader", {})
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if meta.get("grade_id") in lost:
            lost.discard(meta["grade_id"])
            labels = [r.label for r in records if r.label]
            why = labels[-1] if labels else (errors[0].get("ename", "") if errors else "")
            likely = None if labels or not errors else likely_bugs.lookup(
                meta["grade_id"], errors[0].get("ename", ""), errors[0].get("evalue", ""),
                failed=failed, section=section,
                evidence=evidence.in_submission(notebook, section, meta["grade_id"]),
            )  # fmt: skip
            said = likely_bugs.reason(likely) if likely else ""
            found.append(outcomes.FailedTest(grade_id=meta["grade_id"], why=why, likely=said))
        elif errors and not any(r.ename for r in records):
            if not course.is_test(cell):
                where = {"cell": index + 1, "grade_id": meta.get("grade_id")}
                found.append(outcomes.CellRaised(**where, ename=errors[0].get("ename", "")))
    found += [outcomes.FailedTest(grade_id=name) for name in sorted(lost)]  # cells not found
    return found


def _autograde(job: Submission, valid: list[str]) -> tuple[outcomes.NbgraderFailed | None, bool]:
    """Run nbgrader's autograde and feedback in this worker: (why it failed, feedback made)."""
    from nbgrader.apps.api import NbGraderAPI

    student_id, section, autograded = job.student_id, job.section, job.autograded
    # nbgrader's own API, configured for this submission alone (under a millisecond to make)
    api = NbGraderAPI(config=job.nbgrader_config(_CONFIG))
    try:
        with stopwatch.step("nbgrader"):
            done = api.autograde(section, student_id, force=True, create=True)
    finally:
        kernels.clean_runtime()  # a kernel that died leaves its sockets behind
    if not done["success"]:  # the whole story goes to the log, the last line to the report
        story = done.get("log", "") + done.get("error", "")
        print(f"autograde {student_id}/{section} failed:\n{story}", file=sys.stderr)
        return outcomes.NbgraderFailed(last_line=_last_error_line(story)), False
    if not all((autograded / f"{nb}.ipynb").is_file() for nb in valid):
        return outcomes.NbgraderFailed(last_line="it wrote no autograded notebook"), False
    with stopwatch.step("page"):
        feedback = api.generate_feedback(section, student_id, force=True)
    return None, bool(feedback["success"])


def _last_error_line(log: str) -> str:
    lines = [
        line
        for line in log.splitlines()
        if ("[ERROR]" in line or "Error" in line) and "see the the above traceback" not in line
    ]
    return (lines[-1] if lines else (log.strip().splitlines() or ["no output"])[-1])[:200]


def _announce(page: Path, notes: list[str]) -> None:
    """Say at the top of a feedback page which file was graded, when it is not the one named
    like the notebook (the student must not have to read the instructor's report for it)."""
    if not notes:
        return
    text = page.read_text(encoding="utf-8")
    body = re.search(r"<body[^>]*>", text)
    if body is None:
        return
    note = "".join(f"<p><b>Note from the autograder:</b> {html.escape(n)}.</p>" for n in notes)
    page.write_text(text[: body.end()] + note + text[body.end() :], encoding="utf-8")


def _write_page(student_id: str, section: str, notebook: str, message: str) -> str:
    """A feedback page of our own, for a notebook nbgrader could not grade."""
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
