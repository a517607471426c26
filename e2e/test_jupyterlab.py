"""Every section's notebooks run in JupyterLab in a browser, as students and authors use them."""

from __future__ import annotations

import importlib
import inspect

import nbformat
import pytest

from autograder import fixtures
from e2e.conftest import ARTIFACTS, ROOT
from e2e.lab_page import ExplorerPanel, LabPage

NOTEBOOKS = sorted(p.relative_to(ROOT / "notebooks") for p in ROOT.glob("notebooks/*/*.ipynb"))
RUN_TIMEOUT_S = 480  # references: 15-25 s (the training project ~90 s) on 2 cores; room for slow CI


# The explorers (distopt.explore) by section, and the move each test makes: the control's key,
# the label of the option chosen, and the value that option puts into the settings.
EXPLORERS = {
    "02_memory_sharding": [("memory", "model", "Llama-3 8B", "llama3-8b")],
    "03_model_parallel": [
        ("pipeline", "schedule", "interleaved 1F1B", "interleaved"),
        ("planner", "model", "GPT-3 175B", "gpt3"),
    ],
    "06_federated": [("privacy", "clients_per_round", "100", 100)],
}


def _ids(paths):
    return [p.parent.name for p in paths]


def test_every_section_has_a_student_notebook():
    sections = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
    assert sorted({p.parent.name for p in NOTEBOOKS}) == sections


def _run(driver, lab_url, path: str, *, past_errors: bool) -> tuple[LabPage, dict]:
    page = LabPage(driver, lab_url, path)
    page.open()
    run = page.run_all_past_errors if past_errors else page.run_all
    state = run(timeout_s=RUN_TIMEOUT_S)
    page.save()
    return page, state


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_student_notebook_runs(notebook, driver, lab_url, stop_kernels):
    """Blank exercises raise NotImplementedError; nothing else may fail (imports included)."""
    page, state = _run(driver, lab_url, f"notebooks/{notebook.as_posix()}", past_errors=True)
    page.screenshot(ARTIFACTS / "screenshots" / f"{notebook.parent.name}_student.png")
    first = state["cells"][0]
    assert first["count"] is not None, "the kernel did not run the first cell"
    assert not first["errors"], f"the imports failed: {first['errors']}"
    not_run = [c["index"] for c in state["cells"] if c["count"] is None]
    assert not not_run, f"cells {not_run} did not run"
    errors = page.errors(state)
    assert errors, "a blank student notebook should raise NotImplementedError"
    others = [e for e in errors if e.ename != "NotImplementedError"]
    assert not others, "\n\n".join(map(str, others))
    for name, *_ in EXPLORERS.get(notebook.parent.name, []):
        # blank exercises: the explorer draws with the package's functions and says so
        explorer = ExplorerPanel(driver, name)
        explorer.draw()
        module = importlib.import_module(f"distopt.explore.{name}")
        explorer.wait_for(module.view(dict(module.DEFAULTS)).text)
        if _takes_answers(module):
            assert "still blank" in explorer.note(), explorer.note()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_reference_notebook_runs(notebook, driver, lab_url, stop_kernels):
    page, state = _run(driver, lab_url, f"solutions/{notebook.as_posix()}", past_errors=False)
    page.screenshot(ARTIFACTS / "screenshots" / f"{notebook.parent.name}_reference.png")
    not_run = [c["index"] for c in state["cells"] if c["count"] is None]
    assert not not_run, f"cells {not_run} did not run"
    errors = page.errors(state)
    assert not errors, "\n\n".join(map(str, errors))
    for name, key, label, value in EXPLORERS.get(notebook.parent.name, []):
        _move_a_control(driver, name, key, label, value)


def _takes_answers(module) -> bool:
    """Whether the explorer draws with the student's functions (the planner's does not: its
    exercises choose one layout, the explorer ranks them all with the package's model)."""
    return bool(inspect.signature(module.explorer).parameters)


def _move_a_control(driver, name: str, key: str, label: str, value) -> None:
    """Draw, move one control: the numbers and the figure change to what the package computes."""
    module = importlib.import_module(f"distopt.explore.{name}")
    explorer = ExplorerPanel(driver, name)
    explorer.draw()
    before = explorer.wait_for(module.view(dict(module.DEFAULTS)).text)
    if _takes_answers(module):
        assert explorer.note().startswith("computed with your"), explorer.note()
    explorer.move(key, label)
    # times out unless both the numbers and the figure change
    explorer.wait_for(module.view({**module.DEFAULTS, key: value}).text, other_than=before)
    explorer.screenshot(ARTIFACTS / "screenshots" / f"explorer_{name}.png")


def test_every_explorer_is_moved_in_the_browser():
    modules = sorted(
        p.stem for p in (ROOT / "shared" / "distopt" / "explore").glob("*.py")
        if p.stem not in ("__init__", "panel")
    )  # fmt: skip
    assert sorted(name for moves in EXPLORERS.values() for name, *_ in moves) == modules


@pytest.mark.parametrize(
    ("name", "key", "label", "value"),
    [move for moves in EXPLORERS.values() for move in moves],
    ids=[move[0] for moves in EXPLORERS.values() for move in moves],
)
def test_each_move_is_an_option_of_its_control(name, key, label, value):
    """Checked without a browser: the label the browser picks gives the value the test expects."""
    panel = importlib.import_module(f"distopt.explore.{name}").explorer()
    options = panel.controls[key].options
    pairs = [o if isinstance(o, tuple) else (str(o), o) for o in options]
    assert (label, value) in pairs, pairs
    assert panel.controls[key].value != value, "the move must change the control"


VALIDATE_SECTION, VALIDATE_NAME = "02_memory_sharding", "memory_sharding"


@pytest.mark.parametrize("answered", [True, False], ids=["answered", "blank"])
def test_validate_button(answered, driver, lab_url, lab_root, stop_kernels):
    """nbgrader's Validate button: success when answered, failing tests when blank."""
    name = f"{VALIDATE_NAME}_{'answered' if answered else 'blank'}.ipynb"
    if answered:
        nb = fixtures.answered_notebook(VALIDATE_SECTION, VALIDATE_NAME)
    else:
        nb = nbformat.read(ROOT / "notebooks" / VALIDATE_SECTION / f"{VALIDATE_NAME}.ipynb", 4)
    nbformat.write(nb, lab_root / "notebooks" / VALIDATE_SECTION / name)
    page = LabPage(driver, lab_url, f"notebooks/{VALIDATE_SECTION}/{name}")
    page.open()
    text = page.validate(timeout_s=RUN_TIMEOUT_S)
    page.screenshot(ARTIFACTS / "screenshots" / f"{VALIDATE_SECTION}_validate_{name[:-6]}.png")
    if answered:
        assert "Success! Your notebook passes all the tests." in text, text
    else:
        assert "The following cell failed:" in text, text
        assert "NotImplementedError" in text, text
