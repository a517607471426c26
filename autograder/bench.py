"""Benchmark `make grade` against plain nbgrader and against bare execution, side by side.

    python -m autograder.bench [--students N] [--jobs N] [--part catalogue|course|both]
                                                                   (or: make bench-grade)

Part 1, the catalogue. In a scratch copy of the course, N synthetic submissions of the small
catalogue assignment (autograder/catalogue/: complete, blank and partly wrong answers) are

1. graded by plain nbgrader, one ``nbgrader autograde --student S`` after another (what an
   instructor would otherwise run),
2. graded by ``python -m autograder.grade --jobs J`` (sandbox, integrity checks, feedback
   pages and the report included),
3. executed bare: ``jupyter execute`` of each notebook, J at a time, nothing else;
4. executed in J already started processes, each running notebook after notebook in a fresh
   kernel (the strictest baseline: no start-up cost per notebook at all).

It prints the wall times and the ratios the autograder aims at: plain / ours >= 1.8 and
ours / bare <= 1.15, and ours / (4) for the strict view.

Part 2, the whole course: one class of every section (a complete, a blank and a half-done
student), graded by ``python -m autograder.grade`` with 1 and with 2 jobs, against the floor:
the same autograded notebooks (hidden tests restored, outputs cleared) run in 1 and 2 already
started processes, biggest first. It prints the wall times, the seconds per submission and
grade / floor (target <= 1.3). Your own autograder/ folder is not touched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from autograder import course, fixtures, runner
from autograder.catalogue import cases
from autograder.fixtures import copy_course

VARIANTS = {  # how the synthetic class answers: cycled over the students
    "complete": None,
    "blank": "blank",
    "wrong-mean-square": ("mean_square", cases.WRONG_MEAN_SQUARE),
    "wrong-normalize": ("normalize", cases.WRONG_NORMALIZE),
    "numpy-dot": ("dot", cases.NUMPY_DOT),
}


def _run(command: list[str], cwd: Path) -> float:
    """Seconds ``command`` took; raise with its output if it failed."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=course.tool_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return time.perf_counter() - start


def make_class(root: Path, students: int) -> list[str]:
    """Write ``students`` submissions of the catalogue into ``root``'s submitted/ folder."""
    ctx = cases.Context(root=root, host_port=9)
    names = []
    for i in range(students):
        variant = list(VARIANTS)[i % len(VARIANTS)]
        change = VARIANTS[variant]
        nb = ctx.released() if change == "blank" else ctx.answered()
        if isinstance(change, tuple):
            cases._cell(nb, change[0]).source = change[1]
        name = f"student{i:03d}-{variant}"
        folder = root / "autograder" / "submitted" / name / cases.SECTION
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{cases.NOTEBOOK}.ipynb")
        names.append(name)
    return names


PLAIN_CONFIG = """c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "plain/release"
c.CourseDirectory.submitted_directory = "autograder/submitted"
c.CourseDirectory.autograded_directory = "plain/autograded"
c.CourseDirectory.db_url = "sqlite:///{root}/plain/gradebook.db"
c.Execute.timeout = 120
"""


def plain_nbgrader(root: Path, names: list[str]) -> float:
    """Sequential ``nbgrader autograde`` per student with nbgrader's own preprocessors and a
    gradebook of its own, as nbgrader's documentation runs it."""
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    folder = root / "plain"
    folder.mkdir()
    (folder / "nbgrader_config.py").write_text(PLAIN_CONFIG.format(root=str(root)))
    _run([nbgrader, "generate_assignment", cases.SECTION, "--force"], folder)
    total = 0.0
    for name in names:
        total += _run(
            [nbgrader, "autograde", cases.SECTION, f"--student={name}", "--force"], folder
        )
    return total


def bare_execution(root: Path, names: list[str], jobs: int) -> float:
    """``jupyter execute`` of each submitted notebook (a copy), ``jobs`` at a time."""
    jupyter = str(Path(sys.executable).parent / "jupyter")
    scratch = root / "bare"
    copies = []
    for name in names:
        folder = scratch / name
        folder.mkdir(parents=True)
        source = (
            root / "autograder" / "submitted" / name / cases.SECTION / f"{cases.NOTEBOOK}.ipynb"
        )
        copies.append(shutil.copy2(source, folder))

    def execute(path: str) -> None:
        # --allow-errors: the blank and wrong notebooks fail tests, as in grading
        _run([jupyter, "execute", "--allow-errors", "--inplace", path], Path(path).parent)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(execute, copies))
    return time.perf_counter() - start


def _execute_here(path: str) -> None:
    """Run one notebook in a fresh kernel from this (already started) process."""
    runner.run_file(path, timeout=None, allow_errors=True)


def _quiet() -> None:
    """Kernels' warnings to /dev/null, not over the benchmark's table; the kernels get the
    environment grading gives them (one OpenMP thread unless told otherwise), so that the
    baselines run the notebooks exactly as grading does."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    os.environ.update(course.tool_env())


def bare_kernels(root: Path, names: list[str], jobs: int) -> float:
    """The strictest baseline: ``jobs`` started processes that each run notebook after notebook
    in a fresh kernel (no process start-up per notebook, no nbgrader, no sandbox)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    paths = [
        str(
            shutil.copy2(
                root / "bare" / name / f"{cases.NOTEBOOK}.ipynb", root / "bare" / name / "k.ipynb"
            )
        )
        for name in names
    ]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_quiet) as pool:
        list(pool.map(_execute_here, paths[:jobs]))  # start the processes: not timed
        start = time.perf_counter()
        list(pool.map(_execute_here, paths))
        return time.perf_counter() - start


COURSE_CLASS = ("demo-complete", "demo-blank", "demo-half-done")  # of fixtures.demo_class
COURSE_FLOOR_TARGET = 1.3


def course_class(root: Path) -> int:
    """Write the whole-course class into ``root``'s submitted/ folder: the submission count."""
    count = 0
    for section in course.sections():
        for notebook in course.section_notebooks(section):
            writers = fixtures.demo_class(section, notebook, root=root)
            for student in COURSE_CLASS:
                folder = root / "autograder" / "submitted" / student / section
                folder.mkdir(parents=True, exist_ok=True)
                writers[student](folder / f"{notebook}.ipynb")
            count += len(COURSE_CLASS)
    return count


def _fresh_gradebook(root: Path) -> None:
    """Forget an earlier grading of the scratch course: each timed run starts alike."""
    (root / "autograder" / "gradebook.db").unlink(missing_ok=True)
    for folder in ("autograded", "feedback", ".work"):
        shutil.rmtree(root / "autograder" / folder, ignore_errors=True)


def _ready(_: int = 0) -> None:
    """A job that only makes a worker process start and import what it runs notebooks with."""
    import nbclient  # noqa: F401 (what autograder.runner runs notebooks with)


def run_in_started_processes(paths: list[str], jobs: int) -> float:
    """Seconds to run ``paths`` (biggest first) in ``jobs`` already started processes, each
    notebook in a fresh kernel: no process start-up, no nbgrader, no sandbox."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    order = sorted(paths, key=lambda p: -Path(p).stat().st_size)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_quiet) as pool:
        list(pool.map(_ready, range(jobs)))  # start the processes: not timed
        start = time.perf_counter()
        list(pool.map(_execute_here, order))
        return time.perf_counter() - start


def floor_copies(root: Path) -> list[str]:
    """The autograded notebooks (hidden tests restored) with their outputs cleared, each in a
    folder of its own: what grading executes, without grading."""
    from nbconvert.preprocessors import ClearOutputPreprocessor

    autograded = root / "autograder" / "autograded"
    copies = []
    for path in sorted(autograded.glob("*/*/*.ipynb")):
        target = root / "floor" / path.relative_to(autograded)
        target.parent.mkdir(parents=True, exist_ok=True)
        nb = nbformat.read(path, as_version=4)
        ClearOutputPreprocessor().preprocess(nb, {})
        nbformat.write(nb, target)
        copies.append(str(target))
    return copies


def whole_course(jobs_list: list[int]) -> dict[str, float]:
    """Part 2: grade the whole-course class with each job count and run its floor."""
    figures = {}
    with tempfile.TemporaryDirectory(prefix="bench-course-") as tmp:
        root = copy_course(Path(tmp) / "course")
        count = course_class(root)
        sections = len(course.sections())
        print(
            f"\nwhole course: {count} submissions ({', '.join(COURSE_CLASS)} x {sections} "
            f"sections), {os.cpu_count()} cores",
            flush=True,
        )
        for jobs in jobs_list:
            _fresh_gradebook(root)
            took = _run([sys.executable, "-m", "autograder.grade", "--jobs", str(jobs)], root)
            figures[f"grade {jobs}"] = took
            print(f"make grade, {jobs} job(s):                 {took:7.1f} s", flush=True)
        copies = floor_copies(root)
        if len(copies) != count:
            raise RuntimeError(f"{len(copies)} autograded notebooks for {count} submissions")
        for jobs in jobs_list:
            took = run_in_started_processes(copies, jobs)
            figures[f"floor {jobs}"] = took
            print(f"floor, {jobs} started process(es):        {took:7.1f} s", flush=True)
    print("\n| jobs | make grade | floor | per submission (grade / floor) | grade / floor |")
    print("|---|---|---|---|---|")
    for jobs in jobs_list:
        grade, floor = figures[f"grade {jobs}"], figures[f"floor {jobs}"]
        ratio = grade / floor
        print(
            f"| {jobs} | {grade:.1f} s | {floor:.1f} s | {grade * jobs / count:.1f} / "
            f"{floor * jobs / count:.1f} s | {ratio:.2f}x "
            f"({'meets' if ratio <= COURSE_FLOOR_TARGET else 'misses'} <= {COURSE_FLOOR_TARGET}) |"
        )
    return figures


def catalogue(students: int, jobs: int) -> None:
    """Part 1: the catalogue class against plain nbgrader and bare execution."""
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        root = copy_course(Path(tmp) / "course")
        cases.install(root)
        _run([sys.executable, "-m", "autograder.release", cases.SECTION], root)
        names = make_class(root, students)
        print(f"{len(names)} submissions of {cases.SECTION}, {os.cpu_count()} cores", flush=True)

        plain_s = plain_nbgrader(root, names)
        print(f"plain nbgrader autograde, sequential:  {plain_s:7.1f} s", flush=True)
        ours_s = _run([sys.executable, "-m", "autograder.grade", "--jobs", str(jobs)], root)
        print(f"make grade, {jobs} jobs:                {ours_s:7.1f} s", flush=True)
        bare_s = bare_execution(root, names, jobs)
        print(f"bare jupyter execute, {jobs} at a time:    {bare_s:7.1f} s", flush=True)
        kernels_s = bare_kernels(root, names, jobs)
        print(f"bare kernels in {jobs} started processes: {kernels_s:7.1f} s", flush=True)
        print(
            f"\nmake grade is {plain_s / ours_s:.2f}x faster than plain nbgrader (target >= 1.8)"
            f"\nmake grade takes {ours_s / bare_s:.2f}x the bare execution time (target <= 1.15)"
            f"\nmake grade takes {ours_s / kernels_s:.2f}x the time of bare kernels in started "
            "processes (no per-notebook start-up: the strictest baseline)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=24, help="catalogue submissions")
    parser.add_argument("--jobs", type=int, default=2, help="parallel jobs (the most, part 2)")
    parser.add_argument(
        "--part", choices=("catalogue", "course", "both"), default="both", help="what to time"
    )
    args = parser.parse_args(argv)
    if args.part in ("catalogue", "both"):
        catalogue(args.students, args.jobs)
    if args.part in ("course", "both"):
        whole_course(list(range(1, args.jobs + 1)))
    return 0


if __name__ == "__main__":
    # Through the package, so that worker processes find the functions they are sent.
    from autograder.bench import main as bench_main

    sys.exit(bench_main())
