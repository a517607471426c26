"""Grading on submit: the hub service that grades each submission as it arrives.

JupyterHub starts it (coursehub/jupyterhub_config.py) from the instructor's course checkout.
Every few seconds it lists nbgrader's inbound folder of the exchange; each new submission
(``<student>+<section>+<timestamp>+<random>``) is recorded once in coursehub/state/ledger.jsonl
and then:

- **late** (its nbgrader timestamp after the student's deadline in autograder/class.toml,
  extension and grace included): kept in the exchange, not graded; the student's last
  submission before the deadline is the one that counts, and the student is told so;
- **queued** otherwise. A student's section is graded at most once every
  COURSEHUB_MIN_MINUTES (the instructor's rate limit: the grader is no oracle); of the
  submissions that queue up meanwhile the newest is graded when the time comes, the others are
  marked **superseded** (kept in the exchange all the same: nothing submitted is removed).

Grading copies the submission (the exchange's copy is never changed) to
autograder/submitted/<student>/<section>/, as `nbgrader collect` would, and runs the course's
own class run on those students (``python -m autograder.grade --section S --student ...``):
the same sandbox, gradebook, grades.csv and feedback pages as `make grade`. The feedback page
(visible tests' results, which hidden tests failed, never hidden test code) and a short
result.md are then put in the student's home, ``~/feedback/<section>/``, readable by the
student alone.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coursehub import settings

POLL_S = float(os.environ.get("COURSEHUB_POLL_S", "2"))
JOBS = os.environ.get("COURSEHUB_JOBS", "")  # submissions graded at once (make grade's JOBS)


@dataclass
class Entry:
    """One submission in the exchange's inbound folder, and what became of it."""

    name: str  # the inbound folder's name
    student: str
    section: str
    submitted_at: str  # nbgrader's timestamp, ISO 8601 in UTC
    seen_at: float  # when this service first saw it (Unix time)
    status: str = "queued"  # queued, graded, superseded, late, ignored
    note: str = ""
    graded_at: float | None = None
    score: str = ""
    max_score: str = ""


def parse_name(name: str) -> tuple[str, str, str] | None:
    """(student, section, timestamp) of an inbound folder's name, None if it is not one."""
    parts = name.split("+")
    if len(parts) < 3:
        return None
    return parts[0], parts[1], parts[2]


def nbgrader_time(text: str) -> dt.datetime:
    """nbgrader's submission timestamp (``2026-12-05 07:00:00.123456 UTC``) as aware UTC."""
    from nbgrader.utils import parse_utc

    when = parse_utc(text.strip())
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


class Ledger:
    """Every submission seen, one JSON line each; a restarted service resumes from it."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, Entry] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    e = Entry(**json.loads(line))
                    self.entries[e.name] = e  # the last line of a name is its state

    def save(self, entry: Entry) -> None:
        self.entries[entry.name] = entry
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(entry), sort_keys=True) + "\n")


class Grader:
    def __init__(self) -> None:
        sys.path.insert(0, str(settings.ROOT))
        from autograder import class_settings, course  # the instructor's course

        self.course = course
        self.class_settings = class_settings
        self.inbound = settings.EXCHANGE / settings.COURSE_ID / "inbound"
        self.ledger = Ledger(settings.LEDGER)
        self.child: subprocess.Popen | None = None  # the class run grading now
        self.last_graded: dict[tuple[str, str], float] = {}
        for e in self.ledger.entries.values():
            if e.status == "graded" and e.graded_at:
                key = (e.student, e.section)
                self.last_graded[key] = max(self.last_graded.get(key, 0), e.graded_at)

    # -- what arrived ------------------------------------------------------------------------
    def scan(self) -> None:
        if not self.inbound.is_dir():
            return
        sections = set(self.course.sections())
        rules = self.class_settings.load()
        for folder in sorted(self.inbound.iterdir()):
            if folder.name in self.ledger.entries or not folder.is_dir():
                continue
            parsed = parse_name(folder.name)
            if parsed is None:
                continue
            student, section, stamp = parsed
            stamp_file = folder / "timestamp.txt"
            when = nbgrader_time(stamp_file.read_text() if stamp_file.is_file() else stamp)
            entry = Entry(folder.name, student, section, when.isoformat(), time.time())
            if section not in sections:
                entry.status, entry.note = "ignored", f"no section {section!r} in this course"
            elif student not in settings.STUDENTS:
                entry.status, entry.note = "ignored", f"{student!r} is not a student of the hub"
            else:
                due, extended = rules.deadline(student, section)
                grace = rules.late.grace if rules.late else dt.timedelta(0)
                if due is not None and when > due + grace:
                    entry.status = "late"
                    entry.note = (
                        f"handed in {when:%Y-%m-%d %H:%M} UTC, after the deadline "
                        f"{due.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"
                        + (" (your extension)" if extended else "")
                        + ": your last submission before the deadline is the one that counts"
                    )
            self.ledger.save(entry)
            if entry.status == "late":
                text = f"# {section}: a submission not graded\n\n{entry.note}.\n"
                self.tell(entry, text, name="late.md")  # result.md keeps the counted one

    # -- which to grade now ------------------------------------------------------------------
    def ready(self) -> list[Entry]:
        """The newest queued submission of each student's section whose rate limit allows it;
        the older queued ones of that section are superseded by it."""
        queued: dict[tuple[str, str], list[Entry]] = {}
        for e in self.ledger.entries.values():
            if e.status == "queued":
                queued.setdefault((e.student, e.section), []).append(e)
        now = time.time()
        chosen = []
        for key, entries in queued.items():
            wait_s = self.last_graded.get(key, 0) + settings.MIN_MINUTES * 60 - now
            if wait_s > 0:
                continue
            entries.sort(key=lambda e: (e.submitted_at, e.name))
            for older in entries[:-1]:
                older.status = "superseded"
                older.note = f"a newer submission ({entries[-1].submitted_at}) was graded"
                self.ledger.save(older)
            chosen.append(entries[-1])
        return chosen

    # -- grading -----------------------------------------------------------------------------
    def grade(self, entries: list[Entry]) -> None:
        by_section: dict[str, list[Entry]] = {}
        for e in entries:
            by_section.setdefault(e.section, []).append(e)
        for section, batch in sorted(by_section.items()):
            for e in batch:  # a copy, as nbgrader's collect makes: the exchange keeps its own
                dest = self.course.SUBMITTED / e.student / section
                if dest.exists():
                    shutil.rmtree(dest)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(self.inbound / e.name, dest, symlinks=True)
                os.chmod(dest, 0o700)  # the exchange's copy is open to its student
            students = ",".join(sorted({e.student for e in batch}))
            env = dict(os.environ, PYTHONPATH=str(settings.ROOT), OMP_NUM_THREADS="1")
            self.child = subprocess.Popen(
                [sys.executable, "-m", "autograder.grade", "--section", section,
                 "--student", students, *(["--jobs", JOBS] if JOBS else [])],
                cwd=settings.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True,
            )  # fmt: skip
            out, err = self.child.communicate()
            run = subprocess.CompletedProcess(self.child.args, self.child.returncode, out, err)
            self.child = None
            rows = self.rows()
            for e in batch:
                row = rows.get((e.student, section), {})
                e.status = "graded"
                e.graded_at = time.time()
                e.score, e.max_score = row.get("score", ""), row.get("max_score", "")
                e.note = row.get("status", "") or f"grader exit {run.returncode}"
                if run.returncode != 0:
                    e.note += f"; grader: {run.stdout[-300:]} {run.stderr[-300:]}"
                self.publish(e, row)
                self.last_graded[(e.student, section)] = e.graded_at
                self.ledger.save(e)
            print(
                f"graded {section} of {students} in {time.time() - batch[0].seen_at:.1f} s "
                f"after it arrived (grader exit {run.returncode})",
                flush=True,
            )

    def rows(self) -> dict[tuple[str, str], dict]:
        path = self.course.AUTOGRADER / "grades.csv"
        if not path.is_file():
            return {}
        with path.open(newline="", encoding="utf-8") as f:
            return {(r["student_id"], r["section"]): r for r in csv.DictReader(f)}

    # -- what the student sees ---------------------------------------------------------------
    def publish(self, e: Entry, row: dict) -> None:
        pages = sorted((self.course.FEEDBACK / e.student / e.section).glob("*.html"))
        lines = [
            f"# {e.section}: {row.get('score', '?')} of {row.get('max_score', '?')} points",
            "",
            f"Graded your submission of {e.submitted_at} (UTC).",
            f"Status: {row.get('status', 'not graded')}. {row.get('reason', '')}".rstrip(),
            "",
            "Open the feedback page beside this file for each test: what the visible tests "
            "compared, and which hidden tests failed (their code stays hidden).",
        ]
        if settings.MIN_MINUTES:
            lines.append(
                f"\nA section is graded at most once every {settings.MIN_MINUTES:g} minutes; "
                "a newer submission in that time is graded when it has passed."
            )
        self.tell(e, "\n".join(lines) + "\n", pages)

    def tell(self, e: Entry, text: str, pages: list[Path] = (), name: str = "result.md") -> None:
        """Write result.md (and the feedback pages) into ~student/feedback/<section>/."""
        try:
            account = pwd.getpwnam(e.student)
        except KeyError:
            return  # no such Unix account (a test that submits as root)
        folder = Path(account.pw_dir) / "feedback" / e.section
        folder.mkdir(parents=True, exist_ok=True)
        for page in pages:
            shutil.copyfile(page, folder / page.name)
        (folder / name).write_text(text, encoding="utf-8")
        for path in [folder.parent, folder, *folder.iterdir()]:
            os.chown(path, account.pw_uid, account.pw_gid)
            os.chmod(path, 0o700 if path.is_dir() else 0o600)

    def run_forever(self) -> None:
        while True:
            self.scan()
            chosen = self.ready()
            if chosen:
                self.grade(chosen)
            else:
                time.sleep(POLL_S)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"grading on submit: {settings.EXCHANGE}, rate limit {settings.MIN_MINUTES:g} min",
          flush=True)  # fmt: skip
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    grader = Grader()
    try:
        grader.run_forever()
    finally:  # the hub stops the service: the class run (and its kernels) stops with it
        if grader.child is not None and grader.child.poll() is None:
            os.killpg(grader.child.pid, signal.SIGKILL)
            grader.child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
