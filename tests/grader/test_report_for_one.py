"""The course server's report after one submission (autograder.report.build_for): the final
rows of the students it graded, their pages stamped, nothing else of the class touched, so
that its cost does not grow with the class. The server builds the class's report once the
submissions stop arriving (coursehub/grading_service.py); `make bench-grade PART=hub` times
both at 10 and at 200 students."""

from __future__ import annotations

import csv
import subprocess
import sys

from autograder import bench, fixtures

SECTION = bench.REPORT_SCALE_SECTION

SCRIPT = bench.REPORT_SCALE_SCRIPT


def test_the_servers_report_of_one_student_touches_no_one_else(tmp_path):
    root = fixtures.copy_course(tmp_path / "course")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "12"], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split()[:2] == ["1", "0"], done.stdout
    feedback = root / "autograder" / "feedback"
    rows = list(csv.DictReader((root / "autograder" / ".work" / "graded_rows.csv").open()))
    assert [(r["student_id"], r["score"]) for r in rows] == [("s007", "2")]
    # the whole class's report ran after it in the script: before it only s007's page had
    # a final score; the class report then stamped every page, and wrote grades.csv
    assert (root / "autograder" / "grades.csv").is_file()
    pages = sorted(feedback.glob(f"*/{SECTION}/*.html"))
    assert len(pages) == 12 and all("final-score" in p.read_text() for p in pages)


def test_only_the_graded_students_pages_are_stamped_and_grades_csv_is_left(tmp_path):
    root = fixtures.copy_course(tmp_path / "course")
    script = SCRIPT.split("start = time.perf_counter()\nreport.build(")[0] + "print('ok')\n"
    done = subprocess.run(
        [sys.executable, "-c", script, "12"], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    feedback = root / "autograder" / "feedback"
    stamped = sorted(
        p.parts[-3] for p in feedback.glob(f"*/{SECTION}/*.html") if "final-score" in p.read_text()
    )
    assert stamped == ["s007"]
    assert not (root / "autograder" / "grades.csv").exists()
    assert not (root / "autograder" / "report.md").exists()
