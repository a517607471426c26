"""The instructor's loop on a small class of the catalogue assignment (three tests, 5 points):
collect a Canvas and a Moodle download through a roster, warn about filing mistakes before
they grade as zeros, deadlines with an extension and a late penalty, scores set by hand in
nbgrader's formgrader and in overrides.csv that survive a regrade, a regrade kept in the
history, and the gradebook files Canvas and Moodle import.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import json
import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from autograder import collect, fixtures, report, results
from autograder.catalogue import cases
from autograder.course import gradebook_url, open_gradebook
from tests.grader import lms_downloads as lms
from tests.helpers import ROOT, run_module

SECTION, NOTEBOOK = cases.SECTION, cases.NOTEBOOK
TZ = dt.timezone(dt.timedelta(hours=2))
DUE = dt.datetime(2026, 10, 14, 23, 59, tzinfo=TZ)
BUILT = DUE + dt.timedelta(days=4)  # the downloads are made after the deadline
ROSTER = """\
student_id,name,lms_id,login,email,sis_id
alice,Alice Martin,101,amartin,alice@uni.example,S-1
bob,Bob Okafor,102,bokafor,bob@uni.example,S-2
carol,Carol Díaz,555,cdiaz,carol@uni.example,S-3
dave,Dave Lee,104,dlee,dave@uni.example,S-4
erin,Erin Wu,105,ewu,erin@uni.example,S-5
frank,Frank Ito,106,fito,frank@uni.example,S-6
grace,Grace Hall,107,ghall,grace@uni.example,S-7
"""
CLASS_TOML = f"""\
timezone = "Etc/GMT-2"
[due]
{SECTION} = 2026-10-14T23:59:00
[extensions]
carol = {{ {SECTION} = 2026-10-17T23:59:00 }}
[late]
grace_minutes = 10
penalty_per_day = 0.1
[lms.canvas]
{SECTION} = "Catalogue (4512)"
[lms.moodle]
{SECTION} = "Catalogue"
"""


def _utc(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _notebook(course: Path, *, unanswered: set[str] = frozenset()) -> bytes:
    nb = fixtures.answered_notebook(SECTION, NOTEBOOK, root=course, unanswered=unanswered)
    return nbformat.writes(nb).encode()


def _rows(course: Path) -> dict[str, dict[str, str]]:
    with (course / "autograder" / "grades.csv").open(newline="") as f:
        return {r["student_id"]: r for r in csv.DictReader(f) if r["section"] == SECTION}


def _csv(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """The class collected, graded once, then given scores by hand and regraded in part."""
    course = fixtures.copy_course(tmp_path_factory.mktemp("instructor_loop"))
    cases.install(course)
    assert run_module(course, "autograder.release", SECTION).returncode == 0
    (course / "autograder" / "roster.csv").write_text(ROSTER)
    (course / "autograder" / "class.toml").write_text(CLASS_TOML)
    downloads = tmp_path_factory.mktemp("downloads")
    complete, partial = _notebook(course), _notebook(course, unanswered={"dot"})
    # built as the LMSs' source writes them: every entry carries the download's build time
    canvas = lms.zip_download(
        downloads / "canvas.zip",
        {
            lms.canvas_name("Martin, Alice", 101, 9001, f"{NOTEBOOK}.ipynb", late=True): complete,
            lms.canvas_name("Okafor, Bob", 102, 9002, f"{NOTEBOOK}-1.ipynb"): partial,
            lms.canvas_name("Okafor, Bob", 102, 9004, "notes.txt"): b"my notes",
            lms.canvas_name("Stranger, Zed", 999, 9003, f"{NOTEBOOK}.ipynb"): complete,
        },
        BUILT,
    )
    api = downloads / "submissions.json"  # Canvas's submissions API: the times it keeps
    api.write_text(
        json.dumps(
            [
                {"user_id": 101, "submitted_at": _utc(DUE + dt.timedelta(hours=26))},
                {"user_id": 102, "submitted_at": _utc(DUE - dt.timedelta(hours=3))},
            ]
        )
    )
    moodle = lms.zip_download(  # Moodle 4.1, "download in folders"
        downloads / "moodle.zip",
        {lms.moodle_name("Carol Díaz", 555, f"{NOTEBOOK}.ipynb"): complete},
        BUILT,
    )
    sheet = lms.moodle_worksheet(
        downloads / "worksheet.csv", [(555, "Carol Díaz", DUE + dt.timedelta(days=1))]
    )
    collected = [
        run_module(
            course, "autograder.collect", str(canvas), "--section", SECTION, "--times", str(api)
        ),
        run_module(
            course, "autograder.collect", str(moodle), "--section", SECTION, "--times", str(sheet)
        ),
    ]
    submitted = course / "autograder" / "submitted"
    released = course / "notebooks" / SECTION / f"{NOTEBOOK}.ipynb"
    # four filing mistakes
    (submitted / "erin").mkdir()
    (submitted / "erin" / f"{NOTEBOOK}.ipynb").write_bytes(complete)  # one folder too high
    (submitted / SECTION / "someone").mkdir(parents=True)  # a section's name as a student
    (submitted / SECTION / "someone" / f"{NOTEBOOK}.ipynb").write_bytes(complete)
    (submitted / "frank" / SECTION).mkdir(parents=True)  # blank, and the answers in a copy
    shutil.copy2(released, submitted / "frank" / SECTION / f"{NOTEBOOK}.ipynb")
    (submitted / "frank" / SECTION / f"{NOTEBOOK}-Copy1.ipynb").write_bytes(complete)
    (submitted / "grace" / SECTION).mkdir(parents=True)  # blank alone
    shutil.copy2(released, submitted / "grace" / SECTION / f"{NOTEBOOK}.ipynb")
    after = (DUE + dt.timedelta(days=5)).timestamp()
    for student in ("erin", "frank", "grace", SECTION):  # copied in by hand, late: unknown time
        for path in (submitted / student).rglob("*.ipynb"):
            os.utime(path, (after, after))
    first = run_module(course, "autograder.grade", "--jobs", "2", timeout_s=600)
    assert first.returncode == 0, first.stdout + first.stderr
    rows_first = _rows(course)
    # by hand: the formgrader gives bob's test_mean_square 1 of 2; overrides.csv sets carol's
    # total and alice's test_dot
    with open_gradebook(gradebook_url(course / "autograder" / "gradebook.db")) as gb:
        grade = gb.find_grade("test_mean_square", NOTEBOOK, SECTION, "bob")
        grade.manual_score = 1.0
        gb.db.commit()
    (course / "autograder" / "overrides.csv").write_text(
        "student_id,section,test,points,note\n"
        f"carol,{SECTION},total,3,oral exam\n"
        f"alice,{SECTION},test_dot,0,copied from bob\n"
    )
    # bob hands in again (the complete notebook): a new download replaces, then regraded
    again = lms.zip_download(
        downloads / "canvas2.zip",
        {  # a new download holds everyone's latest submission: the stranger's too
            lms.canvas_name("Okafor, Bob", 102, 9010, f"{NOTEBOOK}.ipynb"): complete,
            lms.canvas_name("Stranger, Zed", 999, 9003, f"{NOTEBOOK}.ipynb"): complete,
        },
        BUILT,
    )
    kept = run_module(course, "autograder.collect", str(again), "--section", SECTION, "--keep")
    replaced = run_module(course, "autograder.collect", str(again), "--section", SECTION)
    second = run_module(course, "autograder.grade", "--student", "bob,alice", timeout_s=600)
    assert second.returncode == 0, second.stdout + second.stderr
    return course, collected, first, rows_first, (kept, replaced), second


def test_a_canvas_and_a_moodle_download_are_collected_through_the_roster(loop):
    course, (canvas, moodle), *_ = loop
    assert canvas.returncode == 0 and moodle.returncode == 0, canvas.stderr + moodle.stderr
    submitted = course / "autograder" / "submitted"
    assert (submitted / "alice" / SECTION / f"{NOTEBOOK}.ipynb").is_file()
    assert (submitted / "bob" / SECTION / f"{NOTEBOOK}.ipynb").is_file()  # "-1" taken off
    assert (submitted / "carol" / SECTION / f"{NOTEBOOK}.ipynb").is_file()
    assert "strangerzed_999_9003" in canvas.stdout and "no student with lms_id 999" in canvas.stdout
    assert "notes.txt: not a notebook" in canvas.stdout
    assert "2 placed" in canvas.stdout and "1 placed" in moodle.stdout
    nothing = next(x for x in moodle.stdout.splitlines() if x.startswith("on the roster, nothing"))
    assert nothing.endswith(": dave, erin, frank, grace"), nothing  # not alice, bob, carol


def test_collecting_again_never_overwrites_without_saying_so(loop):
    course, *_, (kept, replaced), _ = loop
    assert "kept the file already there" in kept.stdout, kept.stdout
    assert "1 replaced" in replaced.stdout, replaced.stdout
    assert "0 moved aside" in replaced.stdout, replaced.stdout
    backups = list((course / "autograder" / ".work" / "replaced").rglob("*.ipynb"))
    assert [p.parent.parent.name for p in backups] == ["bob"], backups


def test_the_filing_mistakes_are_warned_before_grading(loop):
    course, _, first, *_ = loop
    out = first.stdout
    assert f"submitted/erin/{NOTEBOOK}.ipynb is one folder too high" in out, out
    assert f"submitted/{SECTION}/ is named like a section" in out, out
    assert "frank" in out and f"the answers in {NOTEBOOK}-Copy1.ipynb are graded" in out, out
    assert "not collected: " in out and "strangerzed_999_9003" in out, out
    report_md = (course / "autograder" / "report.md").read_text()
    top = report_md[: report_md.index(f"## {SECTION}")]
    assert "- not collected: " in top and "canvas2.zip: strangerzed_999_9003" in top, top
    assert f"grace/{SECTION}/{NOTEBOOK}.ipynb is the blank released notebook" in out, out
    assert "nothing submitted for" in out and "dave" in out, out
    assert "not on roster.csv" in out and SECTION in out.split("not on roster.csv")[1], out
    text = (course / "autograder" / "report.md").read_text()
    assert text.index("## Warnings before zeros") < text.index(f"## {SECTION}")


def test_the_answered_copy_beside_a_blank_notebook_is_graded_and_the_student_is_told(loop):
    course, _, _, rows, *_ = loop
    assert float(rows["frank"]["score"]) == cases.MAX_SCORE, rows["frank"]
    assert f"graded {NOTEBOOK}-Copy1.ipynb" in rows["frank"]["reason"]
    page = course / rows["frank"]["feedback"].split()[0]
    assert f"Note from the autograder:</b> graded {NOTEBOOK}-Copy1.ipynb" in page.read_text()
    assert float(rows["grace"]["score"]) == 0 and "blank" in rows["grace"]["reason"]


def test_a_late_submission_is_penalised_and_an_extension_honoured(loop):
    _, _, _, rows, *_ = loop
    alice, carol, bob = rows["alice"], rows["carol"], rows["bob"]
    # 26 h late (grace 10 min): 2 started days at 10 % of 5 points
    assert alice["late"] == "1 d 2 h" and float(alice["autograded"]) == 5, alice
    assert float(alice["score"]) == 4 and "-20% of the points" in alice["reason"], alice
    assert alice["submitted_at"].startswith("2026-10-16T01:59"), alice
    assert carol["late"] == "" and float(carol["score"]) == 5, carol  # extended to the 17th
    assert bob["late"] == "" and float(bob["score"]) == 4, bob  # test_dot unanswered
    # copied in by hand after the deadline: no submission time, flagged, never penalised
    erin_frank = rows["frank"]
    assert erin_frank["late"] == "time unknown" and float(erin_frank["score"]) == 5, erin_frank
    assert "unknown time" in erin_frank["reason"], erin_frank


def test_scores_set_by_hand_survive_a_regrade(loop):
    course, *_, second = loop
    rows = _rows(course)
    bob, carol, alice = rows["bob"], rows["carol"], rows["alice"]
    # bob's new notebook earns 5; the formgrader's 1 of 2 for test_mean_square still counts
    assert float(bob["autograded"]) == 5 and float(bob["score"]) == 4, bob
    assert "test_mean_square 2 -> 1 by hand (formgrader" in bob["reason"], bob
    assert float(carol["score"]) == 3 and "oral exam" in carol["reason"], carol
    # alice: test_dot set to 0 by overrides.csv, then the 20 % late penalty: 5 - 1 - 1
    assert float(alice["score"]) == 3 and "copied from bob" in alice["reason"], alice
    history = _csv(course / "autograder" / "grades_history.csv")
    assert [(r[0], r[2]) for r in history[1:]] == [("bob", "4")], history
    assert "## Regrades" in (course / "autograder" / "report.md").read_text()


def test_the_lms_files_leave_a_missing_section_blank_and_match_the_import_formats(loop):
    course, *_ = loop
    canvas = _csv(course / "autograder" / "grades_canvas.csv")
    assert canvas[0] == [*collect_free_canvas_header(), "Catalogue (4512)"], canvas[0]
    assert canvas[1][0] == "Points Possible" and canvas[1][-1] == "5", canvas[1]
    by_id = {row[1]: row for row in canvas[2:]}
    assert by_id["101"][0] == "Alice Martin" and by_id["101"][-1] == "3"
    assert by_id["104"][-1] == "", "dave handed nothing in: blank, not 0"
    moodle = _csv(course / "autograder" / "grades_moodle.csv")
    assert moodle[0] == ["Full name", "Email address", "ID number", "Username", "Catalogue"]
    assert {r[1]: r[-1] for r in moodle[1:]}["dave@uni.example"] == ""
    plain = _csv(course / "autograder" / "grades_lms.csv")
    assert plain[0][:2] == ["student_id", SECTION]
    assert {r[0]: r[1] for r in plain[1:]}["erin"] == "", "erin's notebook was misfiled"


def collect_free_canvas_header() -> list[str]:
    return ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


# fast checks without a class run


def test_lms_file_names_are_parsed():
    parsed = collect.parse("petrovivan_LATE_123_456_memory_sharding-2.ipynb", "canvas")
    assert (parsed.uid, parsed.who, parsed.late) == ("123", "petrovivan", True)
    assert collect.notebook_name(parsed.file, "02_memory_sharding") == "memory_sharding.ipynb"
    flat = collect.parse("Ivan Petrov_77_assignsubmission_file_final.ipynb", "moodle")
    assert (flat.uid, flat.who, flat.file) == ("77", "Ivan Petrov", "final.ipynb")
    assert collect.detect(["a_1_2_x.ipynb", "b_late_3_4_y.ipynb"]) == "canvas"
    with pytest.raises(collect.CollectError, match="pass --lms"):
        collect.detect(["notebook.ipynb"])


def test_the_report_takes_the_median_and_mean_of_those_who_handed_in():
    rows = [
        {"score": s, "status": "graded", "max_score": "20"} for s in ("0", "10", "16", "19", "19")
    ]
    rows += [{"score": "19", "status": "graded", "max_score": "20"}]
    rows += [{"score": "0", "status": "missing", "max_score": "20"}]
    line = report.distribution(rows)
    assert "of the 6 who handed in, score median 17.5 of 20, mean 13.8" in line, line


def test_make_grade_passes_a_student_id_with_a_space_as_one_argument():
    done = subprocess.run(
        ["make", "-n", "grade", "STUDENT=Ivan Petrov"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert '--student "Ivan Petrov"' in done.stdout, done.stdout


def test_the_report_shows_item_statistics_and_the_score_figure(loop):
    course, *_ = loop
    text = (course / "autograder" / "report.md").read_text()
    assert "| test | failed | of graded | share passing | discrimination | flags |" in text
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| test_")]
    assert {r[0].strip() for r in rows} == {"test_mean_square", "test_normalize", "test_dot"}
    assert all(r[3].strip() == "0.80" for r in rows), rows  # 4 of the 5 graded pass each
    assert (course / "autograder" / "report_figures" / f"{SECTION}.png").is_file()


def test_the_feedback_page_names_each_test_by_its_exercise_and_needs_no_network(loop):
    course, *_ = loop
    page = (course / "autograder" / "feedback" / "grace" / SECTION / f"{NOTEBOOK}.html").read_text()
    summary = page[page.index('<div class="summary">') : page.index("</ol>")]
    assert summary.count('<span class="mark fail">failed</span>') == 3, summary
    assert 'test_mean_square</code></a>, under "Exercise 1: mean square (2 points)" (cell 5)' in (
        summary
    )
    assert '<div class="test failed" id="test_dot">' in page
    assert "# (hidden tests)" in page and "BEGIN HIDDEN" not in page
    assert "mathjax" not in page.lower() and "https://" not in page, "a page needs no network"
    assert len(page.encode()) < 40_000, len(page.encode())


def test_every_place_a_score_is_shown_shows_the_same_final_score(loop):
    """grades.csv, make grade's closing table, report.md, the three LMS files, the feedback
    page and the course server's result.md (results.student_words): one number each."""
    course, _, first, rows_first, _, second = loop
    auto = course / "autograder"
    rows = _rows(course)
    md = (auto / "report.md").read_text()
    lines = list(
        itertools.takewhile(
            lambda x: x.startswith("| "), md[md.index("## Students") :].splitlines()[4:]
        )
    )
    students_table = {
        cells[0]: cells[2].split(" / ")[0]
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    }
    plain = {r[0]: r[1] for r in _csv(auto / "grades_lms.csv")[1:]}
    canvas = {r[1]: r[-1] for r in _csv(auto / "grades_canvas.csv")[2:]}
    moodle = {r[1]: r[-1] for r in _csv(auto / "grades_moodle.csv")[1:]}
    people = {r[0]: r for r in _csv(auto / "roster.csv")[1:]}
    closing = {  # the second run graded bob and alice
        line.split()[0]: line.split()[2]
        for line in second.stdout.splitlines()
        if line.split()[:2] in (["bob", SECTION], ["alice", SECTION])
    }
    assert sorted(closing) == ["alice", "bob"], second.stdout
    graded = [s for s, r in rows.items() if r["status"] != "missing"]
    assert sorted(graded) == ["alice", "bob", "carol", "frank", "grace"], rows
    for student in graded:
        row = rows[student]
        shown = {"grades.csv": row["score"], "report.md": students_table[student]}
        shown["grades_lms.csv"] = plain[student]
        if student in people:
            shown["grades_canvas.csv"] = canvas[people[student][2]]
            shown["grades_moodle.csv"] = moodle[people[student][4]]
        if student in closing:
            shown["make grade"] = closing[student]
        page = (course / row["feedback"].split()[0]).read_text()
        block = page[page.index(results.FINAL_BEGIN) : page.index(results.FINAL_END)]
        shown["feedback page"] = block.split(f"{SECTION}: ")[1].split(" of ")[0]
        result_md = results.student_words(results.final_row(student, SECTION, auto / "grades.csv"))
        shown["result.md"] = result_md.split(" of ")[0]
        assert len(set(shown.values())) == 1, (student, shown)
    alice_page = (course / rows["alice"]["feedback"].split()[0]).read_text()
    assert "copied from bob" in alice_page and "-20% of the points" in alice_page
    first_closing = {
        line.split()[0]: line.split()[2]
        for line in first.stdout.splitlines()
        if len(line.split()) > 2 and line.split()[1] == SECTION
    }
    assert first_closing["alice"] == rows_first["alice"]["score"] == "4", first.stdout
