"""Every explorer sits in its section's reference notebook as the course promises: in a plain
cell (not graded, not an answer), whose output nbval does not compare, that does no work."""

from pathlib import Path

import nbformat
import pytest

from tests.helpers import ROOT

EXPLORE = ROOT / "shared" / "distopt" / "explore"
MODULES = sorted(p.stem for p in EXPLORE.glob("*.py") if p.stem not in ("__init__", "panel"))


def _cells_using(name: str) -> list[tuple[Path, nbformat.NotebookNode]]:
    return [
        (path, cell)
        for path in sorted(ROOT.glob("solutions/*/*.ipynb"))
        for cell in nbformat.read(path, as_version=4).cells
        if cell.cell_type == "code" and f"from distopt.explore import {name}" in cell.source
    ]


def test_there_are_explorers():
    assert MODULES, "no explorer modules found"


@pytest.mark.parametrize("name", MODULES)
def test_each_explorer_has_a_live_cell_nbval_and_the_grader_leave_alone(name):
    found = _cells_using(name)
    assert found, f"no reference notebook shows the {name} explorer"
    for path, cell in found:
        where = f"{path.parent.name}: the {name} explorer's cell"
        assert cell.source.startswith("# NBVAL_IGNORE_OUTPUT"), where
        assert not cell.metadata.get("nbgrader"), f"{where} must not be graded or an answer"
        views = [o for o in cell.outputs if "application/vnd.jupyter.widget-view+json" in
                 o.get("data", {})]  # fmt: skip
        assert views, f"{where} stores no widget (was the notebook executed?)"
        # built, not drawn: the stored output is the panel alone, with no image or error
        assert not [o for o in cell.outputs if o.output_type == "error"], where
        assert not [o for o in cell.outputs if "image/png" in o.get("data", {})], where
