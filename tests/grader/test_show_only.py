"""Which cells grading leaves out (autograder/show_only.py), without a kernel.

Whether leaving them out changes any grade is checked by running: tests/grader/test_sections.py
grades every section's reference, blank and catalogue submissions as whole notebooks with the
show-only cells left out and compares each test's outcome with a run of every cell.
"""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder import course, show_only

SETUP = "import numpy as np"
PLOT = "fig = np.ones(3)\nprint(fig)"
SWEEP = "for n in range(3):\n    table = n * 2"


def _plan(sources, marked=(PLOT, SWEEP), always=()):
    return show_only.plan(sources, [show_only.digest(s) for s in marked], always)


def test_an_unchanged_marked_cell_no_one_needs_is_skipped():
    assert _plan([SETUP, PLOT, "x = 1", SWEEP, "assert x == 1"]) == {1, 3}


def test_whitespace_at_line_ends_does_not_make_a_cell_changed():
    assert _plan([SETUP, PLOT.replace("\n", "   \n") + "\n\n"]) == {1}


def test_a_changed_cell_runs_as_the_student_wrote_it():
    assert _plan([SETUP, PLOT + "\nx = 2", SWEEP]) == {2}


def test_a_marked_cell_whose_name_a_running_cell_needs_runs():
    # the answer reads `table`, which only the sweep assigns: the sweep runs
    assert _plan([SETUP, SWEEP, "def f():\n    return table", PLOT]) == {3}
    # a function defined before the cell still needs it when it is called later
    assert _plan(["def g():\n    return fig", PLOT, "g()"]) == set()


def test_a_cell_kept_for_its_names_keeps_what_it_needs():
    first = "base = 3"
    second = "shown = base * 2"
    sources = [first, second, "assert shown == 6"]
    assert _plan(sources, marked=(first, second)) == set()
    assert _plan([first, second, "pass"], marked=(first, second)) == {0, 1}


def test_names_reached_without_writing_them_out_run_every_cell():
    for reach in (
        "globals()['fig']",
        "eval('fig')",
        "exec('print(fig)')",
        "vars()",
        "Out[3]",
        "_5",
        "print(_)",
        "get_ipython().user_ns",
        "import __main__",
        "import sys\nsys.modules['__main__'].fig",
    ):
        assert _plan([SETUP, PLOT, reach]) == set(), reach
    # an object's own names, a namespace of one's own: not the notebook's
    for own in ("vars(np)", "exec('y = 1', {})", "eval('1', {}, {})", "for _ in range(2): pass"):
        assert _plan([SETUP, PLOT, own]) == {1}, own
    # ... only where they run: a skipped cell may use them
    assert _plan([SETUP, PLOT, "globals()"], marked=(PLOT, "globals()")) == {1, 2}


def test_a_cell_that_is_not_python_runs_every_cell():
    assert _plan([SETUP, PLOT, "def broken(:"]) == set()
    assert _plan(["%matplotlib inline", PLOT]) == {1}  # the one magic that names nothing
    broken = "def broken(:"
    assert _plan([SETUP, broken, "x = 1"], marked=(broken,)) == {1}  # left out, it reaches nothing


def test_a_top_level_read_before_the_cell_or_after_its_own_assignment_needs_nothing():
    assert _plan(["print(fig)", PLOT]) == {1}  # read before the cell that binds it
    assert _plan([SETUP, PLOT, "fig = 2\nprint(fig)"]) == {1}  # assigned first, then read
    assert _plan([SETUP, PLOT, "for fig in range(2):\n    print(fig)"]) == {1}
    assert _plan([SETUP, PLOT, "if np:\n    fig = 1\nprint(fig)"]) == set()  # maybe not
    assert _plan([SETUP, PLOT, "fig += 1"]) == set()  # reads it first
    assert _plan([SETUP, PLOT, "print([fig for _ in range(2)])"]) == set()


def test_importing_again_what_a_running_cell_imported_binds_nothing_new():
    again = "import numpy as np\nshown = np.zeros(2)"
    assert _plan([SETUP, again, "def f():\n    return np.ones(1)"], marked=(again,)) == {1}
    other = "import math as np\nshown = 1"
    assert _plan([SETUP, other, "def f():\n    return np.ones(1)"], marked=(other,)) == set()


def test_an_error_naming_what_a_left_out_cell_binds_asks_for_every_cell():
    from autograder import outcomes

    nb = new_notebook(cells=[new_code_cell(SETUP), new_code_cell(PLOT), new_code_cell("f()")])
    outcomes.record(nb.cells[1], outcomes.ShowOnly(cell=2))
    assert not show_only.needed_after_all(nb)
    for ename, evalue in [
        ("KeyError", "'fig'"),
        ("NameError", "name 'fig' is not defined"),
        ("AttributeError", "module '__main__' has no attribute 'fig'"),
    ]:
        nb.cells[2].outputs = [nbformat.v4.new_output("error", ename=ename, evalue=evalue)]
        assert show_only.needed_after_all(nb), evalue
    for ename, evalue in [
        ("KeyError", "'other'"),  # not a name the left-out cell binds
        ("AssertionError", "{'fig': 2} differs from {'fig': 3}"),  # quotes it, misses nothing
        ("NameError", "name 'other' is not defined"),
    ]:
        nb.cells[2].outputs = [nbformat.v4.new_output("error", ename=ename, evalue=evalue)]
        assert not show_only.needed_after_all(nb), evalue


def test_answers_and_tests_always_run():
    assert _plan([SETUP, PLOT], always=[1]) == set()


def test_every_way_of_assigning_a_name_counts():
    for assigns in (
        "import numpy.linalg as fig",
        "from math import pi as fig",
        "def fig(): pass",
        "class fig: pass",
        "for fig in range(2): pass",
        "with open(__file__) as fig: pass",
        "try:\n    pass\nexcept Exception as fig:\n    pass",
        "(fig := 3)",
        "def h():\n    global fig\n    fig = 1",
        "match 3:\n    case fig:\n        pass",
    ):
        assert _plan([assigns, "fig"], marked=(assigns,)) == set(), assigns
        assert _plan([assigns, "other"], marked=(assigns,)) == {0}, assigns


def test_the_tag_is_read_from_the_release_not_the_submission(tmp_path):
    released = new_notebook(cells=[new_code_cell(SETUP), new_code_cell(PLOT)])
    released.cells[1].metadata["tags"] = [show_only.TAG]
    nbformat.write(released, tmp_path / "nb.ipynb")
    digests = show_only.marked(tmp_path / "nb.ipynb")
    submission = new_notebook(
        cells=[new_markdown_cell("# mine"), new_code_cell(SETUP), new_code_cell(PLOT)]
    )
    submission.cells[1].metadata["tags"] = [show_only.TAG]  # the student's tag: ignored
    assert show_only.plan_notebook(submission, digests) == {2}
    assert show_only.marked(tmp_path / "missing.ipynb") == frozenset()


def _released(section: str):
    folder = course.ROOT / "notebooks" / section
    return [
        (name, nbformat.read(folder / f"{name}.ipynb", as_version=4))
        for name in course.section_notebooks(section)
    ]


@pytest.mark.parametrize("section", course.sections())
def test_every_tagged_cell_is_plain_code_and_left_out_of_the_reference(section):
    """A tagged cell that grading would run anyway (a test or an answer reads its names) is
    a mistake in the tags: the author is told which."""
    for name, nb in _released(section):
        tagged = [i for i, c in enumerate(nb.cells) if show_only.is_marked(c)]
        assert tagged, f"{section}/{name}: no cell is tagged {show_only.TAG}"
        for i in tagged:
            assert not show_only._graded_role(nb.cells[i]), f"{section} cell {i + 1}"
        digests = {show_only.digest(nb.cells[i].source) for i in tagged}
        skipped = show_only.plan_notebook(nb, digests)
        kept = sorted(set(tagged) - skipped)
        assert not kept, (
            f"{section}/{name}: tagged {show_only.TAG} but needed by a cell that runs: cells "
            f"{[i + 1 for i in kept]}"
        )
