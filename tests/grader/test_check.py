"""`make check`: the students' self-check reports differing cells and reveals no hidden test."""

import nbformat
import pytest

from autograder import check, course
from autograder.fixtures import edit_answer
from tests.helpers import RELEASED_NB, ROOT, SECTION, answered_notebook, run_module


@pytest.fixture()
def student_copy(tmp_path):
    """A notebooks/<section>/ folder of the student's own, outside the repository."""
    folder = tmp_path / "notebooks" / SECTION
    folder.mkdir(parents=True)
    return folder / RELEASED_NB.name


def _check(path):
    return run_module(ROOT, "autograder.check", str(path))


def _test_count() -> int:
    """How many graded test cells the released notebook has."""
    nb = nbformat.read(RELEASED_NB, as_version=4)
    return sum(1 for cell in nb.cells if course.is_test(cell))


def test_blank_notebook_fails_every_visible_test_and_leaks_nothing(student_copy):
    student_copy.write_bytes(RELEASED_NB.read_bytes())
    before = student_copy.read_bytes()
    done = _check(student_copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"visible tests passing:      0 of {_test_count()}" in done.stdout
    assert "not answered yet" in done.stdout
    assert "HIDDEN" not in done.stdout and "random.Random" not in done.stdout
    assert student_copy.read_bytes() == before, "the self-check must not change the notebook"


def test_a_wrong_answer_is_named_with_its_differing_output(student_copy):
    nb = answered_notebook()
    edit_answer(nb, "state_bytes_per_gpu", "if zero_stage >= 3:", "if zero_stage >= 2:")
    nbformat.write(nb, student_copy)
    done = _check(student_copy)
    assert done.returncode == 1
    total = _test_count()
    assert f"visible tests passing:      {total - 1} of {total}" in done.stdout
    assert (
        ", test_state_bytes_per_gpu (cell " in done.stdout and "visible test fails" in done.stdout
    )
    # the table printed with the student's function differs: ZeRO-2 at 17.5 GB, not 155.3 GB;
    # the cell is named by the heading above it and its first line (JupyterLab shows no cell
    # numbers), the two sides by whose they are, and no temporary folder is shown
    assert "prints something other than the reference" in done.stdout
    assert 'under "Exercise 1' in done.stdout and "cell 10:" not in done.stdout
    assert "yours:    " in done.stdout and "17.5 GB per G" in done.stdout
    assert "expected: " in done.stdout and "selfcheck-" not in done.stdout
    # the failed visible test's error is the catalogued mistake's (autograder/likely_bugs.py)
    flat = " ".join(done.stdout.split())
    assert "This failure looks like a typical mistake: weights sharded from stage 2" in flat


def test_a_complete_notebook_is_ready_to_submit(student_copy):
    nbformat.write(answered_notebook(), student_copy)
    done = _check(student_copy)
    assert done.returncode == 0, done.stdout
    assert "Ready to submit" in done.stdout


def test_a_notebook_that_is_not_from_the_course_gets_a_clear_error(tmp_path):
    stray = tmp_path / "mine.ipynb"
    stray.write_text("{}")
    done = _check(stray)
    assert done.returncode == 2
    assert "not a course notebook" in done.stdout
    done = _check(tmp_path / "nowhere.ipynb")
    assert done.returncode == 2 and "does not exist" in done.stdout


def test_a_missed_band_is_reported_in_words(tmp_path):
    """Section 04 without warm-up: its visible test fails, and the warm-up demo's band says why.

    The demo cells of float training are not compared digit by digit (their digits depend on
    the CPU); their claims are checked with bands, and a miss is reported as one.
    """
    from autograder.fixtures import answered_notebook as answered

    folder = tmp_path / "notebooks" / "04_large_batch"
    folder.mkdir(parents=True)
    nb = answered("04_large_batch", "large_batch")
    edit_answer(
        nb,
        "warmup_cosine_lr",
        "return peak_lr * (step + 1) / warmup_steps",
        "return peak_lr  # (bug: no warm-up)",
    )
    nbformat.write(nb, folder / "large_batch.ipynb")
    done = _check(folder / "large_batch.ipynb")
    assert done.returncode == 1, done.stdout
    assert ", test_warmup_cosine_lr (cell " in done.stdout
    assert "a measured number is outside the band the course states" in done.stdout
    assert "final test loss with warm-up is" in done.stdout
    assert "mismatch" not in done.stdout


def test_a_hang_keeps_its_per_rank_summary_and_a_stub_is_named(tmp_path):
    """What the notebook knows reaches the self-check: a launch that hangs is reported by rank,
    call and line with its hint (not the rank's raw stack), and a cell that needs an exercise
    still left as the stub names that exercise and where it is."""
    folder = tmp_path / "notebooks" / "01_data_parallel"
    folder.mkdir(parents=True)
    released = ROOT / "notebooks" / "01_data_parallel" / "data_parallel.ipynb"
    nb = nbformat.read(released, as_version=4)
    stub = next(
        i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id")
        == "naive_data_parallel"
    )  # fmt: skip
    stuck = nbformat.v4.new_code_cell(
        "def stuck(rank, world_size):\n"
        "    if rank == 0:\n"
        "        dist.barrier()  # rank 1 never joins\n"
        "    return rank\n"
        "launch(stuck, 2, timeout=20)"
    )
    needs = nbformat.v4.new_code_cell(
        "launch(naive_data_parallel, 2, ShardedProblem(shard_sizes=(8, 8)), timeout=30)"
    )
    nb.cells = [nb.cells[0], nb.cells[1], nb.cells[stub - 1], nb.cells[stub], stuck, needs]
    nbformat.write(nb, folder / "data_parallel.ipynb")
    done = _check(folder / "data_parallel.ipynb")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "LaunchTimeout: launch: timed out after 20 s; ranks [0" in out, out
    assert "rank 0 waits in torch.distributed.barrier, called at line 3 of stuck" in out
    assert "Check for a rank that skips a collective" in out
    assert 'File "<string>"' not in out and "Stack (most recent call first)" not in out
    heading = check._heading(nb.cells[2].source)
    assert (
        f'NotImplementedError: it needs naive_data_parallel, the answer under "{heading}" '
        "(cell 4), not answered yet" in out
    ), out
    assert "time: " in out and "machine: load " in out


def test_output_differences_are_cut_between_words_never_inside_one():

    line = "  ".join(f"stage {s}: {n:>5}" for s, n in enumerate([3, 14, 155.3, 12345678])) * 3
    other = line.replace("155.3", "17.5", 1)
    for shown in check._relabelled(["mismatch 'stdout'", f"- {line}", f"+ {other}"])[1:]:
        body = shown.split(": ", 1)[1].strip().removeprefix("...").removesuffix("...")
        assert body in line or body in other
        words = body.split()
        assert all(w in line.split() or w in other.split() for w in words), shown
    long = ["mismatch 'stdout'"] + [f"- a{i}" for i in range(9)] + [f"+ b{i}" for i in range(9)]
    assert check._relabelled(long)[-1] == "... and 5 more differing lines"


def test_the_machine_is_called_busy_above_one_runnable_process_per_core():

    roles = {0: ("test", 3, 'under "Exercise 1 — x", test_x (cell 3)', "test_x")}
    idle = check.timing_summary({0: 2.0}, roles, load=0.4, cores=2)
    loaded = check.timing_summary({0: 2.0}, roles, load=9.0, cores=2)
    assert 'under "Exercise 1 — x" 2 s' in idle[0]
    assert "(not busy)" in idle[1] and "busy: times stretch" in loaded[1]
