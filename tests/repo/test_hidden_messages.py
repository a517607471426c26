"""Hidden failures carry their numbers (issue 61): every assertion in a hidden test reports
the value the answer computed and the one expected, so that two mistakes that fail the same
hidden case fail with different messages, and a likely bug is named from evidence, not from
the bare fact that a hidden case failed. A bare ``assert`` or a message of the case's inputs
alone fails here."""

from __future__ import annotations

import ast
import re
import textwrap

import nbformat
import pytest

from autograder import course

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
CLOSE = {"isclose", "allclose", "array_equal", "array_almost_equal", "assert_allclose"}


def _hidden_asserts(section: str) -> list[tuple[str, ast.Assert]]:
    name = course.section_notebooks(section)[0]
    nb = nbformat.read(course.SOLUTIONS / section / f"{name}.ipynb", as_version=4)
    found = []
    for cell in nb.cells:
        if not course.is_test(cell):
            continue
        for block in HIDDEN.findall(cell.source):
            tree = ast.parse(textwrap.dedent(block))
            test = cell.metadata["nbgrader"]["grade_id"]
            found += [(test, node) for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    return found


def _compared(test: ast.expr) -> list[ast.expr]:
    """The values an assertion compares: a comparison's sides, or the first two arguments of
    isclose/allclose/array_equal; else the expression itself (a boolean the answer gave)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _compared(test.operand)
    if isinstance(test, ast.BoolOp):
        return [side for value in test.values for side in _compared(value)]
    if isinstance(test, ast.Compare):
        return [test.left, *test.comparators]
    if isinstance(test, ast.Call):
        func = (
            test.func.attr if isinstance(test.func, ast.Attribute) else getattr(test.func, "id", "")
        )
        if func in CLOSE and len(test.args) >= 2:
            return list(test.args[:2])
    return [test]


def _missing(node: ast.Assert) -> list[str]:
    """The compared values that the message does not report (constants need no report)."""
    if node.msg is None:
        return ["a message"]
    said = ast.unparse(node.msg)
    return [
        ast.unparse(side)
        for side in _compared(node.test)
        if not isinstance(side, ast.Constant) and ast.unparse(side) not in said
    ]


@pytest.mark.parametrize("section", course.sections())
def test_every_hidden_assertion_reports_what_was_computed(section):
    bad = [
        f"{test}: `{ast.unparse(node)[:140]}` does not report {', '.join(missing)}"
        for test, node in _hidden_asserts(section)
        if (missing := _missing(node))
    ]
    assert not bad, f"{section}: {len(bad)} hidden assertions:\n" + "\n".join(bad)


def test_the_scan_tells_a_reported_value_from_an_input_only_message():
    def check(source: str) -> list[str]:
        return _missing(ast.parse(source).body[0])

    assert check("assert got == expected, (n, got, expected)") == []
    assert check("assert math.isclose(f(n), want), (n, p)") == ["f(n)", "want"]
    assert check("assert f(n) == 3") == ["a message"]
    assert check("assert not ok(x), ok(x)") == []
