"""Every notebook's "N points in M exercises" line agrees with its nbgrader metadata.

The header a student reads first promises the points and the number of exercises; nbgrader
grades what the cells' metadata say: the points of the graded test cells, one exercise per
answer cell (a solution cell that is not itself graded). Section 05 said "20 points in 8
exercises" for 23 in 9 (issue 58); this test reads the line in every reference and released
notebook, so that an exercise added or re-weighted without its header fails here.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from tests.helpers import ROOT

NOTEBOOKS = sorted(
    path.relative_to(ROOT)
    for folder in ("solutions", "notebooks")
    for path in (ROOT / folder).rglob("*.ipynb")
    if ".ipynb_checkpoints" not in path.parts
)
# "There are 23 points in 9 exercises": the header line of every section.
POINTS_LINE = re.compile(r"(\d+)\s+points?\s+in\s+(\d+)\s+exercises?")


def _metadata_totals(nb: nbformat.NotebookNode) -> tuple[float, int]:
    """(points of the graded cells, answer cells) from the nbgrader metadata."""
    points, answers = 0.0, 0
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            points += float(meta.get("points", 0))
        elif meta.get("solution") and cell.cell_type == "code":
            answers += 1
    return points, answers


def _points_lines(nb: nbformat.NotebookNode) -> list[tuple[int, int, int]]:
    """(cell index, N, M) of each "N points in M exercises" in the markdown cells."""
    return [
        (index, int(match[1]), int(match[2]))
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "markdown"
        for match in POINTS_LINE.finditer(cell.source)
    ]


def test_the_course_has_notebooks():
    assert len([p for p in NOTEBOOKS if p.parts[0] == "solutions"]) >= 7


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_points_line_matches_metadata(path):
    nb = nbformat.read(ROOT / path, as_version=4)
    points, answers = _metadata_totals(nb)
    lines = _points_lines(nb)
    assert lines, (
        f"{path}: no 'N points in M exercises' line in any markdown cell; the metadata have "
        f"{points:g} points in {answers} exercises: say so in the header"
    )
    wrong = [(i, n, m) for i, n, m in lines if (n, m) != (points, answers)]
    assert not wrong, "; ".join(
        f"{path} cell {i} says {n} points in {m} exercises; the nbgrader metadata have "
        f"{points:g} points (the graded cells' sum) in {answers} exercises (answer cells)"
        for i, n, m in wrong
    )


def test_a_wrong_line_is_found():
    """The check itself: a header that disagrees with the metadata is reported."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("There are 20 points in 8 exercises."),
        nbformat.v4.new_code_cell("", metadata={"nbgrader": {"solution": True, "grade": False}}),
        nbformat.v4.new_code_cell("", metadata={"nbgrader": {"grade": True, "points": 3}}),
    ]
    assert _metadata_totals(nb) == (3.0, 1)
    assert _points_lines(nb) == [(0, 20, 8)]
