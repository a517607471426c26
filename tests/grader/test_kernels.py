"""nbval's kernels run on other CPU kernels than the test process (solutions/conftest.py).

A one-cell notebook that prints what its kernel sees, stored with the lowest kernels'
settings as its output, runs under the same conftest: it must pass, and with
NBVAL_KERNELS=native (the machine's own kernels) it must fail.
"""

import os
import shutil
import subprocess
import sys

import nbformat

from autograder.spread import SELECTIONS, lowest_kernels
from tests.helpers import ROOT

PROBE = (
    "import os\n"
    "import torch\n"
    "print(torch.backends.cpu.get_cpu_capability())\n"
    "print({k: os.environ.get(k) for k in sorted(KEYS)})"
)


def _run(folder, keys, **env):
    """pytest --nbval on the probe; the caller's kernel settings removed, the course importable."""
    base = {k: v for k, v in os.environ.items() if k not in keys}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-q",
            str(folder / "probe.ipynb"),
        ],
        cwd=folder,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_nbval_kernels_start_with_the_lowest_kernels(tmp_path):
    settings = lowest_kernels()
    assert settings["ATEN_CPU_CAPABILITY"] == "default"
    keys = sorted({k for selection in SELECTIONS.values() for k in selection})
    cell = nbformat.v4.new_code_cell(f"KEYS = {keys!r}\n" + PROBE, execution_count=1)
    cell.outputs = [
        nbformat.v4.new_output(
            "stream",
            name="stdout",
            text="DEFAULT\n" + repr({k: settings.get(k) for k in keys}) + "\n",
        )
    ]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, tmp_path / "probe.ipynb")
    shutil.copy2(ROOT / "solutions" / "conftest.py", tmp_path / "conftest.py")
    done = _run(tmp_path, keys)
    assert done.returncode == 0, done.stdout + done.stderr
    native = _run(tmp_path, keys, NBVAL_KERNELS="native")
    assert native.returncode == 1 and "mismatch" in native.stdout, native.stdout
