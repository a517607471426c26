"""Marks tests by where they live: which are slow, and which run together.

It lives at the repository's root so that it marks every item pytest collects here, the
reference notebooks' nbval cells (`pytest solutions --nbval`) as much as tests/.

* slow, for `make test-fast` (`pytest -m "not slow"`): the real-engine runs (tests/engine/,
  tests/ranks/, the torchrun trainer), the class runs and self-checks of the autograder (they
  execute whole notebooks), JupyterLab's start-up, and nbval over solutions/;
* units of work, for `pytest -n 2 --dist loadfile` (make test): each file runs whole on one
  worker, so that a notebook's cells run in order in one kernel, except that the four files
  sharing the autograder's class run (tests/grader/conftest.py) are one unit: the run is
  graded once, on the worker that has them. The slow units start first, heaviest first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
# Heaviest first: under `make test` the units of work start in this order, so that the
# fast files fill the gaps at the end instead of a long one starting last.
SLOW = [
    "solutions/07_training_project/",  # nbval's kernels start cold: about 3 minutes
    "tests/grader/test_sections.py",  # with test_autograder and test_release: the class run
    "tests/grader/test_autograder.py",
    "tests/grader/test_release.py",
    "tests/grader/test_mutants.py",
    "tests/grader/test_hostile.py",
    "tests/grader/test_under_load.py",  # graded beside stress-ng: about 2 minutes
    "tests/coursehub/test_counted.py",  # runs nbgrader's collect: 3-20 s a test
    "tests/grader/test_grading_runs.py",
    "tests/grader/test_postgres.py",
    "tests/grader/test_slurm.py",
    "tests/grader/test_check.py",
    "tests/grader/test_heldout.py",  # section 04's held-out mistakes graded: about 10 s
    "tests/project/test_train.py",
    "solutions/",
    "tests/ranks/",
    "tests/engine/",
    "tests/grader/test_kernels.py",
    "tests/repo/test_lab.py",
]


CLASS_RUN = {
    "tests/grader/test_autograder.py",
    "tests/grader/test_mutants.py",
    "tests/grader/test_release.py",
    "tests/grader/test_sections.py",
}


def _slow_rank(item: pytest.Item) -> int:
    """The index of the item's entry in SLOW, or len(SLOW) for a fast test."""
    where = Path(item.path).resolve().relative_to(ROOT).as_posix()
    return next((k for k, prefix in enumerate(SLOW) if where.startswith(prefix)), len(SLOW))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ranks = {item.nodeid: _slow_rank(item) for item in items}
    for item in items:
        if ranks[item.nodeid] < len(SLOW):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: ranks[item.nodeid])  # stable: a file's tests keep their order


@pytest.fixture()
def one_torch_thread():
    """One torch thread for a test: the fastest for tiny models, and a fixed summation order.
    (Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.)"""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _scope(nodeid: str) -> str:
    """The unit of work one xdist worker runs whole: the test's file, or the class run."""
    where = nodeid.split("::", 1)[0]
    return "class run" if where in CLASS_RUN else where


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `--dist loadfile`, schedule by file, with the four class-run files as one unit.

    (xdist's own `loadgroup` marks do not reach its scheduler under pytest 9.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False  # keep SLOW's order, not the largest files first
    from xdist.scheduler import LoadScopeScheduling

    class FileOrClassRun(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return FileOrClassRun(config, log)
