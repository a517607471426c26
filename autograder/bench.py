"""Benchmark `make grade` against plain nbgrader and against bare execution, side by side.

    python -m autograder.bench [--students N] [--jobs N]
                               [--part catalogue|course|both|sections|class]
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

(2) and (4) run three times in turns, each grading with a fresh gradebook: both move by
tenths of their time between runs. It prints the wall times and the ratios the autograder aims
at: plain / ours >= 1.8 and ours / bare <= 1.15, and ours / (4), the strict view (median and
range of the three runs; target <= 1.3); then where grading's time went, step by step
(autograder/stopwatch.py: the steps this grader adds to nbgrader and to running the notebook,
and the run's own start, registration, workers' end and report).

Part 2, the whole course: one class of every section (a complete, a blank and a half-done
student), graded by ``python -m autograder.grade`` with 1 and with 2 jobs, against the floor:
the same autograded notebooks (hidden tests restored, outputs cleared) run in 1 and 2 already
started processes, biggest first. It prints the wall times, the seconds per submission and
grade / floor (target <= 1.3). Your own autograder/ folder is not touched.

Part 3 (``--part sections``), per section: one complete submission graded with one job as
grading runs it (the show-only cells left out, autograder/show_only.py), graded again
running every cell (``--run-all``), graded by plain nbgrader, and the Run-All of the same
notebook in a started process. It prints one table, and the class time it implies.

Part 4 (``--part class``): a class of N students (default 20) x every section, cycling
through complete, blank and half-done answers (140 submissions at the default), graded whole
with 2 jobs and timed; then 20 students hand section 01 in again, and the regrade is timed.
It prints the seconds per submission and the time for 150 students.

Part 5 (``--part hub``): what the course server does after one submission (the final row
and page of that student: report.build_for) against a whole class report, with 10 and with
200 students' results in the gradebook.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from autograder import course, fixtures, runner, stopwatch, worker
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


def _grade(root: Path, *args: str) -> float:
    return _run([sys.executable, "-m", "autograder.grade", *args], root)


def _plain_section(root: Path, section: str, student: str) -> float:
    """``nbgrader autograde`` of one submission with nbgrader's own preprocessors."""
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    folder = root / "plain"
    if not folder.exists():
        folder.mkdir()
        (folder / "nbgrader_config.py").write_text(PLAIN_CONFIG.format(root=str(root)))
    _run([nbgrader, "generate_assignment", section, "--force"], folder)
    return _run([nbgrader, "autograde", section, f"--student={student}", "--force"], folder)


def sections_part() -> dict[str, dict[str, float]]:
    """Part 3: per section, graded as grading runs it, with every cell, by plain nbgrader,
    and the bare Run-All."""
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sections-") as tmp:
        root = copy_course(Path(tmp) / "course")
        student = "demo-complete"
        print(f"\none complete submission per section, one job, {os.cpu_count()} cores")
        for section in course.sections():
            for notebook in course.section_notebooks(section):
                folder = root / "autograder" / "submitted" / student / section
                folder.mkdir(parents=True, exist_ok=True)
                fixtures.demo_class(section, notebook, root=root)[student](
                    folder / f"{notebook}.ipynb"
                )
            row = {}
            _fresh_gradebook(root)
            _grade(root, "--jobs", "1", "--section", section)  # release and warm caches
            row["graded"] = _grade(root, "--jobs", "1", "--section", section, "--force")
            row["run_all_graded"] = _grade(
                root, "--jobs", "1", "--section", section, "--force", "--run-all"
            )
            row["plain"] = _plain_section(root, section, student)
            copies = [str(p) for p in floor_copies(root) if f"/{student}/{section}/" in p]
            row["run_all"] = run_in_started_processes(copies, 1)
            figures[section] = row
            print(
                f"{section}: graded {row['graded']:.1f} s, every cell {row['run_all_graded']:.1f}"
                f" s, plain nbgrader {row['plain']:.1f} s, Run-All {row['run_all']:.1f} s",
                flush=True,
            )
    print(
        "\n| section | graded (show-only left out) | graded, every cell | plain nbgrader "
        "| Run-All (started process) |"
    )
    print("|---|---|---|---|---|")
    for section, row in figures.items():
        print(
            f"| `{section}` | {row['graded']:.1f} s | {row['run_all_graded']:.1f} s | "
            f"{row['plain']:.1f} s | {row['run_all']:.1f} s |"
        )
    total = {k: sum(r[k] for r in figures.values()) for k in next(iter(figures.values()))}
    print(
        f"| one student, every section | {total['graded']:.0f} s | "
        f"{total['run_all_graded']:.0f} s | {total['plain']:.0f} s | {total['run_all']:.0f} s |"
    )
    print(
        f"\n150 students x {len(figures)} sections with one job: "
        f"{150 * total['graded'] / 3600:.1f} h as graded, "
        f"{150 * total['run_all_graded'] / 3600:.1f} h running every cell "
        "(part 4 measures two jobs)"
    )
    return figures


# Part 5: a class of N students' results (a feedback page each) in a scratch course's
# gradebook; what the course server does after one submission (report.build_for) and what a
# class report costs (report.build), both timed. Prints: rows, missing, seconds, seconds.
REPORT_SCALE_SECTION = "01_data_parallel"
REPORT_SCALE_SCRIPT = """
import sys, time
from autograder import course, report, store
from autograder.results import Result

students = int(sys.argv[1])
url = course.GRADEBOOK_URL
with course.open_gradebook(url):
    pass  # nbgrader's tables
with store.exclusive(url):
    store.create_tables(url)
table = store.Results(url)
for i in range(students):
    page = course.FEEDBACK / f"s{i:03d}" / "{section}" / "data_parallel.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("<html><body><p>feedback</p></body></html>")
    result = Result(f"s{i:03d}", "{section}", float(i % 5), 5.0, "graded",
                    str(page.relative_to(course.ROOT)), "every test passed")
    table.save(result, sandbox="on", graded_by="test")
table.close()
start = time.perf_counter()
rows, missing = report.build_for(url, [("s007", "{section}")])
one = time.perf_counter() - start
start = time.perf_counter()
report.build(url, [(f"s{i:03d}", "{section}") for i in range(students)])
whole = time.perf_counter() - start
print(len(rows), len(missing), f"{one:.3f} {whole:.3f}")
""".replace("{section}", REPORT_SCALE_SECTION)


def hub_part(sizes: tuple[int, ...] = (10, 200)) -> dict[int, tuple[float, float]]:
    """Part 5: the course server's work after one submission, beside a class report, at each
    class size: the first must not grow with the class."""
    figures = {}
    print("\nthe course server after one submission (report of that student) and a class "
          "report, by class size:")  # fmt: skip
    for students in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-hub-") as tmp:
            root = copy_course(Path(tmp) / "course")
            done = subprocess.run(
                [sys.executable, "-c", REPORT_SCALE_SCRIPT, str(students)],
                cwd=root, capture_output=True, text=True, env=course.tool_env(),
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(done.stdout + done.stderr)
            one, whole = map(float, done.stdout.split()[2:4])
            figures[students] = (one, whole)
            print(f"{students:4d} students: one student's report {one:.3f} s, the class "
                  f"report {whole:.3f} s", flush=True)  # fmt: skip
    return figures


CLASS_MIX = ("demo-complete", "demo-blank", "demo-half-done")


def class_part(students: int, jobs: int, resubmit: int = 20) -> dict[str, float]:
    """Part 4: a class of ``students`` x every section graded with ``jobs`` jobs, timed, then
    a regrade after ``resubmit`` students (at most the class) hand one section in again."""
    with tempfile.TemporaryDirectory(prefix="bench-class-") as tmp:
        root = copy_course(Path(tmp) / "course")
        count = 0
        for section in course.sections():
            for notebook in course.section_notebooks(section):
                writers = fixtures.demo_class(section, notebook, root=root)
                for i in range(students):
                    folder = root / "autograder" / "submitted" / f"s{i:03d}" / section
                    folder.mkdir(parents=True, exist_ok=True)
                    writers[CLASS_MIX[i % len(CLASS_MIX)]](folder / f"{notebook}.ipynb")
                    count += 1
        print(f"\na class of {students} students x {len(course.sections())} sections = "
              f"{count} submissions, {jobs} jobs, {os.cpu_count()} cores", flush=True)  # fmt: skip
        took = _grade(root, "--jobs", str(jobs))
        per = took / count
        print(f"graded in {took:.1f} s: {per:.2f} s per submission", flush=True)
        # students hand section 01 in again (a changed notebook): only they are regraded
        changed, section = 0, course.sections()[0]
        for i in range(min(resubmit, students)):
            folder = root / "autograder" / "submitted" / f"s{i:03d}" / section
            for path in folder.glob("*.ipynb"):
                nb = nbformat.read(path, as_version=4)
                nb.cells.append(nbformat.v4.new_markdown_cell("resubmitted"))
                nbformat.write(nb, path)
                changed += 1
        again = _grade(root, "--jobs", str(jobs))
        print(
            f"{changed} resubmissions of {section} regraded in {again:.1f} s "
            f"({again / max(1, changed):.2f} s each, the other {count - changed} kept)",
            flush=True,
        )
        hours = 150 * len(course.sections()) * per / 3600
        print(
            f"\n150 students x {len(course.sections())} sections at {per:.2f} s each "
            f"({jobs} jobs): {hours:.2f} h"
        )
        return {"class": took, "per": per, "again": again}


CATALOGUE_FLOOR_TARGET = 1.3


def catalogue(students: int, jobs: int, repeat: int = 3) -> None:
    """Part 1: the catalogue class against plain nbgrader and bare execution."""
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        root = copy_course(Path(tmp) / "course")
        cases.install(root)
        _run([sys.executable, "-m", "autograder.release", cases.SECTION], root)
        names = make_class(root, students)
        print(f"{len(names)} submissions of {cases.SECTION}, {os.cpu_count()} cores", flush=True)

        plain_s = plain_nbgrader(root, names)
        print(f"plain nbgrader autograde, sequential:  {plain_s:7.1f} s", flush=True)
        bare_s = bare_execution(root, names, jobs)
        print(f"bare jupyter execute, {jobs} at a time:    {bare_s:7.1f} s", flush=True)
        # make grade and the floor, in turns: both move by tenths between runs on one machine
        grades, floors, steps = [], [], []
        for turn in range(repeat):
            _fresh_gradebook(root)
            grades.append(_grade(root, "--jobs", str(jobs)))
            steps = stopwatch.read(root / "autograder" / ".work" / worker.TIMINGS)
            floors.append(bare_kernels(root, names, jobs))
            print(
                f"run {turn + 1} of {repeat}: make grade, {jobs} jobs {grades[-1]:5.1f} s; bare "
                f"kernels in {jobs} started processes {floors[-1]:5.1f} s "
                f"({grades[-1] / floors[-1]:.2f}x)",
                flush=True,
            )
        ours_s = statistics.median(grades)
        ratios = sorted(g / f for g, f in zip(grades, floors, strict=True))
        print(
            f"\nmake grade is {plain_s / ours_s:.2f}x faster than plain nbgrader (target >= 1.8)"
            f"\nmake grade takes {ours_s / bare_s:.2f}x the bare execution time (target <= 1.15)"
            f"\nmake grade takes {statistics.median(ratios):.2f}x the time of bare kernels in "
            f"started processes, the median of {repeat} runs ({ratios[0]:.2f}-{ratios[-1]:.2f}x; "
            f"target <= {CATALOGUE_FLOOR_TARGET}; no per-notebook start-up: the strictest "
            "baseline)"
        )
        print_steps(steps, grades[-1], floors[-1], jobs)


def print_steps(lines: list[dict], grade_s: float, floor_s: float, jobs: int) -> None:
    """Where make grade's time went (autograder.stopwatch), and what it adds to the floor."""
    run = next((line["run"] for line in lines if "run" in line), {})
    total = stopwatch.totals(lines)
    added = sum(total[name] for name in stopwatch.ADDED)
    count = sum("seconds" in line for line in lines)
    print(f"\nwhere the time went, summed over {count} submissions in {jobs} workers:")
    print(stopwatch.table(lines))
    outside = grade_s - run.get("main", grade_s)
    print(
        f"\nthe run itself: {outside:.1f} s before main (the interpreter, imports), "
        f"{run.get('prepare', 0):.1f} s registering the sections while the workers start, "
        f"{run.get('submissions', 0):.1f} s from the first submission to the last, "
        f"{run.get('close', 0):.1f} s ending the workers and the zygote, "
        f"{run.get('report', 0):.1f} s the report"
    )
    print(
        f"the steps this grader adds ({', '.join(stopwatch.ADDED)}) cost {added:.2f} s of "
        f"worker time, {added / jobs:.2f} s of wall time with {jobs} jobs: "
        f"{added / jobs / floor_s:.1%} of the floor"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=24, help="catalogue submissions")
    parser.add_argument("--jobs", type=int, default=2, help="parallel jobs (the most, part 2)")
    parser.add_argument(
        "--part",
        choices=("catalogue", "course", "both", "sections", "class", "hub"),
        default="both",
        help="what to time",
    )
    args = parser.parse_args(argv)
    if args.part in ("catalogue", "both"):
        catalogue(args.students, args.jobs)
    if args.part in ("course", "both"):
        whole_course(list(range(1, args.jobs + 1)))
    if args.part == "sections":
        sections_part()
    if args.part == "hub":
        hub_part()
    if args.part == "class":
        class_part(20 if args.students == 24 else args.students, args.jobs)
    return 0


if __name__ == "__main__":
    # Through the package, so that worker processes find the functions they are sent.
    from autograder.bench import main as bench_main

    sys.exit(bench_main())
