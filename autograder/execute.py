"""Run the reference notebooks in solutions/ and store their outputs (nbval's reference).

    python -m autograder.execute [SECTION ...]

Course authors run this (`make execute`) after editing a reference notebook, then
`make release`. Per-cell timing metadata is not recorded, so re-running an unchanged
notebook changes nothing but the cells marked NBVAL_IGNORE_OUTPUT.
"""

from __future__ import annotations

import sys
import time

import nbformat
from nbclient import NotebookClient
from nbconvert.preprocessors import CoalesceStreamsPreprocessor

from autograder import course


def execute(section: str) -> None:
    for path in sorted((course.SOLUTIONS / section).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        NotebookClient(
            nb,
            timeout=300,
            kernel_name="python3",
            record_timing=False,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
        # One stream output per cell, with a progress line's redraws (\r) reduced to its
        # last state: what a reader saw, not every update (nbval coalesces streams too).
        CoalesceStreamsPreprocessor().preprocess(nb, {})
        # The explorers' widgets live only beside a kernel: their models' stored state would be
        # tens of kB of stale values in every copy (and in the student notebooks).
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, path)
        print(f"executed {path.relative_to(course.ROOT)} in {time.perf_counter() - start:.1f} s")


def main(argv: list[str] | None = None) -> int:
    sections = (argv if argv is not None else sys.argv[1:]) or course.sections()
    for section in sections:
        execute(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
