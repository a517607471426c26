"""Run the reference notebooks in solutions/ and store their outputs (nbval's reference).

    python -m autograder.execute [--costs-only] [SECTION ...]

Course authors run this (`make execute`) after editing a reference notebook, then
`make release`. Per-cell timing metadata is not recorded, so re-running an unchanged
notebook changes nothing but the cells marked NBVAL_IGNORE_OUTPUT.

Each run also records two times of the section, to the second, in
``autograder/section_costs.json``: ``run_all``, a Run-All of the reference notebook (what a
student waits for), and ``graded``, a run of the cells grading runs, the show-only ones left
out (:mod:`autograder.show_only`): the expected cost of grading one submission, by which
``make grade SHARD=i/n`` balances its shares. ``--costs-only`` (`make section-costs`)
measures both without storing the outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import nbformat
from nbconvert.preprocessors import CoalesceStreamsPreprocessor

from autograder import course, runner, shards, show_only


def graded_cells(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of reference notebook ``nb`` holding only the cells grading runs: its own
    show-only tags are those of its release (plain cells are released unchanged)."""
    copy = nbformat.from_dict(nb)
    marked = {show_only.digest(c.source) for c in copy.cells if show_only.is_marked(c)}
    skipped = show_only.plan_notebook(copy, marked)
    copy.cells = [c for i, c in enumerate(copy.cells) if i not in skipped]
    return copy


def graded_seconds(section: str) -> float:
    """Seconds a run of the cells grading runs takes, over the section's reference notebooks."""
    total = 0.0
    for path in sorted((course.SOLUTIONS / section).glob("*.ipynb")):
        nb = graded_cells(nbformat.read(path, as_version=4))
        start = time.perf_counter()
        runner.run(nb, path.parent, timeout=300)
        total += time.perf_counter() - start
    return total


def execute(section: str, *, store: bool = True) -> float:
    """Run the section's reference notebooks (and store their outputs): the seconds taken."""
    total = 0.0
    for path in sorted((course.SOLUTIONS / section).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        runner.run(nb, path.parent, timeout=300)
        # One stream output per cell, with a progress line's redraws (\r) reduced to its
        # last state: what a reader saw, not every update (nbval coalesces streams too).
        CoalesceStreamsPreprocessor().preprocess(nb, {})
        # The explorers' widgets live only beside a kernel: their models' stored state would be
        # tens of kB of stale values in every copy (and in the student notebooks).
        nb.metadata.pop("widgets", None)
        took = time.perf_counter() - start
        total += took
        if store:
            nbformat.write(nb, path)
        print(f"executed {path.relative_to(course.ROOT)} in {took:.1f} s")
    return total


def record_cost(section: str, run_all: float, graded: float, path=shards.COSTS) -> None:
    """Store ``section``'s Run-All and grading seconds (whole, at least 1) beside the others."""
    costs = json.loads(path.read_text()) if path.is_file() else {}
    costs[section] = {"run_all": max(1, round(run_all)), "graded": max(1, round(graded))}
    path.write_text(json.dumps(dict(sorted(costs.items())), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", help="section ids (default: all)")
    parser.add_argument(
        "--costs-only",
        action="store_true",
        help="measure the Run-All and graded times, store no output",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.sections) - set(course.sections()))
    if unknown:
        parser.error(f"no such section in solutions/: {', '.join(unknown)}")
    for section in args.sections or course.sections():
        run_all = execute(section, store=not args.costs_only)
        graded = graded_seconds(section)
        print(f"graded cells of {section}: {graded:.1f} s (Run-All {run_all:.1f} s)")
        record_cost(section, run_all, graded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
