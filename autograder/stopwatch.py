"""Where a submission's grading time goes, step by step.

The worker process that grades a submission clears the stopwatch, the steps add their
seconds while they run (``with stopwatch.step("fingerprints"): ...``), and the worker writes
one line of JSON per submission to ``timings.jsonl`` in the run's scratch folder.
``make bench-grade`` sums those lines into the cost of each step the grader adds to running
the notebook (:func:`table`); nothing in grading reads them.

The steps, in the order a submission meets them (:data:`STEPS`); a step inside another is
counted in its own line only, so the lines add up to the submission's time in the worker:

* ``stage``: finding the files, the private repaired copy, the needs-review scan;
* ``plan``: which show-only cells are left out (autograder.show_only);
* ``kernel start``: launching the kernel (sandboxed: the zygote forks it);
* ``kernel ready``: from its launch until it answers (the sandbox and ipykernel starting);
* ``kernel stop``: shutting it down;
* ``kernel``: the rest of running the notebook in it (nbclient's own work between cells);
* ``cells``: running the notebook's cells, tests included: what plain execution costs too;
* ``fingerprints``: the integrity check's silent requests around cells (autograder.integrity);
* ``strays``: ending what a failed cell left running (autograder.strays);
* ``nbgrader``: nbgrader's own autograde steps besides execution (its gradebook, the
  preprocessors that score, the autograded notebook written);
* ``seal``: hiding hidden tests and sealing the page (HideHiddenTests);
* ``page``: the rest of the feedback page (nbgrader's feedback, nbconvert's HTML);
* ``read back``: reading the outcomes and the score back from the notebook and the gradebook.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

STEPS = (
    "stage",
    "plan",
    "kernel start",
    "kernel ready",
    "kernel stop",
    "kernel",
    "cells",
    "fingerprints",
    "strays",
    "nbgrader",
    "seal",
    "page",
    "read back",
)
# what this grader adds to nbgrader and to running the notebook
ADDED = ("stage", "plan", "fingerprints", "strays", "seal", "read back")

_spent: Counter[str] = Counter()
_open: list[list] = []  # the steps running now, outermost first: [name, seconds of inner steps]


@contextmanager
def step(name: str) -> Iterator[None]:
    """Count the seconds of the block as ``name``'s, less what steps inside it count."""
    start = time.perf_counter()
    _open.append([name, 0.0])
    try:
        yield
    finally:
        took = time.perf_counter() - start
        _, inner = _open.pop()
        _spent[name] += took - inner
        if _open:
            _open[-1][1] += took


def reset() -> None:
    _spent.clear()
    _open.clear()


def spent() -> dict[str, float]:
    """Seconds per step since :func:`reset`, rounded to the millisecond."""
    return {name: round(seconds, 3) for name, seconds in _spent.items()}


def write(path: Path, student_id: str, section: str) -> None:
    """Append this submission's line to ``path`` (one short write: atomic between workers)."""
    _append(path, {"student": student_id, "section": section, "seconds": spent()})


def write_run(path: Path, seconds: dict[str, float]) -> None:
    """Append the run's own line (autograder.grade.RUN_SECONDS): no student, no section."""
    _append(path, {"run": {name: round(value, 3) for name, value in seconds.items()}})


def _append(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read(path: Path) -> list[dict]:
    """The lines :func:`write` wrote (none if the file is missing)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def totals(lines: Iterable[dict]) -> dict[str, float]:
    """Seconds per step over ``lines``, every step of :data:`STEPS` present."""
    total = Counter({name: 0.0 for name in STEPS})
    for line in lines:
        total.update(line.get("seconds", {}))
    return dict(total)


def table(lines: list[dict]) -> str:
    """A markdown table: each step's seconds in all and per submission, and its share."""
    total = totals(lines)
    whole = sum(total.values()) or 1.0
    count = max(sum("seconds" in line for line in lines), 1)
    rows = [
        "| step | seconds | per submission | share | added by this grader |",
        "|---|---|---|---|---|",
    ]
    for name in sorted(total, key=lambda n: STEPS.index(n) if n in STEPS else len(STEPS)):
        seconds = total[name]
        rows.append(
            f"| {name} | {seconds:.2f} | {seconds / count * 1000:.0f} ms | "
            f"{seconds / whole:.1%} | {'yes' if name in ADDED else ''} |"
        )
    return "\n".join(rows)
