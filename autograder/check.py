"""Self-check a student notebook before submitting it.

    python -m autograder.check notebooks/<section>/<notebook>.ipynb     (or: make check NB=...)

Runs the notebook from top to bottom with nbval and reports, cell by cell:

* whether each cell that prints a reference number prints what the reference notebook in
  solutions/ printed (your functions feed those cells, so a wrong answer shows up here);
* whether each visible test cell passes;
* whether each measured number stays inside the band the course states for it (cells whose
  digits depend on the CPU are not compared digit by digit: their claims are checked with a
  tolerance, see ``distopt.claims``, and a miss is reported in words);
* any other cell that raised an error;
* for a failed visible test whose error looks like a typical mistake of the course's catalogue
  (:mod:`autograder.likely_bugs`), that mistake in words.

Only outputs of ordinary cells are taken from solutions/; no solution code and no hidden
test is ever read from there, so nothing is revealed that the reference numbers don't show.
Your notebook file is not changed: a copy runs in a temporary folder.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import nbformat
import pytest

from autograder import course, ipc, likely_bugs

SANITIZE = course.AUTOGRADER / "nbval_sanitize.cfg"
IGNORE_MARKERS = ("# NBVAL_IGNORE_OUTPUT", "# NBVAL_SKIP")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class CheckError(Exception):
    """The notebook cannot be checked; the message says what to do."""


def _kind(cell) -> str:
    if course.is_test(cell):
        return "test"
    if cell.metadata.get("nbgrader", {}).get("solution"):
        return "answer"
    return "plain"


def _compares_output(cell) -> bool:
    lines = cell.source.splitlines()
    return (
        cell.cell_type == "code"
        and _kind(cell) == "plain"
        and cell.get("execution_count") is not None
        and bool(cell.get("outputs"))
        and not any(line.strip() in IGNORE_MARKERS for line in lines)
    )


def find_reference(notebook: Path) -> Path:
    section = notebook.resolve().parent.name
    reference = course.SOLUTIONS / section / notebook.name
    if not reference.is_file():
        known = ", ".join(course.sections())
        raise CheckError(
            f"{notebook} is not a course notebook: expected it under notebooks/<section>/ with "
            f"its original name (sections: {known})."
        )
    return reference


def build_checked_copy(notebook: Path, reference: Path) -> tuple[nbformat.NotebookNode, dict]:
    """The student's notebook with the reference outputs put into the cells that print them.

    Returns the notebook and, per code-cell number (nbval's "Cell N"), what the cell is: its
    role, its position, where a person finds it, and its test's grade_id ("" if none).
    """
    try:
        student = nbformat.read(notebook, as_version=4)
    except Exception as exc:
        raise CheckError(
            f"{notebook} is not a readable notebook ({exc}). Restore it from git "
            "or download it again, then copy your answers back in."
        ) from exc
    expected = {
        cell.id: cell for cell in nbformat.read(reference, as_version=4).cells if "id" in cell
    }
    roles: dict[int, tuple[str, int, str, str]] = {}
    code_index = 0
    heading = ""
    for position, cell in enumerate(student.cells, start=1):
        if cell.cell_type == "markdown":
            heading = _heading(cell.source) or heading
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        ref = expected.get(cell.get("id"))
        role = _kind(cell)
        label = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if ref is not None and _compares_output(ref):
            cell.outputs, cell.execution_count = ref.outputs, ref.execution_count
            role = "reference output"
        where = _where(heading, label, cell.source, position)
        roles[code_index] = (role, position, where, label if role == "test" else "")
        code_index += 1
    return student, roles


def _heading(markdown: str) -> str:
    """The last heading of a markdown cell ("## 3. Exercise: ..."), without its marks."""
    found = [line.lstrip("#").strip() for line in markdown.splitlines() if line.startswith("#")]
    return found[-1] if found else ""


def _where(heading: str, label: str, source: str, position: int) -> str:
    """How a person finds a cell in JupyterLab, which shows no cell numbers: the heading
    above it, and its test's name or its first line; then its number counted from the top,
    markdown cells included, the number the feedback page and grades.csv use."""
    under = f'under "{heading}"' if heading else "at the top"
    if label:
        return f"{under}, {label} (cell {position})"
    first = next(
        (line.strip() for line in source.splitlines() if line.strip() and not line.startswith("#")),
        "",
    )
    shown = first if len(first) <= 48 else first[:45] + "..."
    return f'{under}, the cell "{shown}" (cell {position})'


class _Collector:
    """pytest plugin: keeps the result of every nbval item."""

    def __init__(self) -> None:
        self.reports: dict[int, tuple[str, str]] = {}

    def pytest_runtest_logreport(self, report) -> None:
        if report.when != "call" and not report.failed:
            return
        match = re.search(r"::Cell (\d+)", report.nodeid)
        if match:
            text = ANSI.sub("", str(report.longrepr)) if report.failed else ""
            self.reports[int(match.group(1))] = (report.outcome, text)


def _band_miss(text: str) -> str | None:
    """The message of a missed band (distopt.claims.OutsideBand) in an nbval failure, if any."""
    found = None
    for line in text.splitlines():
        match = re.match(r"^\s*(?:[\w.]*\.)?OutsideBand:\s*(.*)$", line)
        if match:
            found = match.group(1).strip()
    return found


def _relabelled(lines: list[str]) -> list[str]:
    """pytest's diff of ``reference_output == test_output`` in words: its "+" lines are the
    reference's, its "-" lines the student's; the lines that only guide the eye go."""
    out = []
    for line in lines:
        body = line.strip()
        if body.startswith("mismatch"):
            out.append("the output differs (" + body.removeprefix("mismatch").strip(" '") + "):")
        elif body.startswith("+ ") or body == "+":
            out.append("expected: " + line.split("+", 1)[1][1:])
        elif body.startswith("- ") or body == "-":
            out.append("yours:    " + line.split("-", 1)[1][1:])
    return out


def _reason(text: str) -> str:
    """The few lines of an nbval failure that say what differs or what was raised."""
    lines = [line for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "mismatch" in line:
            return "\n".join(_relabelled(lines[i : i + 12])[:9])
    errors = [line for line in lines if re.match(r"^\w*(Error|Exception)\b", line.strip())]
    return errors[-1].strip() if errors else (lines[-1] if lines else "failed")


def _error_of(text: str) -> tuple[str, str] | None:
    """The error's name and whole message in an nbval failure of a cell that raised."""
    header = re.search(r"^\s*([\w.]+)\s+Traceback \(most recent call last\)", text, re.M)
    if header is None:
        return None
    name = header.group(1)
    at = text.rfind(f"\n{name}: ")
    if at < 0:
        return name.rsplit(".", 1)[-1], ""
    return name.rsplit(".", 1)[-1], text[at + len(name) + 3 :].strip()


def _likely(section: str, grade_id: str, text: str) -> str:
    """The sentence naming the typical mistake a failed visible test's error looks like, or ""."""
    error = _error_of(text)
    if not grade_id or error is None:
        return ""
    found = likely_bugs.lookup(grade_id, *error, section=section)
    return likely_bugs.sentence(found) if found else ""


def run_check(notebook: Path) -> int:
    notebook = Path(notebook)
    if not notebook.is_file():
        raise CheckError(
            f"{notebook} does not exist. Usage: make check NB=notebooks/<section>/<notebook>.ipynb"
        )
    reference = find_reference(notebook)
    checked, roles = build_checked_copy(notebook, reference)
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
        for item in notebook.parent.iterdir():  # data files next to the notebook, if any
            if item.is_file() and item.suffix != ".ipynb":
                shutil.copy2(item, tmp)
        copy = Path(tmp) / notebook.name
        nbformat.write(checked, copy)
        collector = _Collector()
        print(
            f"Running a copy of {notebook.name} from top to bottom: the visible tests, and "
            "every cell that prints a reference number...",
            flush=True,
        )
        with contextlib.redirect_stdout(io.StringIO()):  # pytest's own lines name a temp folder
            pytest.main(
                [
                    str(copy),
                    "--nbval",
                    f"--nbval-sanitize-with={SANITIZE}",
                    "-q",
                    "--tb=no",
                    "-p",
                    "no:cacheprovider",
                    "--nbval-cell-timeout=300",
                    "-o",
                    "addopts=",
                    "--no-header",
                    "-W",
                    "ignore",
                ],
                plugins=[collector, ipc],
            )

    print(f"\nSelf-check of {notebook}")
    counts = {"reference output": [0, 0], "test": [0, 0]}
    problems = []
    section = notebook.resolve().parent.name
    for index, (role, _position, where, grade_id) in sorted(roles.items()):
        outcome, text = collector.reports.get(index, ("not run", ""))
        if role in counts:
            counts[role][1] += 1
            counts[role][0] += outcome == "passed"
        if outcome == "passed":
            continue
        name = where
        band = _band_miss(text)
        if band is not None:
            problems.append(
                f"  {name}: a measured number is outside the band the course states\n    "
                + textwrap.fill(band, width=88, subsequent_indent="    ")
            )
            continue
        reason = _reason(text)
        if "NotImplementedError" in reason:
            reason = "NotImplementedError: an exercise it uses is not answered yet"
        if "caused an exception" in text or role in ("answer", "plain"):
            what = {"test": "visible test fails", "answer": "your answer cell raises"}.get(
                role, "raises an error"
            )
        elif role == "reference output":
            what = "prints something other than the reference"
        else:
            what = "visible test fails"
        likely = _likely(section, grade_id, text) if what == "visible test fails" else ""
        if likely:
            reason += "\n" + textwrap.fill(likely, width=88)
        problems.append(f"  {name}: {what}\n    " + reason.replace("\n", "\n    "))
    print(
        f"  reference outputs matching: {counts['reference output'][0]} of "
        f"{counts['reference output'][1]}"
    )
    print(f"  visible tests passing:      {counts['test'][0]} of {counts['test'][1]}")
    if problems:
        print("\nTo look at:")
        print("\n".join(problems))
        print(
            "\nThe graded tests also include hidden cases; passing the visible ones is "
            "necessary, not sufficient."
        )
        return 1
    print("\nAll reference outputs match and all visible tests pass. Ready to submit.")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m autograder.check notebooks/<section>/<notebook>.ipynb")
        return 2
    try:
        return run_check(Path(args[0]))
    except CheckError as exc:
        print(f"self-check: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
