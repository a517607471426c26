"""nbval's kernels run on other CPU kernels than the test process, and listen on unix sockets
(solutions/conftest.py).

A one-cell notebook that prints what its kernel sees (its CPU kernels and its transport),
stored with nbval's kernels' settings and "ipc" as its output, runs under the same conftest:
it must pass, and with NBVAL_KERNELS=native (the machine's own kernels) it must fail.
"""

import os
import shutil
import subprocess
import sys

import nbformat

from autograder.spread import SELECTIONS, nbval_kernels
from tests.helpers import ROOT

PROBE = (
    "import json\n"
    "import os\n"
    "import torch\n"
    "from ipykernel.connect import get_connection_info\n"
    "print(json.loads(get_connection_info())['transport'])\n"
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


def test_nbval_kernels_start_with_other_kernels_than_the_native_ones_on_unix_sockets(tmp_path):
    settings = nbval_kernels()
    assert settings["ATEN_CPU_CAPABILITY"] == "default"
    keys = sorted({k for selection in SELECTIONS.values() for k in selection})
    cell = nbformat.v4.new_code_cell(f"KEYS = {keys!r}\n" + PROBE, execution_count=1)
    cell.outputs = [
        nbformat.v4.new_output(
            "stream",
            name="stdout",
            text="ipc\nDEFAULT\n" + repr({k: settings.get(k) for k in keys}) + "\n",
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


def test_oneDNN_and_MKL_run_a_level_below_the_cpus_own(tmp_path, monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16\n")
    assert nbval_kernels(cpuinfo) == {
        "ATEN_CPU_CAPABILITY": "default",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "OPENBLAS_CORETYPE": "Prescott",
    }
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx2 fma\n")  # AVX2 is native
    assert nbval_kernels(cpuinfo)["DNNL_MAX_CPU_ISA"] == "SSE41"
    assert nbval_kernels(cpuinfo)["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"
    assert nbval_kernels(tmp_path / "absent") == nbval_kernels(cpuinfo)
    monkeypatch.setattr("platform.machine", lambda: "arm64")
    assert nbval_kernels(cpuinfo) == {"ATEN_CPU_CAPABILITY": "default"}
