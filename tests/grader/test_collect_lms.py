"""Canvas and Moodle downloads as their source writes them (tests/grader/lms_downloads.py),
collected and given final grades with a deadline, an extension and a late policy: file names
of today's LMSs (Unicode, apostrophes, hyphens, spaces, anonymous and blind names, re-uploads),
submission times only from the LMS's records (every zip entry carries the download's build
time), a hand-placed file and a resubmission. The autograded scores are given, not graded
(tests/grader/test_instructor_loop.py grades a real class)."""

from __future__ import annotations

import datetime as dt
import json
import os

import nbformat
import pytest

from autograder import class_settings, collect, course, filing, overrides, results, roster
from autograder.fixtures import answered_notebook
from tests.grader import lms_downloads as lms
from tests.helpers import NOTEBOOK, RELEASED_NB, SECTION

TZ = dt.timezone(dt.timedelta(hours=2))
DUE = dt.datetime(2026, 10, 14, 23, 59, tzinfo=TZ)
BUILT = DUE + dt.timedelta(days=3, hours=4)  # the grading download, made after the deadline
ROSTER = """\
student_id,name,lms_id
carol,Carol Díaz,201
jurgen,Jürgen Müller,202
sean,Seán O'Brien-Smith,203
anna,Anna Maria van der Berg,204
van,Văn An Nguyễn,205
erin,Erin Wu,206
"""
CLASS_TOML = f"""\
timezone = "Etc/GMT-2"
[due]
{SECTION} = 2026-10-14T23:59:00
[extensions]
sean = {{ {SECTION} = 2026-10-17T23:59:00 }}
[late]
grace_minutes = 10
penalty_per_day = 0.1
"""
# Canvas: (sortable name, user id, submitted, Canvas's late mark, attachments (id, name))
CANVAS_CLASS = {
    "carol": ("Díaz, Carol", 201, DUE - dt.timedelta(hours=2), False, [(9101, "nb")]),
    "jurgen": ("Müller, Jürgen", 202, DUE + dt.timedelta(hours=26), True, [(9102, "nb")]),
    # Canvas knows sean's extension: not marked late, two days after the course's deadline
    "sean": ("O'Brien-Smith, Seán", 203, DUE + dt.timedelta(days=2), False, [(9103, "nb")]),
    # five minutes late: Canvas marks it, the class's 10 minutes of grace forgive it
    "anna": ("van der Berg, Anna Maria", 204, DUE + dt.timedelta(minutes=5), True, [(9104, "nb")]),
    # uploaded twice in one submission: Canvas renamed the second "-1"
    "van": ("Nguyễn, Văn An", 205, DUE - dt.timedelta(days=1), False, [(9105, "nb"), (9106, "-1")]),
}


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A course folder of its own: submitted/, .work/ and the instructor's files."""
    auto = tmp_path / "autograder"
    auto.mkdir()
    monkeypatch.setattr(course, "ROOT", tmp_path)
    monkeypatch.setattr(course, "AUTOGRADER", auto)
    monkeypatch.setattr(course, "SUBMITTED", auto / "submitted")
    monkeypatch.setattr(course, "WORK", auto / ".work")
    (auto / "roster.csv").write_text(ROSTER, encoding="utf-8")
    (auto / "class.toml").write_text(CLASS_TOML, encoding="utf-8")
    return tmp_path


def _people(place) -> roster.Roster:
    return roster.load(place / "autograder" / "roster.csv")


def _settings(place) -> class_settings.ClassSettings:
    return class_settings.load(place / "autograder" / "class.toml")


def _notebook(tag: str = "") -> bytes:
    nb = answered_notebook(SECTION, NOTEBOOK)
    nb.metadata["tag"] = tag  # tells the copies apart
    return nbformat.writes(nb).encode()


def _canvas_zip(place, *, anonymous: dict[str, str] | None = None, tag: str = ""):
    files = {}
    for student, (sortable, uid, _, late, uploads) in CANVAS_CLASS.items():
        for attachment, suffix in uploads:
            display = f"{NOTEBOOK}{'' if suffix == 'nb' else suffix}.ipynb"
            name = lms.canvas_name(
                sortable,
                uid,
                attachment,
                display,
                late=late,
                anonymous_id=(anonymous or {}).get(student),
            )
            files[name] = _notebook(f"{student}{tag}{attachment}")
    files[lms.canvas_name("Stranger, Zed", 299, 9199, f"{NOTEBOOK}.ipynb")] = _notebook()
    files[lms.canvas_name("Díaz, Carol", 201, 9107, "notes.txt")] = b"my notes"
    return lms.zip_download(place / "canvas.zip", files, BUILT)


def _api_json(place, anonymous: dict[str, str] | None = None):
    items = [
        {
            "user_id": uid,
            "submitted_at": when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "late": late,
            **({"anonymous_id": anonymous[s]} if anonymous and s in anonymous else {}),
        }
        for s, (_, uid, when, late, _) in CANVAS_CLASS.items()
    ]
    path = place / "submissions.json"
    path.write_text(json.dumps(items), encoding="utf-8")
    return path


def _final(place, student: str, autograded: float, maximum: float) -> results.Final:
    late = _settings(place).lateness(student, SECTION)
    return results.final_score(autograded, maximum, lateness=late)


def test_canvas_names_built_from_its_source_are_parsed():
    for sortable, uid, _, late, uploads in CANVAS_CLASS.values():
        for attachment, suffix in uploads:
            display = f"{NOTEBOOK}{'' if suffix == 'nb' else suffix}.ipynb"
            name = lms.canvas_name(sortable, uid, attachment, display, late=late)
            parsed = collect.parse(name, "canvas")
            assert parsed is not None, name
            assert (parsed.uid, parsed.late, parsed.order, parsed.file) == (
                str(uid),
                late,
                attachment,
                display,
            ), name
            assert collect.notebook_name(parsed.file, SECTION) == f"{NOTEBOOK}.ipynb"
    name = lms.canvas_name("O'Brien-Smith, Seán", 203, 1, "x.ipynb", late=True)
    assert name == "obriensmithseán_LATE_203_1_x.ipynb", name  # accents kept, the rest dropped
    anon = lms.canvas_name("", 0, 77, "my: nb?.ipynb", late=True, anonymous_id="x7Kq2")
    assert anon == "LATE_anon_x7Kq2_77_my_ nb_.ipynb", anon
    assert collect.parse(anon, "canvas").uid == "anon_x7Kq2"
    assert collect.parse("petrovivan_late_123_456_memory_sharding-2.ipynb", "canvas").late
    assert collect.resubmission("memory_sharding-2.ipynb") == 2
    assert collect.resubmission("memory_sharding (3).ipynb") == 3


def test_moodle_names_built_from_its_source_are_parsed():
    people = [
        ("Seán O'Brien-Smith", 51, "Seán OBrien-Smith"),  # clean_filename drops apostrophes
        ("Anna_Maria van der Berg", 52, "Anna Maria van der Berg"),  # "_" becomes a space
        ("Văn An Nguyễn", 53, "Văn An Nguyễn"),
    ]
    for full, pid, shown in people:
        for how in ({}, {"folders": False}, {"before_4_1": True}):
            path = lms.moodle_name(full, pid, f"{NOTEBOOK}.ipynb", **how)
            parsed = collect.parse(path, "moodle")
            assert parsed is not None, path
            assert (parsed.uid, parsed.who, parsed.file) == (
                str(pid),
                shown,
                f"{NOTEBOOK}.ipynb",
            ), path
    four_one = lms.moodle_name("Văn An Nguyễn", 53, "nb.ipynb")
    assert four_one == "Văn An Nguyễn_53_assignsubmission_file/nb.ipynb"
    blind = collect.parse(lms.moodle_name("x", 1234567, "nb.ipynb", blind=True), "moodle")
    assert (blind.who, blind.uid) == ("Participant", "1234567")
    assert collect.detect([four_one]) == "moodle"


def test_a_canvas_download_made_after_the_deadline_penalises_nobody_without_its_times(place):
    done = collect.collect(_canvas_zip(place), SECTION, _people(place))
    submitted = course.SUBMITTED
    for student in CANVAS_CLASS:
        assert (submitted / student / SECTION / f"{NOTEBOOK}.ipynb").is_file(), student
    assert any("9199" in u and "no student with lms_id 299" in u for u in done.unplaced)
    assert any("notes.txt: not a notebook" in u for u in done.unplaced)
    # the re-upload: attachment 9106 ("-1") is the newer one, 9105 is not used
    van = nbformat.reads((submitted / "van" / SECTION / f"{NOTEBOOK}.ipynb").read_text(), 4)
    assert van.metadata["tag"] == "van9106", van.metadata
    assert any("9105" in u and "older upload" in u for u in done.unplaced), done.unplaced
    assert any("carries one time" in n for n in done.notes), done.notes
    maximum = 20.0
    for student, (_, _, _, marked, _) in CANVAS_CLASS.items():
        late = _settings(place).lateness(student, SECTION)
        assert late.submitted_at is None and late.lms_late == marked, (student, late)
        final = _final(place, student, maximum, maximum)
        assert final.score == maximum, (student, final)  # no time: never a penalty
        if marked:
            assert late.column() == "marked late by the LMS"
            assert "at an unknown time: no late penalty" in final.changes[0], final
        else:
            assert late.column() == "" and not final.changes, (student, final)


def test_canvas_times_from_the_submissions_api_give_the_right_final_grades(place):
    collect.collect(_canvas_zip(place), SECTION, _people(place), times_file=_api_json(place))
    maximum, autograded = 20.0, {"carol": 20, "jurgen": 18, "sean": 15, "anna": 20, "van": 11}
    expected = {  # 10 % of 20 points per started day late, 10 minutes of grace
        "carol": 20,  # 2 h early
        "jurgen": 18 - 2 * 0.1 * 20,  # 26 h late: two started days
        "sean": 15,  # two days after the deadline, a day before his extension
        "anna": 20,  # 5 minutes late, within the grace
        "van": 11,
    }
    for student, score in autograded.items():
        final = _final(place, student, score, maximum)
        assert final.score == pytest.approx(expected[student]), (student, final)
    jurgen = _settings(place).lateness("jurgen", SECTION)
    assert jurgen.source == "Canvas submissions API" and jurgen.column() == "1 d 2 h"
    assert jurgen.submitted_at == DUE + dt.timedelta(hours=26)


def test_anonymous_canvas_names_are_joined_through_the_api(place):
    anonymous = {s: f"a{i}B{i}c" for i, s in enumerate(CANVAS_CLASS)}
    without = collect.collect(
        _canvas_zip(place, anonymous=anonymous), SECTION, _people(place), dry_run=True
    )
    assert not without.placed and any("anonymous (anon_a0B0c)" in u for u in without.unplaced)
    pages = json.loads(_api_json(place, anonymous).read_text())
    first, second = place / "page1.json", place / "page2.json"  # the API's pages, per_page
    first.write_text(json.dumps(pages[:3]))
    second.write_text(json.dumps(pages[3:]))
    done = collect.collect(
        _canvas_zip(place, anonymous=anonymous), SECTION, _people(place), times_file=[first, second]
    )
    assert sorted(p.split("/")[2] for p in done.placed) == sorted(CANVAS_CLASS), done.placed


def test_a_moodle_4_1_download_with_its_worksheet_gives_the_right_final_grades(place):
    (place / "autograder" / "roster.csv").write_text(
        ROSTER.replace(",201\n", ",71\n").replace(",202\n", ",72\n").replace(",203\n", ",73\n"),
        encoding="utf-8",
    )
    when = {
        "Carol Díaz": (71, DUE - dt.timedelta(minutes=1)),
        "Jürgen Müller": (72, DUE + dt.timedelta(days=3, minutes=1)),  # 4 started days
        "Seán O'Brien-Smith": (73, DUE + dt.timedelta(days=3, hours=1)),  # after his extension
    }
    files = {
        lms.moodle_name(name, pid, f"{NOTEBOOK}.ipynb"): _notebook(name)
        for name, (pid, _) in when.items()
    }
    files[lms.moodle_name("x", 88, f"{NOTEBOOK}.ipynb", blind=True)] = _notebook()
    download = lms.zip_download(place / "moodle.zip", files, BUILT)
    sheet = lms.moodle_worksheet(
        place / "worksheet.csv",
        [(pid, name, at) for name, (pid, at) in when.items()] + [(99, "Nobody", None)],
    )
    done = collect.collect(download, SECTION, _people(place), times_file=sheet, tz=TZ)
    assert len(done.placed) == 3, done
    assert any("88" in u and "blind marking" in u for u in done.unplaced), done.unplaced
    maximum = 20.0
    expected = {"carol": 20, "jurgen": 20 - 4 * 0.1 * 20, "sean": 20 - 1 * 0.1 * 20}
    for student, score in expected.items():
        final = _final(place, student, maximum, maximum)
        assert final.score == pytest.approx(score), (student, final)
    sean = _settings(place).lateness("sean", SECTION)
    assert sean.extended and sean.source == "Moodle grading worksheet", sean


def test_a_hand_placed_file_is_flagged_and_never_penalised(place):
    collect.collect(_canvas_zip(place), SECTION, _people(place), times_file=_api_json(place))
    folder = course.SUBMITTED / "erin" / SECTION
    folder.mkdir(parents=True)
    path = folder / f"{NOTEBOOK}.ipynb"
    path.write_bytes(_notebook("erin"))
    late_mtime = (DUE + dt.timedelta(days=9)).timestamp()  # copied in long after the deadline
    os.utime(path, (late_mtime, late_mtime))
    late = _settings(place).lateness("erin", SECTION)
    assert late.unknown and late.column() == "time unknown", late
    final = _final(place, "erin", 17, 20)
    assert final.score == 17 and "unknown time" in final.changes[0], final
    warned = filing.unknown_times([("erin", SECTION), ("carol", SECTION)])
    assert len(warned) == 1 and "erin" in warned[0].words and "carol" not in warned[0].words
    # the instructor vouches for a time in class.toml: then it counts
    toml = place / "autograder" / "class.toml"
    toml.write_text(
        toml.read_text() + f"[submitted]\nerin = {{ {SECTION} = 2026-10-15T12:00:00 }}\n"
    )
    assert _final(place, "erin", 17, 20).score == pytest.approx(17 - 0.1 * 20)


def test_nbgraders_timestamp_is_the_submission_time_never_the_file_time(place):
    folder = course.SUBMITTED / "carol" / SECTION
    folder.mkdir(parents=True)
    (folder / f"{NOTEBOOK}.ipynb").write_bytes(_notebook())
    (folder / "timestamp.txt").write_text("2026-10-15 22:30:00.123456 UTC")  # 24.5 h late
    when, source, _ = class_settings.submission_time("carol", SECTION)
    assert when == dt.datetime(2026, 10, 15, 22, 30, 0, 123456, tzinfo=dt.UTC), when
    assert source == "nbgrader exchange timestamp.txt"
    assert _final(place, "carol", 20, 20).score == pytest.approx(20 - 2 * 0.1 * 20)


def test_a_resubmission_replaces_and_moves_aside_what_the_new_download_lacks(place):
    first = {
        lms.canvas_name("Díaz, Carol", 201, 9101, f"{NOTEBOOK}.ipynb"): _notebook("first"),
        lms.canvas_name("Díaz, Carol", 201, 9102, "scratch.ipynb"): _notebook("scratch"),
    }
    collect.collect(lms.zip_download(place / "c1.zip", first, BUILT), SECTION, _people(place))
    folder = course.SUBMITTED / "carol" / SECTION
    assert sorted(p.name for p in folder.iterdir()) == [f"{NOTEBOOK}.ipynb", "scratch.ipynb"]
    again = {lms.canvas_name("Díaz, Carol", 201, 9110, f"{NOTEBOOK}.ipynb"): _notebook("second")}
    done = collect.collect(
        lms.zip_download(place / "c2.zip", again, BUILT), SECTION, _people(place)
    )
    assert [p.name for p in folder.iterdir()] == [f"{NOTEBOOK}.ipynb"]
    assert nbformat.reads((folder / f"{NOTEBOOK}.ipynb").read_text(), 4).metadata["tag"] == "second"
    assert len(done.replaced) == 1 and len(done.moved_aside) == 1, done
    assert "scratch.ipynb: not in the new download" in done.moved_aside[0]
    kept = sorted(p.name for p in collect.replaced_folder().rglob("*.ipynb"))
    assert kept == [f"{NOTEBOOK}.ipynb", "scratch.ipynb"], kept  # moved aside, never deleted
    text = collect.summary(done, SECTION, _people(place))
    assert "1 moved aside" in text and "moved aside: the new download lacks them" in text
    record = class_settings.collected_times()[f"carol/{SECTION}"]
    assert record["files"] == [f"{NOTEBOOK}.ipynb"] and record["download"] == "c2.zip"


def test_the_roster_line_names_only_students_with_nothing(place):
    done = collect.collect(_canvas_zip(place), SECTION, _people(place))
    line = next(x for x in collect.summary(done, SECTION, _people(place)).splitlines()
                if x.startswith("on the roster, nothing"))  # fmt: skip
    assert line == f"on the roster, nothing for {SECTION}: erin", line


def test_what_collect_could_not_place_heads_the_warnings(place):
    collect.collect(_canvas_zip(place), SECTION, _people(place))
    found = filing.not_collected()
    assert [w.kind for w in found] == ["not collected"] * 3, found
    assert any("strangerzed_299_9199" in w.words and "canvas.zip" in w.words for w in found)
    jobs = [(s, SECTION) for s in course.students()]
    assert filing.warnings(jobs, _people(place))[0].kind == "not collected"


def test_the_newest_of_several_answered_copies_is_graded_and_said_why(place):
    folder = course.SUBMITTED / "carol" / SECTION
    folder.mkdir(parents=True)
    (folder / f"{NOTEBOOK}.ipynb").write_bytes(RELEASED_NB.read_bytes())  # blank
    for n in (1, 2):
        (folder / f"{NOTEBOOK}-Copy{n}.ipynb").write_bytes(_notebook(f"copy{n}"))
    released = nbformat.read(RELEASED_NB, as_version=4)
    chosen, why = filing.graded_copy(folder, NOTEBOOK, released)
    assert chosen.name == f"{NOTEBOOK}-Copy2.ipynb" and "by its copy number" in why, why
    [warning] = filing.blank("carol", SECTION)
    assert "without answers" not in warning.words and "Copy2.ipynb are graded" in warning.words
    assert f"also answered: {NOTEBOOK}-Copy1.ipynb" in warning.words, warning.words
    # the LMS's own order wins over the names: Copy1 was uploaded last
    order = {f"{NOTEBOOK}-Copy1.ipynb": 9300, f"{NOTEBOOK}-Copy2.ipynb": 9200}
    collect._write_json(class_settings.collected_path(), {f"carol/{SECTION}": {"order": order}})
    chosen, why = filing.graded_copy(folder, NOTEBOOK, released)
    assert chosen.name == f"{NOTEBOOK}-Copy1.ipynb" and "upload order" in why, why


def test_an_override_above_a_tests_points_is_refused(tmp_path):
    points = overrides.test_points(SECTION)
    test, most = next(iter(points.items()))
    path = tmp_path / "overrides.csv"
    path.write_text(f"student_id,section,test,points,note\nalice,{SECTION},{test},{most + 1},x\n")
    with pytest.raises(overrides.OverrideError, match=f"line 2: {most + 1:g} points for {test}"):
        overrides.load_file(path)
    total = sum(points.values())
    path.write_text(f"student_id,section,test,points,note\nalice,{SECTION},total,{total + 5},x\n")
    with pytest.raises(overrides.OverrideError, match=f"worth {total:g}"):
        overrides.load_file(path)
    path.write_text(f"student_id,section,test,points,note\nalice,{SECTION},{test},{most},x\n")
    assert overrides.load_file(path)[0].points == most


def test_the_final_score_is_computed_in_one_order():
    test = overrides.Override("a", SECTION, "t1", 0.0, "copied", "overrides.csv line 2")
    late = class_settings.Lateness(
        DUE + dt.timedelta(hours=30), "x", DUE, late_by=dt.timedelta(hours=30), penalty=0.2
    )
    final = results.final_score(18, 20, tests=[test], autos={"t1": 3.0}, lateness=late)
    assert final.score == pytest.approx(18 - 3 - 0.2 * 20), final  # tests, then the penalty
    assert "t1 3 -> 0 by hand (overrides.csv line 2: copied)" in final.changes[0]
    total = overrides.Override("a", SECTION, "total", 12.0, "oral exam", "overrides.csv line 3")
    assert results.final_score(18, 20, lateness=late, total=total).score == 12
    assert results.final_score(2, 20, lateness=late).score == 0  # never below 0
