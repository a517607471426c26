"""The text of every notebook: no control characters in any cell's source.

A markdown cell written from a non-raw Python string loses its LaTeX to escapes: ``"\\frac"``
becomes a form feed and ``rac``, ``"\\alpha"`` a bell and ``lpha``. Jupyter renders them without
complaint, so only a check of the characters themselves finds them.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import ROOT

NOTEBOOKS = sorted(
    path.relative_to(ROOT)
    for folder in ("solutions", "notebooks", "autograder/catalogue")
    for path in (ROOT / folder).rglob("*.ipynb")
    if ".ipynb_checkpoints" not in path.parts
)
# Tab and newline are text; every other C0 control character, and DEL, is not.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def test_the_course_has_notebooks():
    assert len([p for p in NOTEBOOKS if p.parts[0] == "solutions"]) >= 7


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_no_control_characters_in_cell_sources(path):
    cells = json.loads((ROOT / path).read_text(encoding="utf-8"))["cells"]
    found = []
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        for match in CONTROL.finditer(source):
            context = source[max(0, match.start() - 20) : match.end() + 20]
            found.append(f"cell {index} ({cell['cell_type']}): {match.group()!r} in {context!r}")
    assert not found, (
        f"{path}: control characters (a backslash escape in a non-raw Python string?): "
        + "; ".join(found[:5])
    )
