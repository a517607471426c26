"""Marks the slow tests by where they live, for `make test-fast` (`pytest -m "not slow"`).

Slow: the real-engine runs (tests/dist/, the torchrun trainer), the class runs and
self-checks of the autograder (they execute whole notebooks), JupyterLab's start-up, and
nbval over solutions/. Everything else is a unit test of the package or the autograder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SLOW = [
    "tests/dist/",
    "tests/project/test_train.py",
    "tests/grader/test_autograder.py",
    "tests/grader/test_check.py",
    "tests/grader/test_grading_runs.py",
    "tests/grader/test_hostile.py",
    "tests/grader/test_kernels.py",
    "tests/grader/test_release.py",
    "tests/grader/test_sections.py",
    "tests/repo/test_lab.py",
    "solutions/",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = Path(item.path).resolve().relative_to(ROOT).as_posix()
        if any(where.startswith(prefix) for prefix in SLOW):
            item.add_marker(pytest.mark.slow)
