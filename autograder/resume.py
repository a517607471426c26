"""A class run that is killed picks up where it stopped, and a new run regrades only what
changed, both from the gradebook's results table.

The results table (:mod:`autograder.store`) is the one store of results: each graded
submission's row is written there as soon as it is graded, in one transaction, with the
digest of the student's files and the id of the class run that graded it. What this module
keeps beside it is no result, only which run is unfinished: ``.work/run.json`` (a shard's in
its own ``.work/shard-i-of-n/``) holds that run's id and arguments until it finishes. A run
started again with the same arguments takes over that id, keeps the rows it stored for files
that have not changed since, and grades the rest; a finished run removes run.json, so the
next run starts over under a new id.

**Only what changed is regraded.** A stored row's digest is that of the student's files *and*
of everything else its grade depends on (:func:`grading_keys`): the section's reference
notebook (its cells and their nbgrader metadata: answers, tests, points), the grader's own
code and tables (autograder/ and the distopt package), and the settings of the run that bear
on it (the section's cell timeout, the sandbox). A new run keeps every stored row whose
digest is still the same and grades the rest; ``make grade FORCE=1`` (``--force``) regrades
everything. Late penalties, overrides and the roster are applied when the report is built,
from the stored autograded score, so changing them needs no regrade.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder import course, staging
from autograder.results import BUSY_TIMEOUT, Result
from autograder.store import Results

Job = tuple[str, str]  # (student id, section)


# What the grader is made of: a change to any of these regrades every submission.
# (Not autograder/submitted/: a student's stray .py file there is no part of the grader.)
GRADER_FILES = ("autograder/*.py", "autograder/templates/**/*", "autograder/likely_bugs.json",
                "shared/distopt/**/*.py", "shared/distopt/likely_bugs.json")  # fmt: skip


@functools.lru_cache(maxsize=1)
def grader_version(root: Path = course.ROOT) -> str:
    """A hash of the grader's own code and tables (GRADER_FILES)."""
    h = hashlib.sha256()
    paths = {p for pattern in GRADER_FILES for p in root.glob(pattern) if p.is_file()}
    for path in sorted(paths):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def section_version(section: str, root: Path = course.ROOT) -> str:
    """A hash of a section's reference notebooks as grading sees them: each cell's type,
    source and nbgrader metadata (the stored outputs of a re-execution do not count)."""
    h = hashlib.sha256()
    for path in sorted((root / "solutions" / section).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cells = [
            [c.cell_type, c.source, c.metadata.get("nbgrader", {})] for c in nb.cells
        ]  # fmt: skip
        h.update(path.name.encode() + b"\0" + json.dumps(cells, sort_keys=True).encode())
    return h.hexdigest()


def grading_keys(sections: list[str], settings: dict[str, object]) -> dict[str, str]:
    """Per section, a hash of everything but the student's files that its grades depend on:
    the grader's version, the section's reference notebooks, and ``settings`` (what of the
    run's settings bears on the section's grades, e.g. its cell timeout and the sandbox)."""
    keys = {}
    for section in sections:
        parts = [
            grader_version(),
            section_version(section),
            json.dumps(settings[section], sort_keys=True),
        ]
        keys[section] = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return keys


def busy_timeout(result: Result, load: float | None = None, cores: int | None = None) -> str:
    """For a submission that ran out of time while the machine had more runnable processes
    than cores (a course server's students' labs beside the grader): the words that say so,
    else "". Such a result is stored without a digest, so the next run grades it again; a
    timeout on an idle machine is the answer's own."""
    if not result.status.startswith("error: timeout"):
        return ""
    load = os.getloadavg()[0] if load is None else load
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    if load <= cores:
        return ""
    return f"{BUSY_TIMEOUT} (load {load:.1f} on {cores} cores): the next make grade grades it again"


@dataclass(frozen=True)
class RunState:
    work: Path = course.WORK  # the run's scratch folder (a shard's own)
    submitted: Path = course.SUBMITTED  # <student>/<section>/ folders, digested per result
    keys: dict[str, str] = field(default_factory=dict)  # section -> grading_keys' hash

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
        return self._new_run(key), {}

    def unchanged(self, table: Results, wanted: set[Job]) -> dict[Job, Result]:
        """The stored results of ``wanted`` whose files and grading key are unchanged."""
        return {
            job: result
            for job, (result, digest) in table.results().items()
            if job in wanted and digest == self.digest(job)
        }

    def _new_run(self, key: dict) -> str:
        run_id = uuid.uuid4().hex
        self.work.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"run_id": run_id, "key": key}))
        os.replace(tmp, self.path)  # a kill leaves the old state or the new, never half
        return run_id

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def finish(self) -> None:
        """The run is complete: the next one starts over."""
        self.path.unlink(missing_ok=True)

    def digest(self, job: Job) -> str:
        """The digest of the student's files of ``job`` and of the section's grading key, as
        a stored row keeps it."""
        files = staging.digest(self.submitted / job[0] / job[1])
        return f"{files}:{self.keys[job[1]]}" if job[1] in self.keys else files
