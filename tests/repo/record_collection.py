"""A pytest plugin that writes down what a collection found, for tests/repo/test_coverage.py.

    python -m pytest --collect-only -p tests.repo.record_collection tests ...

with ``RECORD_COLLECTION_TO`` naming a JSON file: it receives every collected item's file
(relative to the repository's root) and whether it is marked slow, the conftest.py files
pytest loaded, and what failed to collect, with pytest's reason. Only that command loads it,
never `make test`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT

OUTPUT_VARIABLE = "RECORD_COLLECTION_TO"
_errors: list[dict[str, str]] = []  # the files (or folders) whose collection failed, and why


def _relative(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the repository's root, with forward slashes."""
    return Path(path).resolve().relative_to(ROOT).as_posix()


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _errors.append({"path": report.nodeid, "why": str(report.longrepr)[-3000:]})


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [
        {"file": _relative(item.path), "slow": item.get_closest_marker("slow") is not None}
        for item in session.items
    ]
    conftests = sorted(
        _relative(plugin.__file__)
        for plugin in session.config.pluginmanager.get_plugins()
        if Path(getattr(plugin, "__file__", None) or "-").name == "conftest.py"
    )
    record = {"items": items, "conftests": conftests, "errors": _errors}
    Path(os.environ[OUTPUT_VARIABLE]).write_text(json.dumps(record, indent=1))
