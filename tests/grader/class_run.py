"""One class run for the grader's tests: every notebook is graded once, for several checks.

Per section (tests/grader/test_sections.py):

* ``blank``: the released notebook, nothing answered;
* ``reference``: the reference answers typed into the released notebook, with its graded tests
  rearranged as a careless or cheating student might: every other test between the first and
  the last deleted (the autograder must put them back where they run), the others moved to the
  end, the first moved above its own exercise (it must fail, and only it), and the last run
  after a cell that patches what that test relies on (it must lose its points to the
  tampering check). One submission answers four questions.

Each is a whole notebook, as a student hands it in, and is graded as every submission is:
the cells the course tags show-only are left out (autograder/show_only.py). So the scores
below, next to nbval's run of every cell of every reference notebook, show that leaving them
out changes no outcome; the browser tests (e2e/test_jupyterlab.py) run the reference and the
blank student notebooks on this machine's own kernels, where the blank's demo cells may fail
only with the exercises' NotImplementedError.

Per section also the mutant students of tests/grader/mutants (``mutants-1``, ...: each a
whole notebook with typical bugs and shortcuts typed in, checked by test_mutants.py: each
loses exactly its points with the show-only cells left out).

For section 02 also the fixture class of tests/grader/test_autograder.py (typical bugs, a
dead kernel, a missing notebook, a file that is not JSON). tests/grader/test_release.py
reads the student notebooks the run's registration made.
"""

from __future__ import annotations

from collections.abc import Callable

import nbformat

from autograder import course, fixtures
from autograder.fixtures import kill_kernel_in
from tests.grader import mutants
from tests.helpers import answered_notebook

ALL_TESTS = {
    "test_state_bytes_per_gpu": 3,
    "test_min_gpus_to_fit": 2,
    "test_bytes_sent_per_step": 2,
    "test_choose_recompute": 3,
    "test_peak_bytes_per_gpu": 2,
    "test_fsdp_peak_bytes": 2,
    "test_fsdp_step_seconds": 2,
    "test_zero1_adam": 3,
    "test_fsdp_sgd": 3,
    "test_checkpoint_plan": 2,
}
MAX_SCORE = sum(ALL_TESTS.values())


# Right answers computed by the package, each held another way than by name (own_work must
# catch every one while the test runs): a default argument, a second copy of the module loaded
# from its file, and a thread. (Typical bugs and pasted numbers: tests/grader/mutants.)
_DELEGATES = {
    "bytes_sent_per_step": """\
from distopt.costs import comm
def bytes_sent_per_step(num_params, zero_stage, world_size, *, weight_bytes=2, grad_bytes=2,
                        micro_batches=1, _bytes=comm.sharded_step_bytes_sent):
    return _bytes(num_params, zero_stage=zero_stage, world_size=world_size,
                  weight_bytes=weight_bytes, grad_bytes=grad_bytes, micro_batches=micro_batches)
""",
    "choose_recompute": """\
import importlib.util, sys
from distopt.costs import memory as _memory
_spec = importlib.util.spec_from_file_location("my_memory", _memory.__file__)
my_memory = importlib.util.module_from_spec(_spec)
sys.modules["my_memory"] = my_memory
_spec.loader.exec_module(my_memory)
def choose_recompute(num_layers, seq_len, micro_batch, hidden, heads, budget_bytes):
    for mode in ("none", "selective", "full"):
        stored = num_layers * vars(my_memory)["activation_bytes_per_layer"](
            seq_len, micro_batch, hidden, heads, recompute=mode)
        if stored <= budget_bytes:
            return mode, stored
    return None, stored
""",
    "fsdp_peak_bytes": """\
import threading
def fsdp_peak_bytes(layer_num_params, world_size, **widths):
    found = []
    simulate = getattr(memory, "simulate_" + "fully_sharded_step")
    worker = threading.Thread(target=lambda: found.extend(
        simulate(layer_num_params, world_size, prefetch=True, **widths)))
    worker.start()
    worker.join()
    return max(e.bytes_in_use for e in found) if found else 0.0
""",
}


def _answered():
    """The reference answers, the whole notebook."""
    return answered_notebook()


# A first cell that writes down what the kernel held before the notebook imported anything
# (test_autograder.py: a section that imports torch gets kernels forked warm with it).
AT_BIRTH = "kernel_at_birth.json"
_LOOK_AT_BIRTH = f"""\
import gc, json, sys
from multiprocessing import forkserver
with open({AT_BIRTH!r}, "w") as f:
    json.dump({{"frozen_heap": gc.get_freeze_count() > 0, "torch": "torch" in sys.modules,
               "fork_server": forkserver._forkserver._forkserver_pid is not None}}, f)
"""


def _answered_looking_at_birth():
    nb = _answered()
    nb.cells.insert(0, nbformat.v4.new_code_cell(_LOOK_AT_BIRTH))
    return nb


def _delegates():
    nb = _answered()
    for grade_id, source in _DELEGATES.items():
        next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)[
            "source"
        ] = source
    return nb


def _cell_number(grade_id: str) -> int:
    """The 1-based number the grader gives a cell of the memory notebook."""
    nb = answered_notebook()
    return 1 + next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get(
        "grade_id") == grade_id)  # fmt: skip


def _kernel_dies():
    nb = answered_notebook()
    kill_kernel_in(nb, "bytes_sent_per_step")
    return nb


# student id -> (notebook or None, expected score, expected status, failing tests)
SECTION_02_CLASS = {
    "answered": (_answered_looking_at_birth, MAX_SCORE, "graded", set()),
    "blank": ("blank", 0, "graded", set(ALL_TESTS)),
    # dies in the answer cell of exercise 3: the two tests before it count
    "kernel_dies": (
        _kernel_dies,
        5,
        f"error: kernel died in cell {_cell_number('bytes_sent_per_step')} (bytes_sent_per_step)",
        set(ALL_TESTS) - {"test_state_bytes_per_gpu", "test_min_gpus_to_fit"},
    ),
    # each delegating answer fails its own test only (the later tests are given the reference)
    "delegates": (
        _delegates,
        MAX_SCORE - 2 - 3 - 2,
        "graded",
        {"test_bytes_sent_per_step", "test_choose_recompute", "test_fsdp_peak_bytes"},
    ),
    "missing": (None, 0, "missing", set(ALL_TESTS)),
    "not_json": (
        "not json",
        0,
        "error: memory_sharding.ipynb is not a valid notebook",
        set(ALL_TESTS),
    ),
}


SECTIONS = [(s, nb) for s in course.sections() for nb in course.section_notebooks(s)]
PATCH_ID = "student-patch"
# What a cheating cell would patch before the last test, by what that test relies on.
PATCHES = [
    ("data_parallel_checks.", "from distopt.ranks import data_parallel_checks\n"
     "data_parallel_checks.assert_weights_match = lambda *args, **kwargs: None  # all agree"),
    ("np.", "import numpy\nnumpy.allclose = lambda *args, **kwargs: True  # all agree"),
    ("math.", "import math\nmath.isclose = lambda *args, **kwargs: True  # all agree"),
    ("own_work", "import distopt.grading\ndistopt.grading.own_work = lambda fn, *targets: fn"),
]  # fmt: skip


def graded_tests(nb) -> list:
    return [c for c in nb.cells if course.is_test(c)]


def rearranged(nb: nbformat.NotebookNode) -> tuple[list, list]:
    """Rearrange ``nb``'s graded tests as described above; return (deleted, moved) tests."""
    tests = graded_tests(nb)
    first, middle, last = tests[0], tests[1:-1], tests[-1]
    moved, deleted = middle[0::2], middle[1::2]
    patch = next(code for used, code in PATCHES if used in last.source)
    answer = max(
        i for i, c in enumerate(nb.cells[: nb.cells.index(first)])
        if course.is_answer(c)
    )  # fmt: skip
    cells = [c for c in nb.cells if not course.is_test(c)]
    cells.insert(cells.index(nb.cells[answer]), first)  # above its own exercise
    patch_cell = nbformat.v4.new_code_cell(patch)
    patch_cell.id = PATCH_ID
    nb.cells = cells + moved + [patch_cell, last]
    return deleted, moved


def reference(section: str, notebook: str) -> nbformat.NotebookNode:
    nb = fixtures.answered_notebook(section, notebook)
    rearranged(nb)
    return nb


def deleted_and_moved(section: str, notebook: str) -> tuple[list[str], list[str]]:
    """The grade ids :func:`reference` deletes and moves to the end, for the tests."""
    nb = fixtures.answered_notebook(section, notebook)
    deleted, moved = rearranged(nb)
    return [c.metadata["nbgrader"]["grade_id"] for c in deleted], [
        c.metadata["nbgrader"]["grade_id"] for c in moved
    ]


def first_test(section: str, notebook: str) -> dict:
    nb = nbformat.read(course.NOTEBOOKS / section / f"{notebook}.ipynb", as_version=4)
    return graded_tests(nb)[0].metadata["nbgrader"]


def last_test(section: str, notebook: str) -> dict:
    nb = nbformat.read(course.SOLUTIONS / section / f"{notebook}.ipynb", as_version=4)
    return graded_tests(nb)[-1].metadata["nbgrader"]


def blank(section: str, notebook: str) -> nbformat.NotebookNode:
    """The released notebook, nothing answered."""
    return nbformat.read(course.NOTEBOOKS / section / f"{notebook}.ipynb", as_version=4)


def write_class(submitted, section_02_class: dict[str, Callable | str | None]) -> None:
    """All the submissions above under ``submitted/<student>/<section>/``."""
    for section, notebook in SECTIONS:
        folder = submitted / "reference" / section
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(reference(section, notebook), folder / f"{notebook}.ipynb")
        folder = submitted / "blank" / section
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(blank(section, notebook), folder / f"{notebook}.ipynb")
        for k, chosen in enumerate(mutants.rounds(section, notebook)):
            folder = submitted / mutants.student_id(k) / section
            folder.mkdir(parents=True, exist_ok=True)
            nbformat.write(
                mutants.submission(section, notebook, chosen), folder / f"{notebook}.ipynb"
            )
    section, notebook = "02_memory_sharding", "memory_sharding"
    for student, source in section_02_class.items():
        folder = submitted / student / section
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{notebook}.ipynb"
        if source == "not json":
            target.write_text('{"cells": [ this is not JSON')
        elif callable(source):
            nbformat.write(source(), target)
        elif source is None:
            (folder / "notes.txt").write_text("forgot the notebook")
