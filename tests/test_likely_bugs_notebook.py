"""The likely bug named in the notebook (distopt/likely_bugs.py): the note under a failed test's
traceback, from the table of the visible tests' failures only, in a real kernel."""

import json

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from distopt import likely_bugs

LINEAR = (  # section 04's visible check of linear_scaled_lr, failed by the inverted ratio
    "linear_scaled_lr(8192, defaults) returned 0.003125; expected 3.2: 8192 examples are "
    "32 x 256, so 32 x 0.1"
)


def _table(tmp_path, cases):
    path = tmp_path / f"likely_bugs_{len(list(tmp_path.iterdir()))}.json"  # tables are cached
    path.write_text(json.dumps({"tests": {"test_f": cases}}), encoding="utf-8")
    return path


def _case(name, message, hint=""):
    sig = likely_bugs.signature("AssertionError", message)
    case = {"name": name, "kind": "bug", "exact": sig.exact, "alike": sig.alike, "near": sig.near}
    return {**case, "hint": hint} if hint else case


def test_the_note_names_the_mistake_and_says_nothing_when_none_matches(tmp_path):
    table = _table(tmp_path, [_case("forgot to average", "rank 0 of 4: got 12 B, expected 3 B")])
    said = likely_bugs.note("AssertionError", "rank 1 of 4: got 12 B, expected 3 B", table=table)
    assert said.startswith("Likely bug: this failure looks like a typical mistake: forgot to")
    assert "exactly" in said and "12" not in said
    alike = likely_bugs.note("AssertionError", "rank 0 of 8: got 24 B, expected 3 B", table=table)
    assert "forgot to average" in alike and "numbers are off" in alike
    assert (
        likely_bugs.note("AssertionError", "rank 0 of 4: got 5 B, expected 3 B", table=table) == ""
    )
    assert likely_bugs.note("TypeError", "rank 0 of 4: got 12 B, expected 3 B", table=table) == ""
    # two mistakes that fail with this very message: both named, as one of two
    message = "got 0.0 s, expected 0.04851 s"
    tied = _table(tmp_path, [_case("the last bucket forgotten", message), _case("minus", message)])
    said = likely_bugs.note("AssertionError", message, table=tied)
    assert "one of these" in said and "the last bucket forgotten; or minus" in said


def test_the_shipped_table_holds_visible_failures_only():
    from autograder import likely_bugs as grader_side

    shipped = json.loads(likely_bugs.TABLE.read_text(encoding="utf-8"))["tests"]
    learned = json.loads(grader_side.TABLE.read_text(encoding="utf-8"))["tests"]
    visible = {(t, c["exact"]) for t, cs in learned.items() for c in cs if c.get("visible")}
    hidden = {(t, c["exact"]) for t, cs in learned.items() for c in cs} - visible
    assert shipped and hidden, "learned from both parts of the tests"
    pairs = {(t, c["exact"]) for t, cs in shipped.items() for c in cs}
    assert pairs <= visible and not pairs & hidden
    assert all("visible" not in c and "section" not in c for cs in shipped.values() for c in cs)


def test_a_failed_test_cell_in_a_kernel_shows_the_note_and_keeps_its_error(tmp_path):
    from autograder import runner

    nb = new_notebook(cells=[
        new_code_cell("import distopt"),
        new_code_cell(f"got = 0.003125\nassert got == 3.2, {LINEAR!r}"),
        new_code_cell("assert 1 == 2, 'nothing catalogued fails like this'"),
    ])  # fmt: skip
    runner.run(nb, tmp_path, timeout=60, allow_errors=True)
    named, unnamed = (c.outputs[0] for c in nb.cells[1:])
    assert (named.ename, named.evalue) == ("AssertionError", LINEAR)  # what the grader reads
    shown = "\n".join(named.traceback)
    assert "Likely bug: this failure looks like a typical mistake: ratio inverted" in shown
    assert "Likely bug" not in "\n".join(unnamed.traceback)
    assert nbformat.validate(nb) is None


def test_a_released_notebook_names_the_bug_under_its_failed_test(tmp_path):
    """Section 04's released notebook, answered with the inverted ratio (the catalogue's bug),
    the set-up, that answer and its test, run as the student runs it: the failed visible test
    shows the note."""
    from autograder import course, runner
    from tests.grader import mutants

    inverted = next(
        v for v in mutants.variants("large_batch") if v.name.startswith("ratio inverted")
    )
    nb = mutants.submission("04_large_batch", "large_batch", [inverted])
    first = next(i for i, c in enumerate(nb.cells) if mutants._is_answer(c))
    keep = {"linear_scaled_lr", "test_linear_scaled_lr"}  # the set-up, one answer, its test
    nb.cells = [c for i, c in enumerate(nb.cells) if i < first or mutants._grade_id(c) in keep]
    runner.run(nb, course.NOTEBOOKS / "04_large_batch", timeout=120, allow_errors=True)
    failed = {
        mutants._grade_id(c): o
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.output_type == "error"
    }
    assert set(failed) == {"test_linear_scaled_lr"}
    shown = "\n".join(failed["test_linear_scaled_lr"].traceback)
    assert "Likely bug: this failure looks like a typical mistake: ratio inverted" in shown


def _launch_report(rank: int, error: str, where: str) -> str:
    """The launcher's LaunchError text for an exception raised in a rank (engine/launcher.py)."""
    return (
        f"launch: rank {rank} of 2 raised {error}\n\nTraceback of rank {rank}:\n"
        f'  File "{where}", line {17 + rank}, in naive_data_parallel\n'
        "    assert False\n" + error
    )


def test_a_rank_exception_is_named_by_the_ranks_own_error(tmp_path):
    """A visible test that launches rank code fails with the launcher's LaunchError, whose
    traceback (paths, line numbers, which rank) varies with the student's code: the signature
    is the rank's own error, so the note names the mistake there too."""
    inner = "AssertionError: rank 1 of 2: got 12 B, expected 3 B"
    one = _launch_report(1, inner, "/tmp/ipykernel_301/57914874.py")
    other = _launch_report(0, "distopt.x." + inner, "/tmp/ipykernel_999/1234.py")
    assert likely_bugs.rank_error("LaunchError", one) == (
        "AssertionError",
        "rank 1 of 2: got 12 B, expected 3 B",
    )
    assert likely_bugs.signature("LaunchError", one) == likely_bugs.signature("LaunchError", other)
    table = _table(tmp_path, [_case("forgot to average", "rank 0 of 2: got 12 B, expected 3 B")])
    assert "forgot to average" in likely_bugs.note("LaunchError", other, table=table)
    # another error raised by the launcher itself (a hang) keeps its own signature
    assert likely_bugs.rank_error("LaunchTimeout", one)[0] == "LaunchTimeout"
