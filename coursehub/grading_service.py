"""Grading on submit: the hub service that grades each submission as it arrives.

JupyterHub starts it (coursehub/jupyterhub_config.py) from the instructor's course checkout.
Every few seconds it lists nbgrader's inbound folder of the exchange; each new submission
(``<student>+<section>+<timestamp>+<random>``) is recorded once in coursehub/state/ledger.jsonl,
with the exchange's time of it (its timestamp.txt: coursehub/counted.py), and then:

- **late, not graded** when it came after the student's deadline (autograder/class.toml,
  extension and grace included) and the student has a submission on time: that one counts
  (coursehub/counted.py, the rule the instructor's collect follows too);
- **queued** otherwise (a late one with nothing on time before it is graded, and `make grade`
  takes the late policy's penalty off). A student's section is graded at most once every
  COURSEHUB_MIN_MINUTES (the instructor's rate limit: the grader is no oracle); meanwhile the
  newest submission **waits** (the student is told until when), and the older ones queued with
  it are marked **superseded** when it is graded (kept in the exchange all the same).

Grading copies the submission (the exchange's copy is never changed) to
autograder/submitted/<student>/<section>/, as `nbgrader collect` would, and runs the course's
own class run on those students (``python -m autograder.grade --section S --student ...
--report graded``): the same sandbox, gradebook and feedback pages as `make grade`, and the
final rows of those students alone, so that a submission costs the same in a class of 10 or
of 200. The class's grades.csv, report.md and LMS files are built once the submissions stop
arriving: COURSEHUB_REPORT_S seconds (default 60) after the last grading, not per submission.

What the student sees goes where nbgrader's Fetch Feedback puts feedback, one folder per
submission: ``~/<section>/feedback/<timestamp>/`` (the feedback page, and result.md: the state
of that submission in words). The lab's Assignment List links that folder from the
submission's line and shows the state beside it (coursehub/lab_list.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from coursehub import counted, settings

POLL_S = float(os.environ.get("COURSEHUB_POLL_S", "2"))
REPORT_S = float(os.environ.get("COURSEHUB_REPORT_S", "60"))  # quiet time before the report
JOBS = os.environ.get("COURSEHUB_JOBS", "")  # submissions graded at once (make grade's JOBS)
ON_TIME = ("queued", "graded", "superseded")  # what a submission on time can become


@dataclass
class Entry:
    """One submission in the exchange's inbound folder, and what became of it."""

    name: str  # the inbound folder's name
    student: str
    section: str
    submitted_at: str  # the exchange's time (timestamp.txt), ISO 8601 in UTC
    seen_at: float  # when this service first saw it (Unix time): its receipt
    status: str = "queued"  # queued, graded, superseded, late, ignored
    note: str = ""
    graded_at: float | None = None
    score: str = ""
    max_score: str = ""
    late: bool = False  # after the deadline (graded all the same when nothing was on time)
    waiting_until: float | None = None  # the rate limit holds it back until then

    @property
    def arrived(self) -> float:
        """When it arrived in the exchange (Unix time): the exchange's own time."""
        return dt.datetime.fromisoformat(self.submitted_at).timestamp()

    @property
    def stamp(self) -> str:
        """nbgrader's timestamp in the folder's name: the name of its feedback folder."""
        return self.name.split("+")[2]


def parse_name(name: str) -> tuple[str, str, str] | None:
    """(student, section, timestamp) of an inbound folder's name, None if it is not one."""
    return counted.parse_name(name)


class Ledger:
    """Every submission seen, one JSON line each; a restarted service resumes from it."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, Entry] = {}
        known = {f.name for f in fields(Entry)}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    data = json.loads(line)
                    e = Entry(**{k: v for k, v in data.items() if k in known})
                    self.entries[e.name] = e  # the last line of a name is its state

    def save(self, entry: Entry) -> None:
        self.entries[entry.name] = entry
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(entry), sort_keys=True) + "\n")


class Grader:
    def __init__(self) -> None:
        sys.path.insert(0, str(settings.ROOT))
        from autograder import class_settings, course, results  # the instructor's course

        self.course = course
        self.class_settings = class_settings
        self.results = results  # grades.csv: its score is the final score (results.final_score)
        self.inbound = settings.EXCHANGE / settings.COURSE_ID / "inbound"
        self.ledger = Ledger(settings.LEDGER)
        self.child: subprocess.Popen | None = None  # the class run grading now
        self.report_due: float | None = None  # when to rebuild the class report (or None)
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
            student, section, _ = parsed
            try:
                when = counted.exchange_time(folder)
            except (ValueError, OverflowError):
                continue  # not a submission nbgrader wrote
            entry = Entry(folder.name, student, section, when.isoformat(), time.time())
            if section not in sections:
                entry.status, entry.note = "ignored", f"no section {section!r} in this course"
            elif student not in settings.STUDENTS:
                entry.status, entry.note = "ignored", f"{student!r} is not a student of the hub"
            else:
                entry.late = counted.is_late(rules, self.submission(entry))
                if entry.late:
                    kept = self.counted(student, section, rules)
                    if kept is not None and not counted.is_late(rules, self.submission(kept)):
                        entry.status = "late"
                        entry.note = f"after the deadline; {kept.name} (on time) counts"
            self.ledger.save(entry)
            if entry.status == "late":
                self.tell(entry, self.late_words(entry, rules))

    @staticmethod
    def submission(e: Entry) -> counted.Submission:
        return counted.Submission(
            e.name, e.student, e.section, dt.datetime.fromisoformat(e.submitted_at)
        )

    def counted(self, student: str, section: str, rules) -> Entry | None:
        """The submission of this student's section that counts, of those seen so far."""
        mine = {
            e.name: e
            for e in self.ledger.entries.values()
            if (e.student, e.section) == (student, section) and e.status in (*ON_TIME, "late")
        }
        chosen = counted.counted((self.submission(e) for e in mine.values()), rules)
        return mine[chosen.name] if chosen else None

    # -- which to grade now ------------------------------------------------------------------
    def ready(self) -> list[Entry]:
        """The submission that counts of each student's section, when it is queued and the
        rate limit allows it; the other queued ones of that section are superseded by it. One
        that the rate limit holds back is marked waiting, and its student told until when."""
        queued: dict[tuple[str, str], list[Entry]] = {}
        for e in self.ledger.entries.values():
            if e.status == "queued":
                queued.setdefault((e.student, e.section), []).append(e)
        now = time.time()
        rules = self.class_settings.load() if queued else None
        chosen = []
        for key, entries in queued.items():
            best = self.counted(*key, rules)
            wait_until = self.last_graded.get(key, 0) + settings.MIN_MINUTES * 60
            if wait_until > now:
                if best is not None and best.status == "queued" and not best.waiting_until:
                    best.waiting_until = wait_until
                    self.ledger.save(best)
                    self.tell(best, self.waiting_words(best, rules))
                continue
            for other in entries:
                if best is None or other.name != best.name:
                    other.status = "superseded"
                    other.note = f"{best.name if best else 'another submission'} counts"
                    self.ledger.save(other)
                    self.tell(other, self.superseded_words(other, best, rules))
            if best is not None and best.status == "queued":
                chosen.append(best)
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
                 "--student", students, "--report", "graded",
                 *(["--jobs", JOBS] if JOBS else [])],
                cwd=settings.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True,
            )  # fmt: skip
            out, err = self.child.communicate()
            run = subprocess.CompletedProcess(self.child.args, self.child.returncode, out, err)
            self.child = None
            self.report_due = time.time() + REPORT_S
            rows = self.rows()
            rules = self.class_settings.load()
            for e in batch:
                row = rows.get((e.student, section), {})
                e.status = "graded"
                e.graded_at = time.time()
                e.waiting_until = None
                e.score, e.max_score = row.get("score", ""), row.get("max_score", "")
                e.note = row.get("status", "") or f"grader exit {run.returncode}"
                if run.returncode != 0:
                    e.note += f"; grader: {run.stdout[-300:]} {run.stderr[-300:]}"
                self.publish(e, row, rules)
                self.last_graded[(e.student, section)] = e.graded_at
                self.ledger.save(e)
            lags = ", ".join(f"{e.student} {e.graded_at - e.arrived:.1f} s" for e in batch)
            print(
                f"graded {section} (grader exit {run.returncode}); from arrival in the "
                f"exchange to result: {lags}",
                flush=True,
            )

    def rows(self) -> dict[tuple[str, str], dict]:
        """The final rows the last grading wrote (autograder.report.build_for: the same final
        score grades.csv gets): the student reads what the gradebook will say."""
        return self.results.read_csv(self.course.WORK / "graded_rows.csv")

    def build_report(self) -> None:
        """grades.csv, report.md and the LMS files for the whole class, once."""
        self.report_due = None
        env = dict(os.environ, PYTHONPATH=str(settings.ROOT), OMP_NUM_THREADS="1")
        start = time.perf_counter()
        self.child = subprocess.Popen(
            [sys.executable, "-m", "autograder.report"],
            cwd=settings.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        out, err = self.child.communicate()
        code, self.child = self.child.returncode, None
        print(
            f"class report built in {time.perf_counter() - start:.1f} s (exit {code})"
            + (f": {out[-300:]} {err[-300:]}" if code else ""),
            flush=True,
        )

    # -- what the student sees ---------------------------------------------------------------
    def publish(self, e: Entry, row: dict, rules) -> None:
        pages = sorted((self.course.FEEDBACK / e.student / e.section).glob("*.html"))
        self.tell(e, self.graded_words(e, row, rules), pages)

    def graded_words(self, e: Entry, row: dict, rules) -> str:
        """result.md of a graded submission, in the student's words."""
        if not row:
            return (
                f"# {e.section}: not graded, the grader failed\n\n"
                f"Your submission of {when(e.arrived, rules)} could not be graded; your "
                "instructor has been told (the grading service's log).\n"
            )
        score, top = points(row.get("score")), points(row.get("max_score"))
        lines = [f"# {e.section}: graded, {score} of {top} points", ""]
        lines.append(
            f"Your submission of {when(e.arrived, rules)}, graded {when(e.graded_at, rules)}."
        )
        deadline = counted.due(rules, e.student, e.section)
        if e.late:
            own = points(row.get("autograded")) if row.get("autograded") else score
            lines.append(
                f"It came after the deadline ({when(deadline.timestamp(), rules)}) and nothing "
                "before it was on time, so it counts"
                + (f": {own} points before the late penalty." if own != score else ".")
            )
        elif deadline is not None:
            lines.append(
                f"It is your newest submission before the deadline "
                f"({when(deadline.timestamp(), rules)}) so far: the one that counts."
            )
        status = row.get("status", "")
        if status and status != "graded":
            lines += ["", f"Status: {plain(status, e)}."]
        reasons = [plain(r, e) for r in row.get("reason", "").split("; ") if r.strip()]
        if reasons:
            lines += ["", "What the grader found:", ""] + [f"- {r}" for r in reasons]
        lines += [
            "",
            "The feedback page beside this file shows each test: what the visible tests "
            "compared, and which hidden tests failed (their code stays hidden).",
        ]
        if settings.MIN_MINUTES:
            lines.append(
                f"\nA section is graded at most once every {settings.MIN_MINUTES:g} minutes; "
                "a newer submission in that time waits until they have passed."
            )
        return "\n".join(lines) + "\n"

    def late_words(self, e: Entry, rules) -> str:
        kept = self.counted(e.student, e.section, rules)
        deadline = counted.due(rules, e.student, e.section)
        _, extended = rules.deadline(e.student, e.section)
        return (
            f"# {e.section}: late, not graded\n\n"
            f"Your submission of {when(e.arrived, rules)} came after the "
            f"{'extended ' if extended else ''}deadline ({when(deadline.timestamp(), rules)}). "
            f"Your submission of {when(kept.arrived, rules)}, on time, is the one that counts; "
            f"its result is in the folder feedback/{kept.stamp}/ beside this one.\n"
        )

    def waiting_words(self, e: Entry, rules) -> str:
        return (
            f"# {e.section}: waiting, graded at {when(e.waiting_until, rules)}\n\n"
            f"Your submission of {when(e.arrived, rules)} is graded when "
            f"{settings.MIN_MINUTES:g} minutes have passed since your last grading of this "
            "section (your instructor's rate limit). If you submit again before then, only the "
            "newest is graded.\n"
        )

    def superseded_words(self, e: Entry, best: Entry | None, rules) -> str:
        newer = f"your submission of {when(best.arrived, rules)}" if best else "another one"
        return (
            f"# {e.section}: not graded, a newer one was\n\n"
            f"Your submission of {when(e.arrived, rules)} was not graded: {newer} came before "
            "the rate limit let it be graded, and is the one that counts.\n"
        )

    def tell(self, e: Entry, text: str, pages: list[Path] = ()) -> None:
        """result.md (and the feedback pages) into the submission's feedback folder,
        ~student/<section>/feedback/<timestamp>/, where nbgrader's Fetch Feedback puts its."""
        try:
            account = pwd.getpwnam(e.student)
        except KeyError:
            return  # no such Unix account (a test that submits as root)
        files = {page.name: page.read_bytes() for page in pages}  # the course's: root reads
        files["result.md"] = text.encode("utf-8")
        folder = Path(account.pw_dir) / e.section / "feedback" / e.stamp
        if not write_as(account, folder, files):
            print(f"could not write {e.student}'s feedback into {folder}", flush=True)

    def run_forever(self) -> None:
        while True:
            self.scan()
            chosen = self.ready()
            if chosen:
                self.grade(chosen)
            elif self.report_due is not None and time.time() >= self.report_due:
                self.build_report()
            else:
                time.sleep(POLL_S)


def write_as(account: pwd.struct_passwd, folder: Path, files: dict[str, bytes]) -> bool:
    """Write ``files`` into ``folder`` (made if missing) as the student's account itself: a
    child process that has given up root's rights first, so that a link the student planted in
    their home leads nowhere the student could not write anyway. Folders 0700, files 0600."""
    pid = os.fork()
    if pid == 0:  # the child: the student's rights, then the files
        code = 1
        try:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            os.umask(0o077)
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in files.items():
                (folder / name).write_bytes(data)
            code = 0
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def when(unix: float, rules) -> str:
    """A moment as the student reads it: to the second, in the course's time zone."""
    tz = rules.timezone
    name = getattr(tz, "key", None) or "UTC"
    return f"{dt.datetime.fromtimestamp(unix, tz):%Y-%m-%d %H:%M:%S} {name}"


def points(value) -> str:
    """A score as the feedback page writes it (its template: ``score | float | round(2)``)."""
    try:
        return str(round(float(value), 2))
    except (TypeError, ValueError):
        return "?"


GRADER_PATH = re.compile(r"\S*autograder/(?:submitted|feedback)/[^/\s]+/[^/\s]+/")


def plain(text: str, e: Entry) -> str:
    """The grader's words without its paths: a notebook is named as the student sees it."""
    text = GRADER_PATH.sub(f"{e.section}/", text)
    return text.replace(str(settings.ROOT) + "/", "")


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
