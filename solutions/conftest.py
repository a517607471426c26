"""nbval runs the reference notebooks under other CPU kernels than this machine's own.

The stored outputs were recorded on some machine's native kernels. A student's laptop picks
others (another vector width in torch, oneDNN, MKL or OpenBLAS), so every nbval-checked
number must come out the same under other kernels too (docs/authors.md, "Numbers that hold on every
CPU"). Each notebook's kernel therefore starts with ``autograder.spread.nbval_kernels()``
in its environment (ATen's portable kernels, oneDNN and MKL a level below the CPU's own),
which differ from the native kernels on every x86 CPU: every `make test` is a cross-kernel
check. (The browser tests, e2e/, run the reference notebooks on this machine's native
kernels, and their claims must hold there too.)

The kernels listen on unix sockets, not TCP ports (autograder.ipc): no other process of a busy
`make test` can take a kernel's port before it starts.

``NBVAL_KERNELS=native`` runs the notebooks on the native kernels instead, e.g. to tell a
kernel-dependent difference from another one.
"""

from __future__ import annotations

import os

import pytest

from autograder.ipc import pytest_configure  # noqa: F401  (nbval's kernels on unix sockets)
from autograder.spread import nbval_kernels


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Start the notebook's kernel (nbval does it in the first cell's setup) with the kernels
    set; the test process itself keeps its own environment. (Only items under solutions/,
    i.e. nbval's cells, reach this hook.)"""
    if os.environ.get("NBVAL_KERNELS") == "native":
        yield
        return
    settings = nbval_kernels()
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
