"""Similar answers, flagged for a person to judge: pairs of students, and copies of the package.

Each answer cell of a section (in the file the grader graded: the notebook, a renamed one, or
the answered copy beside a blank one) is compared with the same answer of every other
student, and
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
same way, against each function's source.

Rank code leaves a second trace: **the messages it sends.** While the grader runs a notebook,
``distopt``'s recorder (:mod:`distopt.engine.record`, which every rank test uses) appends each
rank's calls to a log beside the graded notebook (:func:`message_log_name`; the grader adds
the times each test cell ran, :func:`note_test_cell`), and :func:`message_patterns` reduces
it to one pattern per test: the (operation, bytes, peer) of every call, rank by rank, run by
run. Rank code admits few patterns, and every right answer makes the same one, so a pattern
is evidence only where it is rare: two students whose patterns are the same (equal, or apart
by at most one call in :data:`NEAR_CALLS`) while at most :data:`RARE` students of the class
make it, and no answer that passed the test (the tests check the messages: a right answer
sends the reference's), are flagged (:func:`message_flags`), at least :data:`MIN_CALLS`
calls long. A copy that passes every check is therefore left to the code comparison above.

The report lists each flag with both texts side by side; nothing here changes a grade.
"""

from __future__ import annotations

import ast
import copy
import difflib
import functools
import html
import io
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder import course, filing

K = 20  # characters of filtered token text per k-gram (names become one letter)
WINDOW = 1  # keep every k-gram: the answers are short
THRESHOLD = 0.8  # share of an answer's remaining token text found in the other
# Characters of token text in common, at least. Measured: the honest pairs (the reference
# and every catalogued wrong answer of every section, pairwise) with a share above THRESHOLD
# have at most 156 in common (03's ring_attention_blocks, two catalogued variants); a student's
# 14-line answer copied with every name changed keeps 196 (test_similarity.py). Between them.
MIN_OVERLAP = 175
MIN_PRINTS = MIN_OVERLAP - K + 1  # the k-grams of that many characters
PACKAGE = Path(__file__).resolve().parent.parent / "shared" / "distopt"

MESSAGE_LOG = ".messages.jsonl"  # beside the graded notebook: <notebook>.messages.jsonl
TEST_TIMES = ".test-times.jsonl"  # and when each test cell ran, noted by the grader
RARE = 2  # a message pattern that more students make is not evidence
MIN_CALLS = 6  # calls in a pattern, at least: a pattern of two all-reduces is everyone's
NEAR_CALLS = 20  # two patterns apart by one call in this many (or fewer) count as the same

Message = tuple[str, int, int | None]  # (operation, bytes this rank handed over, peer)


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


@dataclass(frozen=True)
class MessageFlag:
    section: str
    test: str  # grade id of the test cell whose run made the messages
    first: str  # a student id
    second: str  # another
    made_by: int  # students of the class whose pattern is the same as either
    apart: int  # calls in one pattern and not in the other (0: equal)
    first_pattern: tuple  # of Block: (world size, rank, its calls)
    second_pattern: tuple
    first_source: str = ""  # the answer the test grades, where its name says which
    second_source: str = ""


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
        if course.is_answer(c)
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


def message_log_name(notebook: str) -> str:
    """The file, beside a graded notebook, its ranks' messages are logged to."""
    return f"{Path(notebook).stem}{MESSAGE_LOG}"


def test_times_name(notebook: str) -> str:
    """The file, beside a graded notebook, the grader notes its test cells' times in."""
    return f"{Path(notebook).stem}{TEST_TIMES}"


def note_test_cell(log: Path, cell, began: float, ended: float) -> None:
    """Add to ``log`` (:func:`test_times_name`) that test ``cell`` ran from ``began`` to
    ``ended`` (wall clock), so that the messages logged meanwhile are known to be that
    test's."""
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
    passed = not any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    line = json.dumps({"test": grade_id, "began": began, "ended": ended, "passed": passed})
    try:
        with log.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:
        pass


def _json_lines(path: Path) -> list:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError):
        return []


Block = tuple[int, int, tuple[Message, ...]]  # (world size, rank, its calls in order)


def message_patterns(log: Path, times: Path) -> dict[str, tuple[Block, ...]]:
    """test grade id -> the messages made while it ran (``log``: the ranks' blocks,
    ``times``: when each test ran): every block (one rank's recorded calls), sorted by world
    size, rank, then calls (ranks run at once: the order they logged in says nothing)."""
    tests = [
        x
        for x in _json_lines(times)
        if isinstance(x, dict) and isinstance(x.get("began"), float | int) and "ended" in x
    ]
    blocks: dict[str, list[Block]] = {}
    for x in _json_lines(log):
        if not isinstance(x, dict) or not x.get("calls"):
            continue
        try:
            calls = tuple(
                (str(c[0]), int(c[1]), None if c[2] is None else int(c[2])) for c in x["calls"]
            )
            began = float(x["began"])
            block = (int(x.get("world_size") or 0), int(x.get("rank") or 0), calls)
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        test = next((t["test"] for t in tests if t["began"] <= began <= t["ended"]), None)
        if test:
            blocks.setdefault(test, []).append(block)
    return {test: tuple(sorted(found)) for test, found in blocks.items()}


def passed_tests(times: Path) -> set[str]:
    """The tests that passed, by the grader's notes (:func:`note_test_cell`)."""
    return {x["test"] for x in _json_lines(times) if isinstance(x, dict) and x.get("passed")}


def _calls(pattern: tuple[Block, ...]) -> tuple[tuple[int, int, Message], ...]:
    """Every (world size, rank, message) of ``pattern``, block after block."""
    return tuple((n, rank, m) for n, rank, calls in pattern for m in calls)


def _apart(a: tuple[Block, ...], b: tuple[Block, ...]) -> int:
    """Calls in one pattern and not in the other, in order (an edit distance without
    substitutions)."""
    if a == b:
        return 0
    a, b = _calls(a), _calls(b)
    if abs(len(a) - len(b)) > max(len(a), len(b)) // NEAR_CALLS:
        return abs(len(a) - len(b))  # too far apart already: no need to align
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return len(a) + len(b) - 2 * sum(block.size for block in matcher.get_matching_blocks())


def _same(a: tuple[Block, ...], b: tuple[Block, ...]) -> bool:
    return _apart(a, b) <= max(len(_calls(a)), len(_calls(b))) // NEAR_CALLS


def _within(part: tuple[Block, ...], whole: tuple[Block, ...]) -> bool:
    """Whether every block of ``part`` begins a block of its own of ``whole`` (same world
    size and rank): what an answer that ``whole`` sends sends until a test stops it early."""
    unused = list(whole)
    for n, rank, calls in part:
        match = next(
            (
                i
                for i, (m, r, c) in enumerate(unused)
                if (m, r) == (n, rank) and c[: len(calls)] == calls
            ),
            None,
        )
        if match is None:
            return False
        del unused[match]
    return True


def message_flags(
    section: str,
    patterns: dict[str, dict[str, tuple[Block, ...]]],
    answers: dict[str, dict[str, str]] | None = None,
    passed: dict[str, set[str]] | None = None,
) -> list[MessageFlag]:
    """Pairs of students (``patterns``: student -> test -> pattern) whose message patterns
    are the same (:func:`_same`) and rare: each is the same as, or part of (:func:`_within`:
    a run that a failed check stopped early), the patterns of at most :data:`RARE` students
    of the class, and of no student who passed the test (``passed``: student -> tests): the
    tests check the messages, so an answer that passes sends the reference answer's, which
    is no evidence however few students of a small class send it. ``answers`` (student ->
    grade id -> source) adds the answer each test grades, for the report."""
    answers, passed = answers or {}, passed or {}
    found = []
    for test in sorted({t for p in patterns.values() for t in p}):
        everyone = {s: p[test] for s, p in patterns.items() if test in p}
        mine = {s: p for s, p in everyone.items() if len(_calls(p)) >= MIN_CALLS}
        right = [p for s, p in everyone.items() if test in passed.get(s, ())]

        def made_by(pattern: tuple[Block, ...], mine: dict = mine) -> set[str]:
            return {s for s, p in mine.items() if _within(pattern, p) or _same(pattern, p)}

        def sent_by_a_right_answer(pattern: tuple[Block, ...], right: list = right) -> bool:
            return any(_within(pattern, p) or _same(pattern, p) for p in right)

        for first, second in itertools.combinations(sorted(mine), 2):
            if not _same(mine[first], mine[second]):
                continue
            if sent_by_a_right_answer(mine[first]) or sent_by_a_right_answer(mine[second]):
                continue
            makers = made_by(mine[first]) | made_by(mine[second])
            if len(makers) > RARE:
                continue
            answer = test.removeprefix("test_")
            found.append(
                MessageFlag(
                    section,
                    test,
                    first,
                    second,
                    len(makers),
                    _apart(mine[first], mine[second]),
                    mine[first],
                    mine[second],
                    answers.get(first, {}).get(answer, ""),
                    answers.get(second, {}).get(answer, ""),
                )
            )
    return found


def pattern_text(pattern: tuple[Block, ...]) -> str:
    """One line per message, repeats folded: "N=2 rank 0: all_reduce 6,960 B (x 3)"."""
    lines: list[str] = []
    last, times = None, 0
    for n, rank, (op, size, peer) in (*_calls(pattern), (None, None, (None, None, None))):
        line = None if n is None else f"N={n} rank {rank}: {op} {size:,} B"
        if line is not None and peer is not None:
            line += f" peer {peer}"
        if line == last:
            times += 1
            continue
        if last is not None:
            lines.append(last + (f" (x {times})" if times > 1 else ""))
        last, times = line, 1
    return "\n".join(lines)


def _cells(path: Path, kind: str) -> dict[str, str]:
    nb = nbformat.read(path, as_version=4)
    return {
        c.metadata["nbgrader"]["grade_id"]: (
            _without_markers(c.source) if kind == "reference" else c.source
        )
        for c in nb.cells
        if course.is_answer(c)
    }


def _without_markers(source: str) -> str:
    from autograder.fixtures import without_solution_markers

    return without_solution_markers(source)


def class_flags(jobs: list[tuple[str, str]]) -> list[Flag | MessageFlag]:
    """Every flag of the class ``jobs`` (student, section), from the submitted notebooks and
    the message logs their grading left beside the graded ones."""
    found: list[Flag | MessageFlag] = []
    for section in sorted({section for _, section in jobs}):
        for notebook in course.section_notebooks(section):
            released_path = course.NOTEBOOKS / section / f"{notebook}.ipynb"
            released = nbformat.read(released_path, as_version=4)
            answers, patterns, passed = {}, {}, {}
            for student, s in jobs:
                # the file the grader graded: renamed, or an answered copy beside a blank one
                path = filing.graded_file(course.SUBMITTED / student / s, notebook, released)
                if s == section and path is not None:
                    answers[student] = answers_of(path, released)
                graded = course.AUTOGRADED / student / s
                log = graded / message_log_name(notebook)
                times = graded / test_times_name(notebook)
                if s == section and log.is_file():
                    patterns[student] = message_patterns(log, times)
                    passed[student] = passed_tests(times)
            reference = _cells(course.SOLUTIONS / section / f"{notebook}.ipynb", "reference")
            stubs = _cells(released_path, "stub")
            found += flags_of(section, answers, reference, stubs, package_functions())
            found += message_flags(section, patterns, answers, passed)
    return found


def markdown(flags: list[Flag | MessageFlag]) -> list[str]:
    """The report's section: one line per flag, then both texts side by side."""
    code = [f for f in flags if isinstance(f, Flag)]
    messages = [f for f in flags if isinstance(f, MessageFlag)]
    lines = _code_markdown(code)
    lines += [
        "Pairs whose rank code sent the same messages (operation, bytes, peer, rank by rank "
        f"while a test ran; apart by at most one call in {NEAR_CALLS}), at least {MIN_CALLS} "
        f"calls, sent by at most {RARE} students of the class and by no answer that passed "
        "the test: what a right answer sends is not evidence.",
        "",
    ]
    if not messages:
        return lines if code else lines + ["No pair above the threshold.", ""]
    lines += ["| section | test | first | second | students who sent it | calls apart |"]
    lines += ["|---|---|---|---|---|---|"]
    for f in messages:
        lines.append(
            f"| {f.section} | {f.test} | {f.first} | {f.second} | {f.made_by} | {f.apart} |"
        )
    lines.append("")
    for f in messages:
        cells = [pattern_text(f.first_pattern), pattern_text(f.second_pattern)]
        rows = "".join(f"<td><pre>{html.escape(c)}</pre></td>" for c in cells)
        answers = "".join(
            f"<td><pre>{html.escape(c)}</pre></td>" for c in (f.first_source, f.second_source)
        )
        lines += [
            f"<details><summary>{html.escape(f.section)} / {html.escape(f.test)} (messages): "
            f"{html.escape(f.first)} and {html.escape(f.second)}</summary>",
            "",
            f"<table><tr>{rows}</tr>"
            + (f"<tr>{answers}</tr>" if f.first_source or f.second_source else "")
            + "</table></details>",
            "",
        ]
    return lines


def _code_markdown(flags: list[Flag]) -> list[str]:
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
        return lines
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
