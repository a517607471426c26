"""The gradebook database: which one, registering a class in it, and the table of results.

The gradebook is nbgrader's (any SQLAlchemy database): SQLite in ``autograder/gradebook.db``
by default, or a PostgreSQL server when several machines grade one class together
(``make grade DB=postgresql://user@host/dbname SHARD=i/n``, driver psycopg 3). Beside
nbgrader's tables it holds one of ours, ``autograder_results``: the row of grades.csv of each
graded (student, section), written by whichever machine graded it, with the digest of the
files it graded and the class run that graded it. It is the one store of results: grades.csv,
report.md and grades_lms.csv are built from it alone (:mod:`autograder.report`), so they do
not depend on which machine graded what, and a killed run resumes from it
(:mod:`autograder.resume`).

Machines that start at once must not create nbgrader's tables, an assignment or a student
twice: :func:`exclusive` lets one class run at a time register (a PostgreSQL advisory lock,
or a file lock beside a SQLite gradebook).
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from sqlalchemy import (
    Column,
    Float,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from autograder import course
from autograder.results import Result

POSTGRES_DRIVER = "postgresql+psycopg"  # psycopg 3, pinned in pyproject.toml
DEFAULT_SOCKET_DIR = "/var/run/postgresql"  # libpq's, on Debian, when the URL names no host
LOCK_KEY = 0x6E62_6772  # the advisory lock of class runs ("nbgr")

RESULTS = Table(
    "autograder_results",
    MetaData(),
    Column("student_id", String(255), primary_key=True),
    Column("section", String(255), primary_key=True),
    Column("score", Float, nullable=False),
    Column("max_score", Float, nullable=False),
    Column("status", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("feedback", Text, nullable=False),
    Column("sandbox", Text, nullable=False),  # "on", or why student code ran without it
    Column("graded_by", Text, nullable=False),  # host and shard, for the instructor's eyes
    Column("graded_at", Float, nullable=False),  # Unix time
    # what a killed run resumes from (autograder.resume): the SHA-256 of the student's section
    # folder when it was graded (staging.digest), and the class run that graded it
    Column("digest", Text, nullable=False, server_default=""),
    Column("run_id", Text, nullable=False, server_default=""),
)
# The columns a gradebook made before they existed gets (ALTER TABLE), all text.
ADDED_COLUMNS = ("digest", "run_id")

# What a regrade replaced: the earlier row of a (student, section), kept when the new one
# differs in score, status or reason.
HISTORY = Table(
    "autograder_history",
    MetaData(),
    Column("student_id", String(255), nullable=False),
    Column("section", String(255), nullable=False),
    Column("score", Float, nullable=False),
    Column("status", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("graded_by", Text, nullable=False),
    Column("graded_at", Float, nullable=False),  # when the replaced row was graded
    Column("replaced_at", Float, nullable=False),
)

# Scores an instructor set by hand in nbgrader's formgrader, copied out of nbgrader's tables
# (a regrade removes the submission there, and its manual scores with it).
MANUAL = Table(
    "autograder_manual",
    MetaData(),
    Column("student_id", String(255), primary_key=True),
    Column("section", String(255), primary_key=True),
    Column("test", String(255), primary_key=True),  # the graded cell's grade id
    Column("points", Float, nullable=False),
    Column("auto_score", Float),  # nbgrader's automatic score of that cell when copied
    Column("copied_at", Float, nullable=False),
)


class GradebookError(ValueError):
    """A gradebook URL that cannot be used, in words that say what to do."""


def resolve(db: str | None) -> str:
    """The SQLAlchemy URL of the gradebook ``db`` names (default: the course's SQLite file).

    ``postgresql://`` (or ``postgres://``) URLs get the psycopg 3 driver; a SQLite URL
    without a busy timeout gets the course's.
    """
    if not db:
        return course.GRADEBOOK_URL
    if db.startswith("postgres://"):
        db = "postgresql://" + db.removeprefix("postgres://")
    try:
        url = make_url(db)
    except ArgumentError:
        raise GradebookError(
            f"DB={db!r} is not a database URL: give postgresql://USER@HOST/DBNAME "
            "(or sqlite:///PATH); leave DB unset for autograder/gradebook.db"
        ) from None
    backend = url.get_backend_name()
    if backend == "postgresql":
        if url.drivername not in ("postgresql", POSTGRES_DRIVER):
            raise GradebookError(
                f"the driver {url.drivername!r} is not installed with the course: write "
                "postgresql://... (psycopg 3 is used)"
            )
        return url.set(drivername=POSTGRES_DRIVER).render_as_string(hide_password=False)
    if backend == "sqlite":
        if "timeout" not in url.query:
            url = url.update_query_dict({"timeout": f"{course.GRADEBOOK_BUSY_TIMEOUT_S:g}"})
        return url.render_as_string(hide_password=False)
    raise GradebookError(
        f"DB={redact(db)!r}: the gradebook is SQLite (the default) or PostgreSQL "
        "(postgresql://USER@HOST/DBNAME), not {backend}"
    )


def redact(url: str) -> str:
    """``url`` without its password, for printing."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<not a URL>"


def is_postgres(url: str) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


def socket_dir(url: str) -> Path | None:
    """The folder of the PostgreSQL server's unix socket, when ``url`` connects through one:
    student kernels must not see it (the sandbox hides it; TCP is out of their reach)."""
    if not is_postgres(url):
        return None
    parsed: URL = make_url(url)
    host = parsed.query.get("host") or parsed.host
    if isinstance(host, tuple):
        host = host[0]
    if host and not host.startswith("/"):
        return None  # TCP: the kernel's network namespace has no route to it
    return Path(host or DEFAULT_SOCKET_DIR)


def unreachable(url: str) -> str | None:
    """None if the gradebook can be reached, else a line saying why not."""
    why = check(url)
    return None if why is None else f"cannot reach the gradebook {redact(url)}: {why}"


def check(url: str) -> str | None:
    """None if the gradebook can be reached, else the driver's reason (one line)."""
    try:
        engine = create_engine(url)
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # the driver's own error: unreachable, refused, no such database
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
    return None


@contextlib.contextmanager
def exclusive(url: str) -> Iterator[None]:
    """One class run at a time, on any machine, registers sections and students."""
    if is_postgres(url):
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": LOCK_KEY})
                try:
                    yield
                finally:
                    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": LOCK_KEY})
        finally:
            engine.dispose()
        return
    database = make_url(url).database
    if not database or database == ":memory:":
        yield
        return
    lock = Path(database).with_name(Path(database).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def create_tables(url: str) -> None:
    """nbgrader's tables, the row of its course, and our results table, where missing (call
    inside :func:`exclusive`).

    nbgrader 0.9.6 with the default empty course id never adds that course's row
    (``Gradebook.check_course`` skips an empty id), yet every assignment refers to it:
    SQLite does not enforce the foreign key, PostgreSQL does.
    """
    from nbgrader.api import Course

    with course.open_gradebook(url) as gb:
        if gb.db.get(Course, "") is None:
            gb.db.add(Course(id=""))
            gb.db.commit()
    table = Results(url)
    for ours in (RESULTS, HISTORY, MANUAL):
        ours.create(table.engine, checkfirst=True)
    have = {c["name"] for c in inspect(table.engine).get_columns(RESULTS.name)}
    with table.engine.begin() as connection:
        for name in ADDED_COLUMNS:
            if name not in have:
                connection.execute(
                    text(f"ALTER TABLE {RESULTS.name} ADD COLUMN {name} TEXT NOT NULL DEFAULT ''")
                )
    table.close()


def add_students(url: str, student_ids: list[str]) -> None:
    """Create the students nbgrader does not know yet (call inside :func:`exclusive`): two
    machines grading one student's sections at once would otherwise both create them."""
    with course.open_gradebook(url) as gb:
        known = {s.id for s in gb.students}
        for student in student_ids:
            if student not in known:
                gb.add_student(student)


def load_results(url: str) -> dict[tuple[str, str], dict]:
    """Every row of the results table, by (student, section)."""
    table = Results(url)
    try:
        return table.load()
    finally:
        table.close()


class Results:
    """The ``autograder_results`` table of one gradebook."""

    def __init__(self, url: str):
        self.url = url
        self.engine = create_engine(url)

    def save(
        self, result: Result, *, sandbox: str, graded_by: str, digest: str = "", run_id: str = ""
    ) -> None:
        """Store ``result``, replacing an earlier row of the same student and section; it is
        in the database when this returns (one transaction)."""
        row = {
            **asdict(result),
            "sandbox": sandbox,
            "graded_by": graded_by,
            "graded_at": time.time(),
            "digest": digest,
            "run_id": run_id,
        }
        key = (RESULTS.c.student_id == result.student_id) & (RESULTS.c.section == result.section)
        with self.engine.begin() as connection:  # one transaction: never two rows, never none
            old = connection.execute(select(RESULTS).where(key)).mappings().first()
            if old is not None and any(old[f] != row[f] for f in ("score", "status", "reason")):
                kept = {f: old[f] for f in ("student_id", "section", "score", "status", "reason")}
                graded = {"graded_by": old["graded_by"], "graded_at": old["graded_at"]}
                replaced = {"replaced_at": row["graded_at"]}
                connection.execute(insert(HISTORY).values(**kept, **graded, **replaced))
            connection.execute(delete(RESULTS).where(key))
            connection.execute(insert(RESULTS).values(**row))

    def load(self, *, run_id: str | None = None) -> dict[tuple[str, str], dict]:
        """Every stored row (or those class run ``run_id`` graded), by (student, section); an
        empty dict if there is no table yet."""
        if not inspect(self.engine).has_table(RESULTS.name):
            return {}
        have = {c["name"] for c in inspect(self.engine).get_columns(RESULTS.name)}
        if run_id is not None and "run_id" not in have:
            return {}  # a gradebook older than the column: no run to resume in it
        query = select(*(c for c in RESULTS.columns if c.name in have))  # an older one's
        if run_id is not None:
            query = query.where(RESULTS.c.run_id == run_id)
        with self.engine.connect() as connection:
            rows = connection.execute(query).mappings().all()
        return {(row["student_id"], row["section"]): dict(row) for row in rows}

    def results(self, *, run_id: str | None = None) -> dict[tuple[str, str], tuple[Result, str]]:
        """The results class run ``run_id`` stored (default: every stored result), each with
        the digest of what it graded, by (student, section)."""
        return {
            job: (result_of(row), row["digest"]) for job, row in self.load(run_id=run_id).items()
        }

    def history(self) -> list[dict]:
        """Every replaced row, oldest first; empty if there is no table yet."""
        if not inspect(self.engine).has_table(HISTORY.name):
            return []
        with self.engine.connect() as connection:
            rows = connection.execute(select(HISTORY).order_by(HISTORY.c.replaced_at))
            return [dict(r) for r in rows.mappings().all()]

    def manual(self) -> dict[tuple[str, str, str], dict]:
        """The copied formgrader scores, by (student, section, test)."""
        if not inspect(self.engine).has_table(MANUAL.name):
            return {}
        with self.engine.connect() as connection:
            rows = connection.execute(select(MANUAL)).mappings().all()
        return {(r["student_id"], r["section"], r["test"]): dict(r) for r in rows}

    def keep_manual(self, rows: list[dict]) -> None:
        """Store formgrader scores (each replaces an earlier copy of the same cell)."""
        if not rows:
            return
        MANUAL.create(self.engine, checkfirst=True)
        with self.engine.begin() as connection:
            for row in rows:
                key = (
                    (MANUAL.c.student_id == row["student_id"])
                    & (MANUAL.c.section == row["section"])
                    & (MANUAL.c.test == row["test"])
                )
                connection.execute(delete(MANUAL).where(key))
                connection.execute(insert(MANUAL).values(**row))

    def close(self) -> None:
        self.engine.dispose()


def result_of(row: dict) -> Result:
    """The :class:`Result` a stored row holds."""
    return Result(**{f: row[f] for f in Result.__dataclass_fields__})


def graded_by(shard_name: str) -> str:
    return f"{socket.gethostname()} shard {shard_name}"
