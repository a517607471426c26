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
import os
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
    if course.is_answer(cell):
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
    """pytest plugin: keeps the result of every nbval item, how long each took, and how busy
    the machine was (the highest 1-minute load average seen between items)."""

    def __init__(self) -> None:
        self.reports: dict[int, tuple[str, str]] = {}
        self.seconds: dict[int, float] = {}
        self.load = _load()

    def pytest_runtest_logreport(self, report) -> None:
        self.load = max(self.load, _load())
        if report.when != "call" and not report.failed:
            return
        match = re.search(r"::Cell (\d+)", report.nodeid)
        if match and report.when == "call":
            self.seconds[int(match.group(1))] = report.duration
        if match:
            text = ANSI.sub("", str(report.longrepr)) if report.failed else ""
            self.reports[int(match.group(1))] = (report.outcome, text)


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not every system has one
        return 0.0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def busy(load: float, cores: int) -> bool:
    """More runnable processes than cores, on average over the last minute: timings stretch."""
    return load > cores


def timing_summary(seconds: dict[int, float], roles: dict, load: float, cores: int) -> list[str]:
    """How long the check took, its three slowest parts (the cells under one heading), and how
    busy the machine was while it ran."""
    parts: dict[str, float] = {}
    for index, spent in seconds.items():
        where = roles[index][2] if index in roles else "elsewhere"
        heading = where.split('", ')[0] + '"' if where.startswith('under "') else "at the top"
        parts[heading] = parts.get(heading, 0.0) + spent
    slowest = sorted(parts.items(), key=lambda item: -item[1])[:3]
    lines = [
        f"  time: {sum(seconds.values()):.0f} s in all; slowest parts: "
        + "; ".join(f"{heading} {spent:.0f} s" for heading, spent in slowest)
    ]
    state = (
        "busy: times stretch, and a timing check may miss its band; re-run when it is quieter"
        if busy(load, cores)
        else "not busy"
    )
    lines.append(f"  machine: load {load:.1f} on {cores} core{'s' * (cores > 1)} ({state})")
    return lines


def _band_miss(text: str) -> str | None:
    """The message of a missed band (distopt.claims.OutsideBand) in an nbval failure, if any."""
    found = None
    for line in text.splitlines():
        match = re.match(r"^\s*(?:[\w.]*\.)?OutsideBand:\s*(.*)$", line)
        if match:
            found = match.group(1).strip()
    return found


DIFF_PAIRS = 4  # differing output lines shown per cell, each as yours/expected
LINE_CHARS = 110  # a longer output line is shown around its first difference, cut between words


def _clip(line: str, around: int) -> str:
    """``line`` cut to about LINE_CHARS characters around column ``around``, only where a space
    is, so that no word or number is split; "..." marks each cut."""
    if len(line) <= LINE_CHARS:
        return line
    start = around - LINE_CHARS // 3 if around > 2 * LINE_CHARS // 3 else 0
    if start:
        space = line.rfind(" ", 0, start + 1)
        start = space + 1 if space >= 0 else 0
    end = start + LINE_CHARS
    if end < len(line):
        space = line.find(" ", end)
        end = space if space >= 0 else len(line)
    return ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")


def _first_difference(a: str, b: str) -> int:
    same = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(same, min(len(a), len(b)))


def _side(lines: list[str], mark: str) -> list[str]:
    """The whole output lines on one side of pytest's ndiff ("- " or "+ ")."""
    bodies = (line.strip() for line in lines)
    return [body[2:] for body in bodies if body.startswith(mark) or body == mark.strip()]


def _relabelled(lines: list[str]) -> list[str]:
    """pytest's full diff (run with -vv) of ``reference_output == test_output`` in words: its
    "-" lines are the student's output, its "+" lines the reference's, whole lines; lines that
    only guide the eye ("?") or agree ("  ") go. Long lines are cut around their first
    difference at spaces, never inside a word or a number."""
    head = next((line.strip() for line in lines if line.strip().startswith("mismatch")), "")
    what = head.removeprefix("mismatch").strip(" '") or "output"
    yours, expected = _side(lines, "- "), _side(lines, "+ ")
    out = [f"the output differs ({what}):"]
    pairs = max(len(yours), len(expected))
    for i in range(pairs):
        if i == DIFF_PAIRS:
            more = pairs - DIFF_PAIRS
            out.append(f"... and {more} more differing line{'s' if more > 1 else ''}")
            break
        mine = yours[i] if i < len(yours) else ""
        theirs = expected[i] if i < len(expected) else ""
        at = _first_difference(mine, theirs)
        if i < len(yours):
            out.append("yours:    " + _clip(mine, at))
        if i < len(expected):
            out.append("expected: " + _clip(theirs, at))
    return out


def _diff_lines(text: str) -> list[str]:
    """The lines of pytest's ``-vv`` diff in an nbval mismatch: from "mismatch" to the end of
    the assertion (the full reprs of both outputs on one line are skipped)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "mismatch" in line)
    kept = [lines[start]]
    for line in lines[start + 1 :]:
        if line.startswith("====="):
            break
        if " == " in line and line.strip().startswith("'"):
            continue  # the two outputs' reprs, in full
        kept.append(line)
    return kept


NOTE = "Likely bug:"  # the kernel's own note under a traceback (distopt.likely_bugs)
RANK_TAIL = re.compile(r"^(Last \d+ lines of rank|Stack \(most recent call first\))")
MESSAGE_LINES = 8


def _message(name: str, message: str) -> str:
    """An error's message as a student reads it: a launch's per-rank summary (which rank waits
    in which call, at which line, and the hint) without the ranks' raw output below it."""
    lines = []
    for line in message.split(NOTE, 1)[0].strip().splitlines():
        if RANK_TAIL.match(line.strip()):
            break
        if line.strip():
            lines.append(line.rstrip())
    if len(lines) > MESSAGE_LINES:
        lines = lines[:MESSAGE_LINES] + ["..."]
    return f"{name}: " + "\n".join(lines)


def _reason(text: str) -> str:
    """The few lines of an nbval failure that say what differs or what was raised."""
    lines = [line for line in text.splitlines() if line.strip()]
    if any("mismatch" in line for line in lines):
        return "\n".join(_relabelled(_diff_lines(text)))
    error = _error_of(text)
    if error is not None and error[1]:
        return _message(*error)
    errors = [line for line in lines if re.match(r"^\w*(Error|Exception)\b", line.strip())]
    return errors[-1].strip() if errors else (lines[-1] if lines else "failed")


STUB = "raise NotImplementedError"
DEFINED = re.compile(r"^\s*(?:def|class)\s+(\w+)", re.M)


def unanswered(student: nbformat.NotebookNode, roles: dict) -> dict[str, str]:
    """Every name an answer cell still left as the released stub defines, with where that
    exercise is (its heading and cell number)."""
    code = [c for c in student.cells if c.cell_type == "code"]
    found = {}
    for index, (role, position, where, _label) in roles.items():
        if role == "answer" and STUB in code[index].source:
            under = re.match(r'(under ".*?"|at the top)(?=, )', where)
            for name in DEFINED.findall(code[index].source):
                found[name] = f"the answer {under.group(1) if under else where} (cell {position})"
    return found


def _needed_stub(text: str, stubs: dict[str, str]) -> str:
    """Of the stubs, the one a failure's traceback (not the cell's own source) reached last."""
    traceback = text[text.find("Traceback") :] if "Traceback" in text else text
    last = {}
    for name in stubs:
        hits = [m.start() for m in re.finditer(rf"\b{re.escape(name)}\b", traceback)]
        if hits:
            last[name] = hits[-1]
    return max(last, key=last.get) if last else ""


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
    stubs = unanswered(checked, roles)
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
                    "-vv",  # pytest's diffs whole, not cut mid-word
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
            if busy(collector.load, _cores()):
                band += (
                    f" The machine was busy (load {collector.load:.1f} on {_cores()} cores): "
                    "this can be the load, not your code; re-run when it is quieter."
                )
            problems.append(
                f"  {name}: a measured number is outside the band the course states\n    "
                + textwrap.fill(band, width=88, subsequent_indent="    ")
            )
            continue
        reason = _reason(text)
        if "NotImplementedError" in reason:
            needed = _needed_stub(text, stubs)
            reason = (
                f"NotImplementedError: it needs {needed}, {stubs[needed]}, not answered yet"
                if needed
                else "NotImplementedError: an exercise it uses is not answered yet"
            )
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
    print("\n".join(timing_summary(collector.seconds, roles, collector.load, _cores())))
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
