"""A class run that is killed picks up where it stopped, from the gradebook's results table.

The results table (:mod:`autograder.store`) is the one store of results: each graded
submission's row is written there as soon as it is graded, in one transaction, with the
digest of the student's files and the id of the class run that graded it. What this module
keeps beside it is no result, only which run is unfinished: ``.work/run.json`` (a shard's in
its own ``.work/shard-i-of-n/``) holds that run's id and arguments until it finishes. A run
started again with the same arguments takes over that id, keeps the rows it stored for files
that have not changed since, and grades the rest; a finished run removes run.json, so the
next run starts over under a new id.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from autograder import course, staging
from autograder.results import Result
from autograder.store import Results

Job = tuple[str, str]  # (student id, section)


@dataclass(frozen=True)
class RunState:
    work: Path = course.WORK  # the run's scratch folder (a shard's own)
    submitted: Path = course.SUBMITTED  # <student>/<section>/ folders, digested per result

    @property
    def path(self) -> Path:
        return self.work / "run.json"

    def start(
        self, jobs: list[Job], run_key: dict, table: Results
    ) -> tuple[str, dict[Job, Result]]:
        """Begin a run of ``jobs``: its id, and the results that an interrupted run of the same
        key stored in ``table`` for files that have not changed since."""
        key = json.loads(json.dumps(run_key))  # tuples compare as lists once in JSON
        unfinished = self._read()
        if unfinished is not None and unfinished.get("key") == key:
            run_id, wanted = unfinished["run_id"], set(jobs)
            done = {
                job: result
                for job, (result, digest) in table.results(run_id=run_id).items()
                if job in wanted and digest == self.digest(job)
            }
            return run_id, done
        run_id = uuid.uuid4().hex
        self.work.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"run_id": run_id, "key": key}))
        os.replace(tmp, self.path)  # a kill leaves the old state or the new, never half
        return run_id, {}

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def finish(self) -> None:
        """The run is complete: the next one starts over."""
        self.path.unlink(missing_ok=True)

    def digest(self, job: Job) -> str:
        """The digest of the student's files of ``job``, as a stored row keeps it."""
        return staging.digest(self.submitted / job[0] / job[1])
