"""The course's gradebook (autograder/course.py): stamped as nbgrader's alembic would, without
running it, and a busy timeout that makes a writer wait for a locked gradebook."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import threading

import pytest

from autograder import course


@pytest.fixture(scope="module")
def empty_gradebook(tmp_path_factory):
    """A new gradebook, made once."""
    db = tmp_path_factory.mktemp("gradebook") / "gradebook.db"
    with course.open_gradebook(course.gradebook_url(db)):
        pass
    return db


def test_a_new_gradebook_is_stamped_as_the_alembic_program_would(tmp_path, monkeypatch):
    """The grader stamps new gradebooks without running `alembic` (course.stamp_in_process),
    with the revision the program names."""
    from nbgrader import api, dbutil

    with dbutil._temp_alembic_ini(f"sqlite:///{tmp_path / 'unused.db'}") as ini:
        heads = subprocess.run(
            ["alembic", "-c", ini, "heads"], env=course.tool_env(), capture_output=True,
            text=True, check=True,
        )  # fmt: skip
    assert heads.stdout.split() == [course.alembic_head(), "(head)"]

    def no_program(*args, **kwargs):
        raise AssertionError(f"a program was run: {args}")

    monkeypatch.setattr(api.sp, "check_output", no_program)
    db = tmp_path / "gradebook.db"
    with course.open_gradebook(course.gradebook_url(db)):
        pass
    with sqlite3.connect(db) as stamped:
        assert stamped.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (course.alembic_head(),)
        ]


@pytest.fixture()
def gradebook_db(empty_gradebook, tmp_path):
    db = tmp_path / "gradebook.db"
    shutil.copy2(empty_gradebook, db)
    return db


def _write_while_locked(db, hold_s: float, busy_timeout_s: float) -> None:
    """Add a student to a gradebook while another connection holds its write lock."""
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(hold_s, holder.execute, ["COMMIT"])
    releaser.start()
    try:
        url = course.gradebook_url(db, busy_timeout_s=busy_timeout_s)
        with course.open_gradebook(url) as gb:
            gb.add_student("alice")
    finally:
        releaser.join()
        holder.close()


def test_a_locked_gradebook_is_waited_for(gradebook_db):
    _write_while_locked(gradebook_db, hold_s=1.0, busy_timeout_s=10)


def test_without_the_busy_timeout_a_locked_gradebook_fails(gradebook_db):
    """The control: the timeout in the URL is what makes the write above wait."""
    from nbgrader.api import InvalidEntry

    with pytest.raises(InvalidEntry, match="database is locked"):
        _write_while_locked(gradebook_db, hold_s=1.0, busy_timeout_s=0.05)


def test_the_course_gradebook_waits_long_enough():
    assert course.GRADEBOOK_URL.endswith(f"?timeout={course.GRADEBOOK_BUSY_TIMEOUT_S}")
    assert course.GRADEBOOK_BUSY_TIMEOUT_S >= 60
