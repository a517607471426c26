"""Where grading time goes (autograder/stopwatch.py) and the feedback page's exporter that
leaves out nbconvert's last pass (autograder/nbgrader_plugins.feedback_exporter)."""

from __future__ import annotations

import base64
import time

import nbformat
import pytest

from autograder import stopwatch


@pytest.fixture(autouse=True)
def _clean():
    stopwatch.reset()
    yield
    stopwatch.reset()


def test_a_step_inside_another_counts_only_in_its_own_line():
    with stopwatch.step("nbgrader"):
        time.sleep(0.02)
        with stopwatch.step("cells"):
            time.sleep(0.05)
            with stopwatch.step("fingerprints"):
                time.sleep(0.01)
        with stopwatch.step("cells"):
            time.sleep(0.03)
    spent = stopwatch.spent()
    assert 0.08 <= spent["cells"] < 0.08 + 0.05
    assert 0.01 <= spent["fingerprints"] < 0.01 + 0.05
    assert 0.02 <= spent["nbgrader"] < 0.02 + 0.05  # less the 0.09 s counted inside


def test_a_step_that_raises_is_counted_and_the_lines_add_up(tmp_path):
    with pytest.raises(ValueError), stopwatch.step("page"):
        time.sleep(0.01)
        raise ValueError
    assert stopwatch.spent()["page"] >= 0.01
    path = tmp_path / "timings.jsonl"
    stopwatch.write(path, "ann", "01_data_parallel")
    stopwatch.reset()
    with stopwatch.step("page"):
        time.sleep(0.01)
    stopwatch.write(path, "bob", "01_data_parallel")
    stopwatch.write_run(path, {"report": 0.5, "main": 3.0})
    lines = stopwatch.read(path)
    assert [line.get("student") for line in lines] == ["ann", "bob", None]
    total = stopwatch.totals(lines)
    assert set(stopwatch.STEPS) <= set(total) and total["page"] >= 0.02
    table = stopwatch.table(lines)
    assert table.count("\n") == len(total) + 1  # a header, a rule and one row per step
    assert "| page |" in table and "| seal | 0.00 |" in table


def _notebook_with_a_figure() -> nbformat.NotebookNode:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()
    nb = nbformat.v4.new_notebook()
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A heading\n\nSome *text* and `code`."),
        nbformat.v4.new_code_cell(
            "x = [1, 2]\nprint(x)",
            outputs=[
                nbformat.v4.new_output("stream", name="stdout", text="[1, 2]\n"),
                nbformat.v4.new_output("display_data", data={"image/png": png}),
            ],
        ),
    ]
    return nb


def test_the_page_exporter_renders_what_nbconvert_does_less_its_soup_pass():
    """Leaving out HTMLExporter's BeautifulSoup pass changes nothing but the serialisation
    and the words of a figure's description: both pages, parsed, are the same page."""
    from bs4 import BeautifulSoup
    from nbconvert.exporters import HTMLExporter

    from autograder.nbgrader_plugins import feedback_exporter

    nb = _notebook_with_a_figure()
    theirs, _ = HTMLExporter(template_name="classic").from_notebook_node(nb)
    exporter = feedback_exporter()(template_name="classic")
    ours, _ = exporter.from_notebook_node(nb)
    ours_again, _ = feedback_exporter()(template_name="classic").from_notebook_node(nb)
    assert ours_again == ours  # the second page, from compiled templates, is the same
    assert 'alt="a figure the notebook drew"' in ours
    theirs = theirs.replace("No description has been provided for this image",
                            "a figure the notebook drew")  # fmt: skip
    parsed = BeautifulSoup(ours, features="html.parser").decode()
    assert parsed.count("<") == theirs.count("<") and parsed == theirs
