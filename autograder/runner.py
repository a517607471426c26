"""The course's one notebook runner: a notebook run top to bottom in a fresh kernel.

    python -m autograder.runner NOTEBOOK OUT [--cwd DIR] [--timeout S] [--allow-errors]

:func:`run` is what every tool that runs a notebook outside grading calls: ``make execute``
(:mod:`autograder.execute`, the reference notebooks and their Run-All times), ``make spread``
(:mod:`autograder.spread`, through the command line above in a process of its own, whose
environment selects the CPU kernels), the benchmark's baselines (:mod:`autograder.bench`) and
the mutant trials (``python -m tests.grader.mutants``). It is nbclient's ``NotebookClient``
with the course's kernel ("python3", this environment's Python) on unix sockets
(:mod:`autograder.ipc`: a TCP port picked for a kernel can be taken before it binds it, and
the kernel then never answers) and the notebook's folder as the kernel's working directory.

Grading runs notebooks through nbgrader, whose autograde step builds its own executor from its
configuration (``Autograde.autograde_preprocessors``): the course's is
:class:`autograder.nbgrader_plugins.ExecuteUntilKernelDeath`, nbgrader's ``Execute`` (itself an
nbclient client) with the grader's additions. nbgrader requires a preprocessor there, so that
runner stays nbgrader's. The benchmark's "bare ``jupyter execute``" baseline runs Jupyter's
command line on purpose: it is what is measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat import NotebookNode

KERNEL = "python3"  # the kernel every course notebook names (this environment's Python)


def run(
    nb: NotebookNode,
    cwd: Path | str,
    *,
    timeout: int | None = 300,
    allow_errors: bool = False,
    record_timing: bool = False,
) -> NotebookNode:
    """Run ``nb`` in place in a fresh kernel started in ``cwd``; return it.

    ``timeout``: seconds a cell may run (None: no limit). Without ``allow_errors``, a cell that
    raises stops the run (nbclient's ``CellExecutionError``); with it, the error is the cell's
    output and later cells run. ``record_timing`` keeps nbclient's per-cell timestamps in the
    cells' metadata (off: re-running an unchanged notebook changes nothing else).
    """
    from nbclient import NotebookClient

    from autograder.ipc import IpcKernelManager

    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=KERNEL,
        kernel_manager_class=IpcKernelManager,  # unix sockets: no TCP port to lose (ipc.py)
        allow_errors=allow_errors,
        record_timing=record_timing,
        resources={"metadata": {"path": str(cwd)}},
    ).execute()
    return nb


def run_file(path: Path | str, out: Path | str | None = None, **options) -> NotebookNode:
    """Run the notebook at ``path`` in its own folder, and write it to ``out`` if given."""
    path = Path(path)
    nb = run(nbformat.read(path, as_version=4), path.parent, **options)
    if out is not None:
        nbformat.write(nb, out)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("out", type=Path, help="where the executed notebook is written")
    parser.add_argument("--cwd", type=Path, help="the kernel's folder (default: the notebook's)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds a cell may run")
    parser.add_argument("--allow-errors", action="store_true", help="run on after an error")
    args = parser.parse_args(argv)
    nb = nbformat.read(args.notebook, as_version=4)
    run(
        nb,
        args.cwd or args.notebook.parent,
        timeout=args.timeout,
        allow_errors=args.allow_errors,
    )
    nbformat.write(nb, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
