"""Evidence that a wrong answer is a shortcut, read from the answer itself.

A failure pattern alone never shows a shortcut: an honest answer that is right for the visible
cases and wrong for a hidden one fails exactly as a table of the visible cases does. So the
grader names a catalogued *shortcut* (autograder/likely_bugs.py) only where the answer's own
source shows one, and quotes what it found:

* **a lookup table**: a dict literal whose keys are constants (numbers or tuples of numbers),
  or an argument compared for equality with a number the student could read (a visible case's
  input: ``if batch_size == 8192``);
* **the numbers a student could read**: two or more numbers in the answer that the notebook
  shows (in the exercise's text, its visible tests, or the reference outputs printed around
  it), that the released stub does not already hold, and that are not everyday constants
  (0, 1, 2, 1/2 and integers below 3);
* **a printed line**: a string of 12 or more characters that the reference outputs print;
* **an answer typed in**: a function every ``return`` of which gives a value written in the
  source (``return 0.5``, ``return np.array([...])``, ``2.5 if ... else math.inf``).

The numbers and strings of the reference answer and of the released stub are the course's
own (Adam's 0.9, a stage number, a dict key) and never count.

A guard's own refusal (the package's answer called, another rank's data asked for) is evidence
by itself; :data:`GUARD_ERRORS` lists their names.

Measured on every reference answer of the course: no evidence (tests/grader/test_evidence.py).
"""

from __future__ import annotations

import ast
import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import nbformat

from autograder import course

# Errors that a course guard raises when an answer takes a route around the exercise: the
# refusal itself shows the shortcut (distopt.grading, distopt.problems.own_data).
GUARD_ERRORS = frozenset({"NotYourOwnWork", "ForeignShardError", "Refused", "UnseenCommunication"})

# What is quoted of the answer is numbers and these fixed words only: never a name or a
# string the student chose (a report carries no text the student's code controls).

MIN_NUMBERS = 2  # distinct readable numbers that make evidence by themselves
MIN_TEXT = 12  # characters of a printed line held as a string
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d[\d,_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?(### END HIDDEN TESTS|\Z)", re.S)


@dataclass(frozen=True)
class Visible:
    """What a student can read around one exercise: numbers and printed text."""

    numbers: frozenset[float]
    text: str


def _numbers_in(text: str) -> set[float]:
    found = set()
    for match in _NUMBER.finditer(text):
        try:
            found.add(float(match.group().replace(",", "").replace("_", "")))
        except ValueError:
            continue
    return found


def _everyday(x: float) -> bool:
    return x in (0.0, 0.5, -0.5) or (float(x).is_integer() and abs(x) < 3)


def _constants(tree: ast.AST) -> set[float]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            if not isinstance(node.value, bool):
                found.add(float(node.value))
    return found


def _close(x: float, numbers: Iterable[float]) -> bool:
    """``x`` is one of ``numbers`` as printed: equal, or within the rounding of a printed
    figure (relative 1e-3), also when printed in thousands, millions or billions."""
    for v in numbers:
        for scale in (1.0, 1e3, 1e6, 1e9, 1e12):
            if v and math.isclose(x, v * scale, rel_tol=1e-3):
                return True
        if x == v:
            return True
    return False


def _shown(numbers: set[float], most: int = 4) -> str:
    """Up to ``most`` numbers, smallest first, as %g: the only thing quoted of an answer."""
    ordered = sorted(numbers)
    more = ", ..." if len(ordered) > most else ""
    return ", ".join(f"{x:g}" for x in ordered[:most]) + more


def _strings(tree: ast.AST) -> list[str]:
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _table_keys(tree: ast.AST) -> list[str]:
    """Dict literals keyed by constants (a table of cases), as the keys' source text."""
    tables = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and len(node.keys) >= 2:
            keys = [k for k in node.keys if k is not None]
            if len(keys) == len(node.keys) and all(_is_number_key(k) for k in keys):
                tables.append(_shown(set().union(*(_constants(k) for k in keys))))
    return tables


def _is_number_key(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _is_number_key(node.operand)
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(
            _is_number_key(e) or isinstance(e, ast.Constant) for e in node.elts
        )
    return False


_SAFE_CALLS = frozenset({"array", "asarray", "float", "int", "tuple", "list", "tensor"})


def _fixed(node: ast.AST | None) -> bool:
    """An expression whose value cannot depend on any input: numbers, containers of them,
    ``math.inf``, ``np.array([...])``, and ``a if test else b`` with both branches fixed."""
    if node is None:
        return False
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_fixed(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _fixed(node.operand)
    if isinstance(node, ast.BinOp):
        return _fixed(node.left) and _fixed(node.right)
    if isinstance(node, ast.IfExp):
        return _fixed(node.body) and _fixed(node.orelse)
    if isinstance(node, ast.Attribute):  # math.inf, np.nan
        return node.attr in ("inf", "nan", "pi", "e")
    if isinstance(node, ast.Call):
        name = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        return name in _SAFE_CALLS and all(_fixed(a) for a in node.args) and bool(node.args)
    return False


def _fixed_returns(tree: ast.AST) -> list[str]:
    """Functions every ``return`` of which gives a value fixed in the source, whatever the
    inputs (a typed-in answer), as "name returns <first value>"."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        returns = [r for r in _own_nodes(fn) if isinstance(r, ast.Return) and r.value is not None]
        if returns and all(_fixed(r.value) for r in returns):
            found.append(_shown(set().union(*(_constants(r.value) for r in returns))))
    return found


def _own_nodes(fn: ast.AST):
    """The nodes of ``fn``'s body, not those of functions defined inside it."""
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.append(child)


def _equalities(tree: ast.AST, visible: Visible, known: set[float]) -> list[str]:
    """Comparisons ``x == c`` (or ``x in (c, ...)``) with a readable number c that is neither
    everyday nor one of the course's own (``known``)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for op, right in zip(node.ops, node.comparators, strict=True):
            if not isinstance(op, (ast.Eq, ast.In)):
                continue
            values = _constants(right) if isinstance(right, (ast.Constant, ast.Tuple)) else set()
            if any(
                not _everyday(v) and v not in known and _close(v, visible.numbers) for v in values
            ):
                found.append(_shown(values))
    return found


def _parsed(source: str) -> ast.AST | None:
    try:
        return ast.parse(source) if source else None
    except SyntaxError:
        return None


def evidence(answer: str, visible: Visible, given: str = "", reference: str = "") -> str:
    """What in ``answer`` (an answer cell's source) shows a shortcut, in words quoting it;
    "" when nothing does. The numbers and strings of ``given`` (the released stub) and of
    ``reference`` (the reference answer: the formula's own constants, Adam's 0.9 and 0.999,
    a byte count, a stage number) are the course's, never evidence."""
    tree = _parsed(answer)
    if tree is None:
        return ""
    course_trees = [t for t in (_parsed(given), _parsed(reference)) if t is not None]
    stub = set().union(*(_constants(t) for t in course_trees))
    course_strings = {x.strip() for t in course_trees for x in _strings(t)}
    said = []
    tables = _table_keys(tree)
    if tables:
        said.append(f"a table of cases keyed by {tables[0]}")
    fixed = _fixed_returns(tree)
    if fixed:
        said.append(f"every return a value written in the answer ({fixed[0]}), whatever the inputs")
    equal = _equalities(tree, visible, stub)
    if equal:
        said.append(f"an input compared with a visible case's number ({equal[0]})")
    readable = sorted(
        x for x in _constants(tree) - stub if not _everyday(x) and _close(x, visible.numbers)
    )
    if len(readable) >= MIN_NUMBERS:
        said.append(f"the numbers the notebook shows ({_shown(set(readable))})")
    printed = [
        s
        for s in _strings(tree)
        if len(s.strip()) >= MIN_TEXT
        and s.strip() in visible.text
        and s.strip() not in course_strings
    ]
    if printed:
        said.append(f"{len(printed)} line{'s' * (len(printed) > 1)} the notebook prints, as text")
    return "; ".join(said)


# --- where an exercise's answers and visible parts are, in a notebook ------------------------


def _visible_source(cell) -> str:
    return _HIDDEN.sub("", cell.source)


def _outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(str(out.get("text", "")))
        elif out.get("output_type") in ("execute_result", "display_data"):
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def region(nb: nbformat.NotebookNode, test_id: str) -> tuple[list, list] | None:
    """(the exercise's cells, its answer cells): the cells after the previous graded test up
    to and including ``test_id``'s cell; None when the notebook has no such test."""
    start = 0
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if course.is_test(cell):
            if meta.get("grade_id") == test_id:
                cells = nb.cells[start : index + 1]
                return cells, [c for c in cells if course.is_answer(c)]
            start = index + 1
    return None


def visible_around(reference: nbformat.NotebookNode, test_id: str) -> Visible:
    """The numbers and printed text a student can read around ``test_id``'s exercise: its
    markdown, the visible part of its tests, and the reference outputs printed there."""
    found = region(reference, test_id)
    if found is None:
        return Visible(frozenset(), "")
    cells, _ = found
    texts, printed = [], []
    for cell in cells:
        if cell.cell_type == "markdown":
            texts.append(cell.source)
        elif course.is_test(cell):
            texts.append(_visible_source(cell))
        elif not course.is_answer(cell):
            printed.append(_outputs_text(cell))
    numbers = _numbers_in("\n".join(texts + printed))
    return Visible(frozenset(numbers), "\n".join(printed))


def for_test(
    submitted: nbformat.NotebookNode,
    test_id: str,
    reference: nbformat.NotebookNode,
    released: nbformat.NotebookNode | None = None,
) -> str:
    """The evidence of a shortcut in the answers of ``test_id``'s exercise in ``submitted``,
    read against what the ``reference`` notebook shows; the constants of the reference
    answers and of the ``released`` stubs are the course's own."""
    found = region(submitted, test_id)
    if found is None:
        return ""
    _, answers = found

    def by_id(nb) -> dict:
        return {c.get("id"): c.source for c in (nb.cells if nb else []) if course.is_answer(c)}

    stubs, solved = by_id(released), by_id(reference)
    visible = visible_around(reference, test_id)
    said = [
        evidence(c.source, visible, stubs.get(c.get("id"), ""), solved.get(c.get("id"), ""))
        for c in answers
    ]
    return "; ".join(s for s in said if s)


@functools.lru_cache(maxsize=16)
def _course_notebook(folder: str, section: str, notebook: str) -> nbformat.NotebookNode | None:
    path = course.ROOT / folder / section / f"{notebook}.ipynb"
    return nbformat.read(path, as_version=4) if path.is_file() else None


def in_submission(submitted: nbformat.NotebookNode, section: str | None, test_id: str) -> str:
    """:func:`for_test` against the course's own reference and released notebooks of
    ``section`` (the grader's side); "" when the section is not one of the course's."""
    if not section or section not in course.sections():
        return ""
    notebook = course.section_notebooks(section)[0]
    reference = _course_notebook("solutions", section, notebook)
    if reference is None:
        return ""
    return for_test(submitted, test_id, reference, _course_notebook("notebooks", section, notebook))
