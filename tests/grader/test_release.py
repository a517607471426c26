"""notebooks/ is exactly what `make release` makes from solutions/, and hides what it should."""

import json

import nbformat
import pytest

from autograder.worker import RELEASE_SCRATCH
from tests.helpers import ROOT

SECTIONS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())


def _comparable(path):
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def fresh_release(graded):
    """What `make release` makes, as the shared class run registered every section with the
    same call (autograder.release.generate_assignment) into its scratch release folder."""
    return graded.course / RELEASE_SCRATCH


@pytest.mark.parametrize("section", SECTIONS)
def test_committed_student_notebooks_are_up_to_date(fresh_release, section):
    committed = sorted(p.name for p in (ROOT / "notebooks" / section).glob("*.ipynb"))
    generated = sorted(p.name for p in (fresh_release / section).glob("*.ipynb"))
    assert committed == generated, "run `make release` and commit notebooks/"
    for name in generated:
        assert _comparable(ROOT / "notebooks" / section / name) == _comparable(
            fresh_release / section / name
        ), f"notebooks/{section}/{name} is out of date: run `make release` and commit it"


@pytest.mark.parametrize("section", SECTIONS)
def test_student_notebooks_hide_solutions_and_hidden_tests(section):
    for path in (ROOT / "notebooks" / section).glob("*.ipynb"):
        text = path.read_text()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS"):
            assert marker not in text, f"{path} contains {marker!r}"
        nb = nbformat.read(path, as_version=4)
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("section", SECTIONS)
def test_reference_notebooks_store_outputs_without_errors(section):
    for path in (ROOT / "solutions" / section).glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.execution_count is not None for c in code), (
            f"{path} has unexecuted cells: run `make execute`"
        )
        errors = [o for c in code for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{path} stores an error output"
        graded = [c for c in code if c.metadata.get("nbgrader", {}).get("grade")]
        assert all(c.metadata["nbgrader"]["points"] > 0 for c in graded)
        assert all("BEGIN HIDDEN TESTS" in c.source for c in graded), (
            "every graded test cell needs hidden tests, so a pasted number never passes"
        )
