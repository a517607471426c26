"""Paths of the course and a way to run nbgrader with its configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AUTOGRADER = Path(__file__).resolve().parent
ROOT = AUTOGRADER.parent
SOLUTIONS = ROOT / "solutions"
NOTEBOOKS = ROOT / "notebooks"
SUBMITTED = AUTOGRADER / "submitted"
AUTOGRADED = AUTOGRADER / "autograded"
FEEDBACK = AUTOGRADER / "feedback"
WORK = AUTOGRADER / ".work"  # scratch space of the autograder, git-ignored


def sections() -> list[str]:
    """Section ids, from the folders of solutions/ (e.g. "02_memory_sharding")."""
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def section_notebooks(section: str) -> list[str]:
    """Notebook names (without .ipynb) of a section."""
    return sorted(p.stem for p in (SOLUTIONS / section).glob("*.ipynb"))


def tool_env() -> dict[str, str]:
    """The environment for nbgrader and its kernels: this interpreter's bin/ first on PATH.

    nbgrader runs `alembic` by name, and the notebooks' "python3" kernel must be this
    environment's Python, which has distopt installed.
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def nbgrader(*args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess:
    """Run `nbgrader ARGS` with the course configuration; output is captured, not raised."""
    command = [str(Path(sys.executable).parent / "nbgrader"), *args]
    return subprocess.run(
        command,
        cwd=AUTOGRADER,  # nbgrader reads nbgrader_config.py from its working directory
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
