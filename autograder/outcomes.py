"""Every way grading can end, as data: one small record type per outcome, with its words.

The parts of the autograder talk through these records, not through words in outputs:

* the execute step (:class:`autograder.nbgrader_plugins.ExecuteUntilKernelDeath`) records
  what happened while a cell ran (:class:`CellOutcome`: the kernel died or was lost, the cell
  timed out, the tests were tampered with, output was cut) as JSON in that cell's metadata
  (:func:`record`). The error output it also writes, so that nbgrader scores the test 0, is
  the record's :meth:`CellOutcome.output`;
* grading one submission (:mod:`autograder.worker`) reads them back (:func:`recorded`), adds
  what it found itself (a missing or invalid notebook, the failed tests from the gradebook,
  nbgrader or the autograder failing, repairs), and :func:`autograder.results.words` turns the
  list into the ``status`` and ``reason`` of grades.csv from each record's :meth:`phrase` and
  its flags (``problem``, ``note``, ``fatal``);
* the feedback filter (:class:`autograder.nbgrader_plugins.HideHiddenTests`) keeps the outputs
  that records wrote (:func:`wrote`).

To add an outcome: a class here (its fields, its words and its flags), and its example in
tests/grader/test_outcomes.py; nothing else changes.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_output

METADATA_KEY = "autograder"  # cell.metadata["autograder"]["outcomes"]: the records, as JSON
GRADED, MISSING, ERROR = "graded", "missing", "error"  # the first word of every status
KINDS: dict[str, type[Outcome]] = {}  # class name -> class, for reading records back


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One thing that happened while grading a submission."""

    problem: ClassVar[bool] = False  # named in the status, which then reads "error: ..."
    note: ClassVar[bool] = False  # named in the reason, for the instructor
    fatal: ClassVar[bool] = False  # the submission scores 0 and the status names only this

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "phrase" in vars(cls):  # a kind of its own, not a base such as CellOutcome
            KINDS[cls.__name__] = cls

    def phrase(self) -> str:
        """The words of this outcome in grades.csv."""
        raise NotImplementedError

    def page(self) -> str:
        """What the feedback page of a notebook that scores 0 for this reason says."""
        return f"{self.phrase()}. It scores 0."

    def to_json(self) -> dict[str, Any]:
        return {"outcome": type(self).__name__, **asdict(self)}


def from_json(data: dict[str, Any]) -> Outcome:
    """The record :meth:`Outcome.to_json` wrote; ValueError for anything else."""
    kind = KINDS.get(str(data.get("outcome")))
    if kind is None:
        raise ValueError(f"not an outcome record: {data!r}")
    names = {f.name for f in fields(kind)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
    return kind(**values)


# --- names quoted in reports ----------------------------------------------------------------

# Errors of the libraries the course uses, by name (the grader does not import them).
LIBRARY_ERRORS = frozenset(
    {
        "OutOfMemoryError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError",
        "LinAlgError", "AxisError", "UFuncTypeError", "JSONDecodeError", "PicklingError",
        "UnpicklingError", "CellExecutionError", "CellTimeoutError", "DeadKernelError",
        "BrokenProcessPool", "ProcessRaisedException", "ProcessExitedException",
        "HiddenTestFailed",
    }
)  # fmt: skip
NAME_CHARS = 60
UNLISTED_ERROR = "an error class of the notebook's own"


@functools.cache
def _error_names() -> frozenset[str]:
    """Every error name a report may quote: the built-in exceptions, the libraries' above,
    the autograder's own, and every class of the course package (read from its files)."""
    import builtins
    import importlib.util

    names = {n for n, v in vars(builtins).items() if isinstance(v, type) and
             issubclass(v, BaseException)} | LIBRARY_ERRORS  # fmt: skip
    spec = importlib.util.find_spec("distopt")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for path in Path(folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8", errors="replace")
            names.update(re.findall(r"^\s*class\s+([A-Za-z_]\w*)", text, re.MULTILINE))
    return frozenset(names)


def error_name(ename: object) -> str:
    """``ename`` where a report may quote it, else :data:`UNLISTED_ERROR`.

    An error's name comes from the kernel, and the student's code can raise a class named
    with any text (``type(base64_of_hidden_lines, (Exception,), {})``): only names the grader
    knows without the kernel are quoted (:func:`_error_names`, and the outcomes' own)."""
    if not isinstance(ename, str) or not ename or len(ename) > NAME_CHARS:
        return UNLISTED_ERROR if ename else ""
    own = {kind.ename for kind in KINDS.values() if getattr(kind, "ename", None)}
    return ename if ename in _error_names() or ename in own else UNLISTED_ERROR


def _bounded(text: object, limit: int = 200) -> str:
    """What the grader read itself (a file's name, a parser's complaint), at most ``limit``
    characters on one line."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --- outcomes of a submission or a notebook, found by the grader ---------------------------


@dataclass(frozen=True, kw_only=True)
class Graded(Outcome):
    """nbgrader ran ``notebook`` to the end (failing tests are normal)."""

    notebook: str

    def phrase(self) -> str:
        return GRADED


@dataclass(frozen=True, kw_only=True)
class Missing(Outcome):
    """No ``<notebook>.ipynb`` in the student's section folder: 0 points."""

    problem = True
    notebook: str
    found: tuple[str, ...] = ()  # the .ipynb files that are there instead

    def _hint(self) -> str:
        found = ", ".join(_bounded(name, 60) for name in self.found[:5])
        notebook = _bounded(self.notebook, 60)
        return f"; found {found}: rename it to {notebook}.ipynb" if found else ""

    def phrase(self) -> str:
        return f"missing {_bounded(self.notebook, 60)}.ipynb{self._hint()}"

    def page(self) -> str:
        notebook = _bounded(self.notebook, 60)
        return f"No submission of {notebook}.ipynb was found{self._hint()}. It scores 0."


@dataclass(frozen=True, kw_only=True)
class InvalidNotebook(Outcome):
    """The file is not notebook JSON (or is empty): 0 points."""

    problem = True
    file: str
    why: str

    def phrase(self) -> str:
        return f"{_bounded(self.file, 60)} is not a valid notebook ({_bounded(self.why, 120)})"


@dataclass(frozen=True, kw_only=True)
class UnreadableCells(Outcome):
    """The notebook's cells could not be read to stage it (autograder.staging)."""

    problem = fatal = True
    error: str

    def phrase(self) -> str:
        return f"cannot read the notebook's cells ({self.error})"[:200]


@dataclass(frozen=True, kw_only=True)
class NbgraderFailed(Outcome):
    """nbgrader's autograde failed on the submission; ``last_line`` quotes its log."""

    problem = fatal = True
    last_line: str

    def phrase(self) -> str:
        return f"nbgrader could not grade it: {_bounded(self.last_line)}"


@dataclass(frozen=True, kw_only=True)
class AutograderFailure(Outcome):
    """The autograder itself raised (or its worker died) on this submission."""

    problem = fatal = True
    error: str  # "TypeError: ..."

    def phrase(self) -> str:
        return f"autograder failure ({_bounded(self.error)})"


@dataclass(frozen=True, kw_only=True)
class NoFeedback(Outcome):
    """nbgrader graded the notebook but wrote no feedback page for it."""

    problem = True
    notebook: str

    def phrase(self) -> str:
        return f"no feedback page for {_bounded(self.notebook, 60)}"


@dataclass(frozen=True, kw_only=True)
class FailedTest(Outcome):
    """A graded test scored less than its points (from the gradebook)."""

    grade_id: str
    why: str = ""  # the error it raised, or the label of what the execute step recorded
    likely: str = ""  # the catalogued mistake it looks like (autograder.likely_bugs.reason)

    def phrase(self) -> str:
        labels = {kind.label for kind in KINDS.values() if getattr(kind, "label", "")}
        why = self.why if self.why in labels else error_name(self.why)
        # the likely bug is the grader's own words (a catalogue name, fixed words, numbers):
        # bounded generously, so that its ", exact match of N catalogued cases" stays whole
        said = "; ".join(filter(None, [why, _bounded(self.likely, 600)]))
        grade_id = _bounded(self.grade_id, 60)
        return f"{grade_id} ({said})" if said else grade_id


@dataclass(frozen=True, kw_only=True)
class CellRaised(Outcome):
    """An ordinary or answer cell raised (the tests that need it fail on their own)."""

    cell: int  # 1-based position in the autograded notebook
    grade_id: str | None = None
    ename: str

    def phrase(self) -> str:
        return f"{_where(self.cell, self.grade_id)} raised {error_name(self.ename)}"


@dataclass(frozen=True, kw_only=True)
class Repaired(Outcome):
    """What the autograder repaired or noticed in the submission (see autograder.staging)."""

    note = True
    what: str

    def phrase(self) -> str:
        return _bounded(self.what, 900)


# --- outcomes of one cell, recorded by the execute step -----------------------------------


def _where(cell: int, grade_id: str | None) -> str:
    return f"cell {cell}" + (f" ({_bounded(grade_id, 60)})" if grade_id else "")


@dataclass(frozen=True, kw_only=True)
class CellOutcome(Outcome):
    """What happened while the execute step ran one cell; kept in that cell's metadata."""

    ename: ClassVar[str | None] = None  # the name of the error output it writes, if any
    label: ClassVar[str] = ""  # why a test in this cell failed, in a word or two
    ends_status: ClassVar[bool] = False  # later cells' outcomes of the notebook go unnamed
    cell: int  # 1-based position in the autograded notebook
    grade_id: str | None = None

    @property
    def where(self) -> str:
        return _where(self.cell, self.grade_id)

    def message(self) -> str:
        """The text of the output written into the cell (the student reads it)."""
        raise NotImplementedError

    def output(self) -> NotebookNode:
        """The output this record writes into its cell: an error, so nbgrader scores 0."""
        text = self.message()
        return new_output(
            "error", ename=self.ename, evalue=text, traceback=[f"{self.ename}: {text}"]
        )


@dataclass(frozen=True, kw_only=True)
class KernelDied(CellOutcome):
    """The student's code killed the kernel (``os._exit``, a crash, out of memory)."""

    problem = True
    ename, label = "KernelDied", "kernel died"
    cause: str

    def phrase(self) -> str:
        return f"kernel died in {self.where}"

    def message(self) -> str:
        return f"the kernel died while running this cell ({_bounded(self.cause, 100)})"


@dataclass(frozen=True, kw_only=True)
class KernelLost(CellOutcome):
    """Running the cell raised in the grader (an unreadable message, a broken channel)."""

    problem = True
    ename, label = "KernelLost", "kernel lost"
    cause: str  # "ValueError: ..."

    def phrase(self) -> str:
        return f"kernel lost in {self.where}"

    def message(self) -> str:
        return f"the grader lost the kernel while running this cell ({_bounded(self.cause, 100)})"


@dataclass(frozen=True, kw_only=True)
class NotRun(CellOutcome):
    """The kernel was gone before this cell: it fails without running."""

    ename, label = "NotRun", "not run"
    after: int  # the cell in which the kernel was lost

    def phrase(self) -> str:
        return f"{self.where} not run"

    def message(self) -> str:
        return f"not run: the kernel was lost in cell {self.after}, before this cell"


@dataclass(frozen=True, kw_only=True)
class CellTimeout(CellOutcome):
    """The cell ran past its time limit and was interrupted; later cells still run."""

    problem = True
    ename, label = "CellTimeoutError", "timeout"
    limit_s: float

    def phrase(self) -> str:
        return f"timeout in {self.where}"

    def message(self) -> str:
        return f"the cell ran past its time limit of {self.limit_s:g} s and was interrupted"


@dataclass(frozen=True, kw_only=True)
class Tampered(CellOutcome):
    """Before or while this test ran, the notebook's code had changed what tests rely on."""

    problem = ends_status = True
    ename, label = "IntegrityError", "tampering"
    when: str  # "before" or "while running"
    changes: tuple[str, ...]  # from autograder.integrity.differences

    def _shown(self) -> str:
        # integrity.differences words each change from a fixed vocabulary; bounded here too
        more = len(self.changes) - 3
        shown = "; ".join(_bounded(change, 120) for change in self.changes[:3])
        return shown + (f" (and {more} more)" if more > 0 else "")

    def phrase(self) -> str:
        return f"tampering detected at {self.where}: {self._shown()}"

    def message(self) -> str:
        return (
            f"this test scores 0: {_bounded(self.when, 20)} it, the notebook's code had changed "
            f"what tests "
            f"rely on: {self._shown()}"
        )


@dataclass(frozen=True, kw_only=True)
class OutputCut(CellOutcome):
    """The cell printed more than the cap: the rest was dropped (errors are always kept)."""

    note = True
    limit_bytes: int

    def phrase(self) -> str:
        return f"printed output of {self.where} cut after {self.limit_bytes} bytes"

    def message(self) -> str:
        return f"[the autograder cut this cell's output here: more than {self.limit_bytes} bytes]"

    def output(self) -> NotebookNode:
        return new_output("stream", name="stdout", text=self.message() + "\n")


@dataclass(frozen=True, kw_only=True)
class StraysEnded(CellOutcome):
    """The cell failed and left processes running: the grader ended them, so that they do
    not starve the cells after it (autograder/strays.py)."""

    note = True
    count: int

    def phrase(self) -> str:
        return f"{self.where} left {self.count} processes running; they were ended"

    def message(self) -> str:
        return f"[the autograder ended {self.count} processes this cell left running]"

    def output(self) -> NotebookNode:
        return new_output("stream", name="stdout", text=self.message() + "\n")


@dataclass(frozen=True, kw_only=True)
class ShowOnly(CellOutcome):
    """A cell the course tags show-only was not run: unchanged, and no cell that ran needs a
    name it assigns (autograder/show_only.py). Named nowhere but on the feedback page."""

    def phrase(self) -> str:
        return f"{self.where} only shows: not run when grading"

    def message(self) -> str:
        return (
            "[not run when grading: this cell only shows (a figure, a sweep, a measurement) "
            "and no test reads what it makes; run it in JupyterLab to see it]"
        )

    def output(self) -> NotebookNode:
        return new_output("stream", name="stdout", text=self.message() + "\n")


# --- records in notebooks ------------------------------------------------------------------


def record(cell: NotebookNode, outcome: CellOutcome, *, output: bool = True) -> None:
    """Keep ``outcome`` in ``cell``'s metadata and (``output``) write its output, once each."""
    records = cell.metadata.setdefault(METADATA_KEY, {}).setdefault("outcomes", [])
    if outcome.to_json() not in records:
        records.append(outcome.to_json())
    written = outcome.output()
    if output and not any(_same(o, written) for o in cell.get("outputs", [])):
        cell.outputs = [*cell.get("outputs", []), written]


def recorded(cell: NotebookNode) -> list[CellOutcome]:
    """The outcomes the execute step recorded in ``cell``, in the order they happened."""
    records = cell.get("metadata", {}).get(METADATA_KEY, {}).get("outcomes", [])
    return [o for o in map(from_json, records) if isinstance(o, CellOutcome)]


def clear(nb: NotebookNode) -> None:
    """Remove every record: a submission may carry forged ones."""
    for cell in nb.cells:
        cell.get("metadata", {}).pop(METADATA_KEY, None)


def wrote(cell: NotebookNode, output: NotebookNode) -> bool:
    """Whether ``output`` is one that a record of ``cell`` wrote (not the student's code)."""
    return any(_same(output, o.output()) for o in recorded(cell))


def _same(a: dict, b: dict) -> bool:
    keys = ("output_type", "ename", "evalue", "text")
    return all(a.get(k) == b.get(k) for k in keys)
