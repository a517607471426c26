"""Each subpackage of distopt says what kind of code it holds and the rule that code keeps
(issue 56): a docstring that lists modules by hand drifts (12 were missing), a rule does not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "shared" / "distopt"
SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def _docstring(name: str) -> str:
    return ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())) or ""


def test_there_are_subpackages():
    assert len(SUBPACKAGES) >= 8, SUBPACKAGES


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_a_subpackage_states_its_kind_and_rule_and_lists_no_modules(name):
    text = _docstring(name)
    assert "Kind:" in text and "Rule:" in text, f"distopt.{name}: say its kind and its rule"
    modules = {p.stem for p in (PACKAGE / name).glob("*.py") if p.stem != "__init__"}
    named = {m for m in modules if f"``{m}``" in text}
    assert not named, f"distopt.{name}'s docstring lists modules by hand: {sorted(named)}"


def test_the_answer_cell_predicate_is_written_once():
    """autograder.course.is_answer and is_test are the only readings of nbgrader's solution
    flag in the product (issue 56: it was written 7 times, two of them looser)."""
    root = PACKAGE.parents[1]
    found = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("autograder", "coursehub", "shared/distopt")
        for path in sorted((root / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if 'get("solution")' in line and path.name != "course.py"
    ]
    assert not found, f"use autograder.course.is_answer: {found}"
