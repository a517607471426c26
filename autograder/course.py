"""Paths of the course, its gradebook and the environment nbgrader and its kernels run in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

AUTOGRADER = Path(__file__).resolve().parent
ROOT = AUTOGRADER.parent
SOLUTIONS = ROOT / "solutions"
NOTEBOOKS = ROOT / "notebooks"
SUBMITTED = AUTOGRADER / "submitted"
AUTOGRADED = AUTOGRADER / "autograded"
FEEDBACK = AUTOGRADER / "feedback"
WORK = AUTOGRADER / ".work"  # scratch space of the autograder, git-ignored
GRADEBOOK = AUTOGRADER / "gradebook.db"
# Grading workers write the one SQLite gradebook at the same time: a write that finds it
# locked waits up to this long (SQLite's busy timeout) instead of failing.
GRADEBOOK_BUSY_TIMEOUT_S = 120


def is_test(cell) -> bool:
    """A graded test cell (nbgrader's "Autograder tests"): graded, and not an answer cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def is_answer(cell) -> bool:
    """An answer cell (nbgrader's "Autograded answer"): a code cell the student writes, not
    graded itself. The one definition, for the course's notebooks and a student's alike."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and bool(meta.get("solution")) and not meta.get("grade")


def gradebook_url(path: Path = GRADEBOOK, *, busy_timeout_s: float = GRADEBOOK_BUSY_TIMEOUT_S):
    """The SQLAlchemy URL of a gradebook, as nbgrader's ``CourseDirectory.db_url`` takes it.

    SQLAlchemy's sqlite driver passes ``?timeout=`` to ``sqlite3.connect`` as its busy timeout
    (nbgrader 0.9.6 hands the URL to ``create_engine`` unchanged).
    """
    return f"sqlite:///{path}?timeout={busy_timeout_s:g}"


GRADEBOOK_URL = gradebook_url()  # nbgrader_config.py and the grader both use this one


def open_gradebook(url: str = GRADEBOOK_URL):
    """nbgrader's Gradebook of the course (a context manager)."""
    from nbgrader.api import Gradebook

    stamp_in_process()
    return Gradebook(url)


def alembic_head() -> str:
    """The newest revision of nbgrader's gradebook schema, as `alembic heads` prints it."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from nbgrader import dbutil

    config = Config()
    config.set_main_option("script_location", dbutil.ALEMBIC_DIR)
    return ScriptDirectory.from_config(config).get_current_head()


def stamp_in_process() -> None:
    """Let nbgrader stamp a new gradebook with :func:`alembic_head`, asked in this process.

    nbgrader 0.9.6 asks by running the `alembic` program (``nbgrader.api.get_alembic_version``):
    a second interpreter that imports nbgrader again, about 2.5 CPU-s per new gradebook.
    Call before nbgrader opens a gradebook; tests check that both answers agree."""
    import nbgrader.api

    nbgrader.api.get_alembic_version = alembic_head


def sections() -> list[str]:
    """Section ids, from the folders of solutions/ (e.g. "02_memory_sharding")."""
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def students() -> list[str]:
    """The students of the class: the folders of submitted/."""
    if not SUBMITTED.is_dir():
        return []
    return sorted(p.name for p in SUBMITTED.iterdir() if p.is_dir() and not p.name.startswith("."))


def handed_in() -> set[str]:
    """The names of the section folders anyone handed in (known sections or not)."""
    return {p.name for s in students() for p in (SUBMITTED / s).iterdir() if p.is_dir()}


def class_jobs() -> list[tuple[str, str]]:
    """Every (student, section) of the class: each student, each section anyone handed in."""
    graded = sorted(handed_in() & set(sections()))
    return [(student, section) for student in students() for section in graded]


def section_notebooks(section: str) -> list[str]:
    """Notebook names (without .ipynb) of a section."""
    return sorted(p.stem for p in (SOLUTIONS / section).glob("*.ipynb"))


def tool_env() -> dict[str, str]:
    """The environment for nbgrader and its kernels: this interpreter's bin/ first on PATH.

    The notebooks' "python3" kernel must be this environment's Python, which has distopt
    installed (and nbgrader's command line, where used, runs `alembic` by name).
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env
