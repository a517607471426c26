"""Shared helpers: a private copy of the course, and notebooks made from the reference."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SECTION = "02_memory_sharding"
NOTEBOOK = "memory_sharding"
SOLUTION_NB = ROOT / "solutions" / SECTION / f"{NOTEBOOK}.ipynb"
RELEASED_NB = ROOT / "notebooks" / SECTION / f"{NOTEBOOK}.ipynb"

_SOLUTION_REGION = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", re.MULTILINE)


def copy_course(dest: Path) -> Path:
    """A copy of the course (solutions, notebooks, autograder code) with no runtime state."""
    shutil.copytree(ROOT / "solutions", dest / "solutions")
    shutil.copytree(ROOT / "notebooks", dest / "notebooks")
    (dest / "autograder").mkdir()
    for item in (ROOT / "autograder").iterdir():
        if item.is_file() and item.suffix in (".py", ".cfg"):
            shutil.copy2(item, dest / "autograder" / item.name)
    return dest


def run_module(course_root: Path, module: str, *args: str, timeout_s: float = 600):
    """Run `python -m MODULE ARGS` from a course copy, as the Makefile would."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=course_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def answered_notebook(replacements: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The released notebook with the reference answers typed in, as a student would.

    ``replacements`` maps a grade_id to the source that student writes in that cell instead.
    """
    solution = {c.id: c for c in nbformat.read(SOLUTION_NB, as_version=4).cells}
    nb = nbformat.read(RELEASED_NB, as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            source = (replacements or {}).get(meta["grade_id"])
            if source is None:
                source = _SOLUTION_REGION.sub("", solution[cell.id].source)
            cell.source = source
    return nb


def edit_answer(nb: nbformat.NotebookNode, grade_id: str, old: str, new: str) -> None:
    """Introduce a bug into one answer cell (the text must be there exactly once)."""
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    assert cell.source.count(old) == 1, f"{old!r} not found once in {grade_id}"
    cell.source = cell.source.replace(old, new)
