"""Similar answers, flagged for a person to judge: pairs of students, and copies of the package.

Each answer cell of a section is compared with the same answer of every other student, and
with every function of the ``distopt`` package, by copydetect (a maintained implementation of
winnowing, Schleimer et al. 2003, as in MOSS): the code is tokenized and every name is
replaced by one letter, so renaming, comments, blank lines and formatting change nothing, and
the fingerprints are the k-grams of that token text, so that moving independent statements
around keeps most of them. Two things make a shared fingerprint evidence rather than chance:

* **what every right answer shares is not evidence.** The reference answer's fingerprints
  (and the released stub's) are removed from every answer first, as copydetect's
  "boilerplate": two honest students who both write the textbook loop share nothing that is
  left, while a copied odd pattern (a peculiar order of the messages, a helper the reference
  does not have) remains;
* **short answers coincide.** A formula of one line is written alike by many; a pair counts
  only when what remains in common is at least :data:`MIN_OVERLAP` characters of token text
  (a few lines of rank code), and at least :data:`THRESHOLD` of one answer's remaining text.

A copy of the package's own function (``distopt`` is installed for every student) is found the
same way, against each function's source. The report lists each flag with both texts side by
side; nothing here changes a grade.
"""

from __future__ import annotations

import ast
import copy
import functools
import html
import io
import itertools
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder import course

K = 20  # characters of filtered token text per k-gram (names become one letter)
WINDOW = 1  # keep every k-gram: the answers are short
THRESHOLD = 0.8  # share of an answer's remaining token text found in the other
MIN_OVERLAP = 200  # characters of token text in common, at least (a few lines of code)
MIN_PRINTS = MIN_OVERLAP - K + 1  # the k-grams of that many characters
PACKAGE = Path(__file__).resolve().parent.parent / "shared" / "distopt"


@dataclass(frozen=True)
class Flag:
    section: str
    answer: str  # grade id of the answer cell
    first: str  # a student id
    second: str  # another student id, or "distopt: <module>.<function>"
    similarity: float  # the larger share of either text found in the other
    overlap: int  # characters of token text in common
    first_source: str
    second_source: str


@functools.lru_cache(maxsize=4096)
def _raw(code: str):
    from copydetect import CodeFingerprint

    return CodeFingerprint("answer.py", K, WINDOW, fp=io.StringIO(code), language="python")


def _fingerprint(code: str, boilerplate: frozenset[int] = frozenset()):
    """copydetect's fingerprint of ``code`` less the ``boilerplate`` hashes (a copy: the
    cached one is kept whole)."""
    fp = copy.copy(_raw(code))
    fp.hashes = set(fp.hashes) - boilerplate
    fp.hash_idx = {h: i for h, i in fp.hash_idx.items() if h not in boilerplate}
    return fp


@functools.lru_cache(maxsize=4096)
def _hashes(code: str) -> frozenset[int]:
    return frozenset(_raw(code).hashes) if code.strip() else frozenset()


def compare(first: str, second: str, boilerplate: frozenset[int]) -> tuple[float, int]:
    """(the larger share of either answer's remaining token text found in the other, the
    characters of token text in common) once ``boilerplate`` is removed from both."""
    from copydetect import compare_files

    a, b = _fingerprint(first, boilerplate), _fingerprint(second, boilerplate)
    if not a.hashes or not b.hashes or not a.hashes & b.hashes:
        return 0.0, 0
    overlap, (share_a, share_b), _ = compare_files(a, b)
    return float(max(share_a, share_b)), int(overlap)


def answers_of(notebook: Path, released: nbformat.NotebookNode) -> dict[str, str]:
    """grade id -> the student's source of each answer cell (matched by grade id, else by the
    released cell's id, as the grader matches a notebook whose metadata was stripped)."""
    by_cell = {
        c.get("id"): c.metadata["nbgrader"]["grade_id"]
        for c in released.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    try:
        nb = nbformat.read(notebook, as_version=4)
    except Exception:
        return {}
    found = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id") or by_cell.get(cell.get("id"))
        if grade_id in by_cell.values() and grade_id not in found:
            found[grade_id] = cell.source
    return found


@functools.cache
def package_functions() -> dict[str, str]:
    """ "<module>.<function>" -> source, for every function and method of distopt."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                source = ast.get_source_segment(text, node) or ""
                if source.count("\n") >= 3:  # a one-liner says nothing
                    found[f"{module}.{node.name}"] = source
    return found


def flags_of(
    section: str,
    answers: dict[str, dict[str, str]],
    reference: dict[str, str],
    stubs: dict[str, str],
    package: dict[str, str],
) -> list[Flag]:
    """Flags of one section: ``answers`` is student -> grade id -> source; ``reference`` and
    ``stubs`` the reference answers and the released stubs by grade id."""
    found = []

    for answer in sorted(reference):
        boilerplate = _hashes(reference[answer]) | _hashes(stubs.get(answer, ""))
        mine = {s: a[answer] for s, a in answers.items() if a.get(answer, "").strip()}
        # an answer left with fewer k-grams than a flag needs in common cannot be flagged
        # (one k-gram per character of token text: WINDOW = 1)
        mine = {s: a for s, a in mine.items() if len(_hashes(a) - boilerplate) >= MIN_PRINTS}
        for first, second in itertools.combinations(sorted(mine), 2):
            share, overlap = compare(mine[first], mine[second], boilerplate)
            if share >= THRESHOLD and overlap >= MIN_OVERLAP:
                found.append(
                    Flag(section, answer, first, second, share, overlap, mine[first], mine[second])
                )
        for student, source in sorted(mine.items()):
            prints = _hashes(source) - boilerplate
            for name, theirs in package.items():
                if len(prints & _hashes(theirs)) * 2 < len(prints):
                    continue  # most of the answer is not in this function: skip the detail
                share, overlap = compare(source, theirs, boilerplate)
                if share >= THRESHOLD and overlap >= MIN_OVERLAP:
                    other = f"distopt: {name}"
                    found.append(
                        Flag(section, answer, student, other, share, overlap, source, theirs)
                    )
    return found


def _cells(path: Path, kind: str) -> dict[str, str]:
    nb = nbformat.read(path, as_version=4)
    return {
        c.metadata["nbgrader"]["grade_id"]: (
            _without_markers(c.source) if kind == "reference" else c.source
        )
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }


def _without_markers(source: str) -> str:
    from autograder.fixtures import without_solution_markers

    return without_solution_markers(source)


def class_flags(jobs: list[tuple[str, str]]) -> list[Flag]:
    """Every flag of the class ``jobs`` (student, section), from the submitted notebooks."""
    found = []
    for section in sorted({section for _, section in jobs}):
        for notebook in course.section_notebooks(section):
            released_path = course.NOTEBOOKS / section / f"{notebook}.ipynb"
            released = nbformat.read(released_path, as_version=4)
            answers = {}
            for student, s in jobs:
                path = course.SUBMITTED / student / s / f"{notebook}.ipynb"
                if s == section and path.is_file():
                    answers[student] = answers_of(path, released)
            reference = _cells(course.SOLUTIONS / section / f"{notebook}.ipynb", "reference")
            stubs = _cells(released_path, "stub")
            found += flags_of(section, answers, reference, stubs, package_functions())
    return found


def markdown(flags: list[Flag]) -> list[str]:
    """The report's section: one line per flag, then both texts side by side."""
    lines = [
        "## Similar answers",
        "",
        "Pairs whose answer shares code that the reference answer does not have (names, "
        "comments, formatting and the order of independent statements ignored; copydetect's "
        f"winnowing, k = {K}), at least {THRESHOLD:.0%} of one answer and {MIN_OVERLAP} "
        "characters of token text, and answers that copy a function of the distopt package. "
        "For a person to judge: no grade was changed.",
        "",
    ]
    if not flags:
        return lines + ["No pair above the threshold.", ""]
    lines += ["| section | answer | first | second | similarity | in common |"]
    lines += ["|---|---|---|---|---|---|"]
    for f in flags:
        lines.append(
            f"| {f.section} | {f.answer} | {f.first} | {f.second} | {f.similarity:.0%} "
            f"| {f.overlap} chars |"
        )
    lines.append("")
    for f in flags:
        lines += [
            f"<details><summary>{html.escape(f.section)} / {html.escape(f.answer)}: "
            f"{html.escape(f.first)} and {html.escape(f.second)}</summary>",
            "",
            "<table><tr>"
            f"<td><pre>{html.escape(f.first_source)}</pre></td>"
            f"<td><pre>{html.escape(f.second_source)}</pre></td>"
            "</tr></table></details>",
            "",
        ]
    return lines
