"""The resume journal: a class run that is killed picks up where it stopped.

Each graded submission is appended to ``.work/journal.jsonl`` (and synced) as soon as it is
done, with a digest of the student's files. ``.work/run.json`` holds the run's arguments
while it is unfinished. A run started again with the same arguments keeps the journaled
results whose files did not change and grades the rest; a finished run moves its journal to
``.work/last-run.jsonl``, so the next run starts over.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from autograder import course, staging
from autograder.results import Result

Job = tuple[str, str]  # (student id, section)


@dataclass
class Journal:
    work: Path = course.WORK  # the autograder's scratch folder
    submitted: Path = course.SUBMITTED  # <student>/<section>/ folders, digested per entry

    @property
    def run_state(self) -> Path:
        return self.work / "run.json"

    @property
    def entries(self) -> Path:
        return self.work / "journal.jsonl"

    @property
    def last_run(self) -> Path:
        return self.work / "last-run.jsonl"

    def start(self, jobs: list[Job], run_key: dict) -> dict[Job, Result]:
        """Begin a run of ``jobs``: the results an interrupted run of the same key journaled
        for files that have not changed since. The journal then holds only those."""
        self.work.mkdir(parents=True, exist_ok=True)
        done = self._resumable(jobs, run_key)
        self._write([self._entry(result) for result in done.values()], "w")
        self.run_state.write_text(json.dumps(run_key))
        return done

    def _resumable(self, jobs: list[Job], run_key: dict) -> dict[Job, Result]:
        if not (self.run_state.is_file() and self.entries.is_file()):
            return {}
        if json.loads(self.run_state.read_text()) != json.loads(json.dumps(run_key)):
            return {}  # other arguments (tuples compare as lists once in JSON)
        done = {}
        for line in self.entries.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the kill
            key = (entry["student_id"], entry["section"])
            if key in jobs and entry["digest"] == self._digest(key):
                done[key] = Result(**entry["result"])
        return done

    def record(self, result: Result) -> None:
        """Append ``result``; it is on disk when this returns."""
        self._write([self._entry(result)], "a")

    def _entry(self, result: Result) -> dict:
        return {
            "student_id": result.student_id,
            "section": result.section,
            "digest": self._digest((result.student_id, result.section)),
            "result": asdict(result),
        }

    def _write(self, entries: list[dict], mode: str) -> None:
        with self.entries.open(mode) as f:
            f.write("".join(json.dumps(entry) + "\n" for entry in entries))
            f.flush()
            os.fsync(f.fileno())

    def finish(self) -> None:
        """The run is complete: the next one starts over."""
        if self.entries.is_file():
            os.replace(self.entries, self.last_run)
        self.run_state.unlink(missing_ok=True)

    def _digest(self, job: Job) -> str:
        return staging.digest(self.submitted / job[0] / job[1])
