"""The mutant catalogue: typical wrong answers and shortcuts that every graded exercise must catch.

"Check by hand that a typical bug fails its own test", automated. For every answer cell of every
section, one module here (named after the section's notebook) lists :class:`Variant` s:

* a **bug** is a small patch of the reference answer (``old`` -> ``new``), the mistake a student
  typically makes: a forgotten 1/world_size, (N-1)/N for 2(N-1)/N, the wrong neighbour;
* a **shortcut** is a whole answer that dodges the concept: the package's answer reached
  through a captured reference, the printed reference numbers returned, the whole computation
  done locally without a message.

Each names the tests that must lose their points (by default every test of its exercise). The
class run (tests/grader/class_run.py) grades them through the real grader as a few students per
section, :func:`rounds`: round k holds variant k of every exercise. A round's failing tests
must be exactly the union of its variants' ``fails`` (tests/grader/test_mutants.py). So that a
bug in one exercise is seen to cost only its own points (no cascade), one more round mutates
only the exercises others build on, with their first variant, and their dependants must keep
their points.

A mutant submission is the whole released notebook with the reference answers and the round's
variants typed in, as a student hands it in; grading leaves out its show-only cells
(autograder/show_only.py), so each round costs its set-up, answers and tests, and every variant
is seen to lose exactly its points with those cells left out. (:func:`tests_only` keeps only
the set-up cells, answers and tests: what the likely-bug table learns from, and the authors'
command below.)

Course authors try a section's variants one by one, without the grader::

    python -m tests.grader.mutants 02_memory_sharding [--answer ID] [--rounds]
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass

import nbformat

from autograder import course, fixtures


@dataclass(frozen=True)
class Variant:
    """One wrong answer to one exercise, and the tests it must fail."""

    answer: str  # grade_id of the answer cell it replaces
    name: str  # the mistake, in a few words (it names the test case)
    kind: str  # "bug" (a patch of the reference answer) or "shortcut" (a whole answer)
    old: str = ""  # bug: text of the reference answer that occurs exactly once
    new: str = ""  # bug: what the student wrote instead
    source: str = ""  # shortcut: the whole answer cell
    fails: tuple[str, ...] = ()  # tests that must score 0; empty: every test of the exercise
    hint: str = ""  # the mistake in words for the student, where the name reads badly
    # (autograder/likely_bugs.py shows it beside a failed test that looks like this variant)

    def __post_init__(self):
        if self.kind not in ("bug", "shortcut"):
            raise ValueError(f"{self.answer}/{self.name}: kind must be 'bug' or 'shortcut'")
        if (self.kind == "bug") != bool(self.old):
            raise ValueError(f"{self.answer}/{self.name}: a bug patches old -> new, "
                             "a shortcut gives the whole source")  # fmt: skip

    def apply(self, reference: str) -> str:
        """The answer cell's source with this variant in place of ``reference``."""
        if self.kind == "shortcut":
            return self.source
        if reference.count(self.old) != 1:
            raise ValueError(
                f"{self.answer}/{self.name}: {self.old!r} occurs {reference.count(self.old)} "
                "times in the reference answer, not once; quote more of the line"
            )
        return reference.replace(self.old, self.new)


def bug(
    answer: str, name: str, old: str, new: str, *, fails: tuple[str, ...] = (), hint: str = ""
) -> Variant:
    return Variant(answer, name, "bug", old=old, new=new, fails=tuple(fails), hint=hint)


def shortcut(
    answer: str, name: str, source: str, *, fails: tuple[str, ...] = (), hint: str = ""
) -> Variant:
    return Variant(answer, name, "shortcut", source=source, fails=tuple(fails), hint=hint)


# --- the course's notebooks ---------------------------------------------------------------


def sections() -> list[tuple[str, str]]:
    """(section, notebook) of every reference notebook."""
    return [(s, nb) for s in course.sections() for nb in course.section_notebooks(s)]


def variants(notebook: str) -> list[Variant]:
    """The catalogue of one notebook (the module ``tests.grader.mutants.<notebook>``)."""
    return list(importlib.import_module(f"{__name__}.{notebook}").VARIANTS)


def _solution(section: str, notebook: str) -> nbformat.NotebookNode:
    return nbformat.read(course.SOLUTIONS / section / f"{notebook}.ipynb", as_version=4)


def _grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def _is_answer(cell) -> bool:
    return cell.cell_type == "code" and bool(cell.metadata.get("nbgrader", {}).get("solution"))


def tests_of_answers(section: str, notebook: str) -> dict[str, list[str]]:
    """Each answer's graded tests: those between it and the next answer, in notebook order."""
    found: dict[str, list[str]] = {}
    current = None
    for cell in _solution(section, notebook).cells:
        if _is_answer(cell):
            current = _grade_id(cell)
            found[current] = []
        elif course.is_test(cell) and current is not None:
            found[current].append(_grade_id(cell))
    return found


def reference_answers(section: str, notebook: str) -> dict[str, str]:
    """grade_id -> the reference answer as a student would type it (no solution markers)."""
    return {
        _grade_id(c): fixtures.without_solution_markers(c.source)
        for c in _solution(section, notebook).cells
        if _is_answer(c)
    }


def _names(source: str, kind: type) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    if kind is ast.FunctionDef:
        return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def dependants(section: str, notebook: str) -> dict[str, set[str]]:
    """answer -> the other answers whose reference answer or tests use a name it defines."""
    answers = reference_answers(section, notebook)
    tests = tests_of_answers(section, notebook)
    test_source = {_grade_id(c): c.source for c in _solution(section, notebook).cells}
    defined = {a: _names(src, ast.FunctionDef) for a, src in answers.items()}
    used = {
        a: _names(src, ast.Name)
        | set().union(*(_names(test_source[t], ast.Name) for t in tests[a]))
        for a, src in answers.items()
    }
    return {a: {b for b in answers if b != a and defined[a] & used[b]} for a in answers}


def expected_failures(section: str, notebook: str, variant: Variant) -> set[str]:
    return set(variant.fails) or set(tests_of_answers(section, notebook)[variant.answer])


def rounds(section: str, notebook: str) -> list[list[Variant]]:
    """The mutant students of a notebook: round k holds variant k of every exercise; then, if
    some answer builds on another, a round with only the built-on answers' first variants."""
    by_answer: dict[str, list[Variant]] = {}
    for v in variants(notebook):
        by_answer.setdefault(v.answer, []).append(v)
    depth = max((len(vs) for vs in by_answer.values()), default=0)
    found = [[vs[k] for vs in by_answer.values() if k < len(vs)] for k in range(depth)]
    built_on = [a for a, users in dependants(section, notebook).items() if users]
    cascade = [by_answer[a][0] for a in built_on if a in by_answer]
    return found + ([cascade] if cascade else [])


def tests_only(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with only the set-up cells (code before the first answer), answers and tests."""
    first = next(i for i, c in enumerate(nb.cells) if _is_answer(c))
    nb.cells = [
        c
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (i < first or _is_answer(c) or course.is_test(c))
    ]
    return nb


def submission(section: str, notebook: str, chosen: list[Variant]) -> nbformat.NotebookNode:
    """The released notebook answered with the reference, ``chosen`` variants in place: the
    whole notebook, as a student hands it in (grading leaves out its show-only cells)."""
    reference = reference_answers(section, notebook)
    replacements = {v.answer: v.apply(reference[v.answer]) for v in chosen}
    return fixtures.answered_notebook(section, notebook, replacements=replacements)


def student_id(round_index: int) -> str:
    return f"mutants-{round_index + 1}"
