"""The code follows the project's ruff configuration (pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

RUFF = Path(sys.executable).parent / "ruff"
CODE = ["."]  # as `make lint`: pyproject.toml's [tool.ruff] exclude says what is left out


def test_ruff_lint():
    done = subprocess.run([RUFF, "check", *CODE], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format():
    done = subprocess.run(
        [RUFF, "format", "--check", *CODE], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, "run `ruff format .`\n" + done.stdout
