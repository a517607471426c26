"""Grade every submission in autograder/submitted/ with nbgrader.

    python -m autograder.grade [--section S] [--student ID] [--jobs N]

Submissions are laid out as ``autograder/submitted/<student_id>/<section>/<notebook>.ipynb``.
Every student found there gets one row in ``autograder/grades.csv`` for each section that
anyone handed in (or for ``--section``), whatever happened: ``graded``, ``missing`` (no
notebook: 0 points), or ``error: ...`` with the reason (the points of the tests that ran
before a kernel death or a timeout still count). One feedback page per student, section and
notebook lands in ``autograder/feedback/``.

A broken submission never stops the run, and no submitted file is changed: nbgrader reads a
private copy under ``autograder/.work/``. The exit status is 0 whenever grading finished,
whatever the scores; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import csv
import html
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder import course
from autograder.nbgrader_plugins import KERNEL_DIED

GRADES_CSV = course.AUTOGRADER / "grades.csv"
CSV_FIELDS = ["student_id", "section", "score", "max_score", "status", "feedback"]
# Relative to the course root; nbgrader joins these onto it.
STAGED_SUBMISSIONS = "autograder/.work/submitted"
RELEASE_SCRATCH = "autograder/.work/release"


@dataclass
class Result:
    student_id: str
    section: str
    score: float
    max_score: float
    status: str
    feedback: str  # path of the feedback page(s), relative to the course root

    def row(self) -> dict[str, str]:
        return {
            "student_id": self.student_id,
            "section": self.section,
            "score": f"{self.score:g}",
            "max_score": f"{self.max_score:g}",
            "status": self.status,
            "feedback": self.feedback,
        }


def _gradebook():
    from nbgrader.api import Gradebook

    config_db = f"sqlite:///{course.AUTOGRADER / 'gradebook.db'}"
    return Gradebook(config_db)


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
        return f"{notebook.name} is not a valid notebook ({first_line[:120]})"
    return None


def _execution_problems(notebook: Path) -> list[str]:
    """Kernel deaths and cell timeouts recorded in an autograded notebook."""
    nb = nbformat.read(notebook, as_version=4)
    problems = []
    for index, cell in enumerate(nb.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        where = f"cell {index + 1}" + (f" ({grade_id})" if grade_id else "")
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            if output.get("ename") == KERNEL_DIED and "while running this cell" in output.get(
                "evalue", ""
            ):
                problems.append(f"kernel died in {where}")
            elif output.get("ename") == "CellTimeoutError":
                problems.append(f"timeout in {where}")
    return problems


def _last_error_line(log: str) -> str:
    lines = [line for line in log.splitlines() if "[ERROR]" in line or "Error" in line]
    return (lines[-1] if lines else (log.strip().splitlines() or ["no output"])[-1])[:200]


def grade_one(student_id: str, section: str, section_max: float) -> Result:
    notebooks = course.section_notebooks(section)
    submitted = course.SUBMITTED / student_id / section
    present = [nb for nb in notebooks if (submitted / f"{nb}.ipynb").is_file()]
    absent = [nb for nb in notebooks if nb not in present]
    feedback_pages: list[str] = []
    problems: list[str] = []

    for nb in absent:
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
    valid = []
    for nb in present:
        problem = _problems_in(submitted / f"{nb}.ipynb")
        if problem:
            problems.append(problem)
            feedback_pages.append(_write_page(student_id, section, nb, problem + ". It scores 0."))
        else:
            valid.append(nb)

    if not valid:
        if present:
            status = "error: " + "; ".join(problems)
        else:
            found = sorted(p.name for p in submitted.glob("*.ipynb")) if submitted.is_dir() else []
            status = "missing" + (f" (found {', '.join(found)}: wrong name)" if found else "")
        return Result(student_id, section, 0.0, section_max, status, " ".join(feedback_pages))

    # nbgrader reads a private copy: whatever it or the student's code does, the submitted
    # folder stays as it was.
    staged = course.ROOT / STAGED_SUBMISSIONS / student_id / section
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for item in submitted.iterdir():
        if item.suffix == ".ipynb" and item.stem not in valid:
            continue
        if item.is_file():
            shutil.copy2(item, staged / item.name)
    with _gradebook() as gb:  # no stale grades from an earlier run may survive a failure
        try:
            gb.remove_submission(section, student_id)
        except Exception:
            pass

    done = course.nbgrader(
        "autograde",
        section,
        f"--student={student_id}",
        "--force",
        f"--CourseDirectory.submitted_directory={STAGED_SUBMISSIONS}",
    )
    autograded = course.AUTOGRADED / student_id / section
    if done.returncode != 0 or not all((autograded / f"{nb}.ipynb").is_file() for nb in valid):
        reason = f"nbgrader could not grade it: {_last_error_line(done.stdout + done.stderr)}"
        for nb in valid:
            feedback_pages.append(_write_page(student_id, section, nb, reason + ". It scores 0."))
        return Result(
            student_id, section, 0.0, section_max, "error: " + reason, " ".join(feedback_pages)
        )

    for nb in valid:
        problems.extend(_execution_problems(autograded / f"{nb}.ipynb"))
    with _gradebook() as gb:
        score = float(gb.find_submission(section, student_id).score)

    feedback = course.nbgrader("generate_feedback", section, f"--student={student_id}", "--force")
    for nb in valid:
        page = course.FEEDBACK / student_id / section / f"{nb}.html"
        if feedback.returncode == 0 and page.is_file():
            feedback_pages.append(str(page.relative_to(course.ROOT)))
        else:
            problems.append(f"no feedback page for {nb}")
    status = "graded" if not problems else "error: " + "; ".join(problems)
    return Result(student_id, section, score, section_max, status, " ".join(feedback_pages))


def students(only: str | None) -> list[str]:
    if not course.SUBMITTED.is_dir():
        return []
    found = sorted(
        p.name for p in course.SUBMITTED.iterdir() if p.is_dir() and not p.name.startswith(".")
    )
    return [s for s in found if only is None or s == only]


def write_csv(results: list[Result], path: Path, *, keep_others: bool) -> None:
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
    args = parser.parse_args(argv)
    all_sections = course.sections()
    if args.section and args.section not in all_sections:
        parser.error(f"no section {args.section!r}; sections are: {', '.join(all_sections)}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
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
    register_sections(sections)
    maxima = {section: max_score(section) for section in sections}
    jobs = [(student, section) for student in who for section in sections]

    def run(job: tuple[str, str]) -> Result:
        student, section = job
        try:
            return grade_one(student, section, maxima[section])
        except Exception as exc:  # one submission must never stop the class
            return Result(
                student,
                section,
                0.0,
                maxima[section],
                f"error: autograder failure ({type(exc).__name__}: {exc})",
                "",
            )

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run, jobs))
    write_csv(results, GRADES_CSV, keep_others=bool(args.section or args.student))

    width = max(len(r.student_id) for r in results)
    for r in results:
        print(f"{r.student_id:{width}s}  {r.section}  {r.score:5g} / {r.max_score:g}  {r.status}")
    print(
        f"graded {len(results)} submissions in {time.perf_counter() - start:.1f} s "
        f"-> {GRADES_CSV.relative_to(course.ROOT)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
