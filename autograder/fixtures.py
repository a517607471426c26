"""Submissions made from the reference notebooks, for tests and for `make grade-demo`.

Everything here is generic over sections: it needs only the notebook pair
solutions/<section>/<name>.ipynb and notebooks/<section>/<name>.ipynb.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import nbformat

from autograder import course

_SOLUTION_REGION = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(?:\n|\Z)", re.MULTILINE)


def without_solution_markers(source: str) -> str:
    """A reference answer as a student would type it: the solution region's markers gone."""
    return _SOLUTION_REGION.sub("", source)


def answer_ids(nb: nbformat.NotebookNode) -> list[str]:
    """grade_ids of the answer cells, in notebook order."""
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if course.is_answer(c)]


def answered_notebook(
    section: str,
    notebook: str,
    *,
    root: Path = course.ROOT,
    replacements: dict[str, str] | None = None,
    unanswered: set[str] = frozenset(),
) -> nbformat.NotebookNode:
    """The released notebook with the reference answers typed in, as a student would.

    ``replacements`` maps a grade_id to the source a student writes there instead;
    cells in ``unanswered`` keep the released stub.
    """
    solution_path = root / "solutions" / section / f"{notebook}.ipynb"
    solution = {c.id: c for c in nbformat.read(solution_path, as_version=4).cells}
    nb = nbformat.read(root / "notebooks" / section / f"{notebook}.ipynb", as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not course.is_answer(cell) or meta["grade_id"] in unanswered:
            continue
        source = (replacements or {}).get(meta["grade_id"])
        cell.source = (
            source if source is not None else without_solution_markers(solution[cell.id].source)
        )
    return nb


def edit_answer(nb: nbformat.NotebookNode, grade_id: str, old: str, new: str) -> None:
    """Change one answer cell (``old`` must occur exactly once), e.g. to introduce a bug."""
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    if cell.source.count(old) != 1:
        raise ValueError(f"{old!r} does not occur exactly once in {grade_id}")
    cell.source = cell.source.replace(old, new)


def kill_kernel_in(nb: nbformat.NotebookNode, grade_id: str) -> None:
    """Make an answer cell end the kernel's process as soon as it runs."""
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    cell.source = "import os\nos._exit(1)\n" + cell.source


def demo_class(section: str, notebook: str, *, root: Path = course.ROOT) -> dict[str, Callable]:
    """A small class for one notebook: student id -> function writing the submission."""
    released = root / "notebooks" / section / f"{notebook}.ipynb"
    ids = answer_ids(nbformat.read(released, as_version=4))
    half = set(ids[len(ids) // 2 :])

    def answered(**kwargs) -> Callable[[Path], None]:
        return lambda target: nbformat.write(
            answered_notebook(section, notebook, root=root, **kwargs), target
        )

    def kernel_dies(target: Path) -> None:
        nb = answered_notebook(section, notebook, root=root)
        kill_kernel_in(nb, ids[len(ids) // 2])
        nbformat.write(nb, target)

    return {
        "demo-complete": answered(),
        "demo-blank": lambda target: shutil.copy2(released, target),
        "demo-half-done": answered(unanswered=half),
        "demo-kernel-dies": kernel_dies,
        "demo-missing": lambda target: target.with_name("notes.txt").write_text("no notebook"),
        "demo-not-json": lambda target: target.write_text('{"cells": [ not JSON'),
    }


def copy_course(dest: Path, root: Path = course.ROOT) -> Path:
    """A copy of the course (solutions, notebooks, autograder code) with no runtime state."""
    shutil.copytree(root / "solutions", dest / "solutions")
    shutil.copytree(root / "notebooks", dest / "notebooks")
    (dest / "autograder").mkdir()
    for item in (root / "autograder").iterdir():
        if item.is_file() and item.suffix in (".py", ".cfg", ".md", ".json"):
            shutil.copy2(item, dest / "autograder" / item.name)
    shutil.copytree(root / "autograder" / "templates", dest / "autograder" / "templates")
    return dest
