"""Try a notebook's mutants without the grader, for course authors writing them.

    python -m tests.grader.mutants SECTION [--answer ID] [--rounds]

Each variant (or, with --rounds, each round of the class run) is typed into the reference
notebook, hidden tests included, which runs as a tests-only notebook in a fresh kernel; the
failing tests are compared with those the variant names. Exit status 1 if any differ.
"""

from __future__ import annotations

import argparse
import sys
import time

import nbformat

from autograder import course, runner
from tests.grader import mutants


def failing_tests(section: str, notebook: str, chosen: list[mutants.Variant]) -> set[str]:
    """Run the reference notebook with ``chosen`` in place, tests only; the tests that raised."""
    return set(test_errors(section, notebook, chosen))


def test_errors(
    section: str, notebook: str, chosen: list[mutants.Variant]
) -> dict[str, tuple[str, str]]:
    """Run the reference notebook with ``chosen`` in place, tests only: each test that raised,
    with its first error's name and message (what autograder.likely_bugs learns from)."""
    nb = nbformat.read(course.SOLUTIONS / section / f"{notebook}.ipynb", as_version=4)
    reference = mutants.reference_answers(section, notebook)
    by_answer = {v.answer: v.apply(reference[v.answer]) for v in chosen}
    for cell in nb.cells:
        grade_id = mutants._grade_id(cell)
        if mutants._is_answer(cell):
            cell.source = by_answer.get(grade_id, reference[grade_id])
    nb = mutants.tests_only(nb)
    runner.run(nb, course.SOLUTIONS / section, timeout=300, allow_errors=True)
    found = {}
    for cell in nb.cells:
        errors = (
            [o for o in cell.outputs if o.output_type == "error"] if course.is_test(cell) else []
        )
        if errors:
            found[mutants._grade_id(cell)] = (errors[0].ename, errors[0].evalue)
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.grader.mutants")
    parser.add_argument("section")
    parser.add_argument("--answer", help="only this answer's variants")
    parser.add_argument("--rounds", action="store_true", help="the class run's rounds")
    args = parser.parse_args(argv)
    notebook = course.section_notebooks(args.section)[0]
    if args.rounds:
        trials = mutants.rounds(args.section, notebook)
    else:
        trials = [[v] for v in mutants.variants(notebook) if args.answer in (None, v.answer)]
    bad = 0
    start = time.perf_counter()
    reference = failing_tests(args.section, notebook, [])
    print(f"reference: {'every test passes' if not reference else f'FAILS {sorted(reference)}'}")
    bad += bool(reference)
    for chosen in trials:
        t0 = time.perf_counter()
        expected = set().union(
            *(mutants.expected_failures(args.section, notebook, v) for v in chosen)
        )
        got = failing_tests(args.section, notebook, chosen)
        names = "; ".join(f"{v.answer}: {v.name}" for v in chosen)
        verdict = "ok" if got == expected else "DIFFERS"
        bad += got != expected
        print(f"{verdict:7s} {time.perf_counter() - t0:5.1f} s  {names}")
        if got != expected:
            print(f"        expected to fail {sorted(expected)}\n        failed {sorted(got)}")
    print(f"{len(trials)} trials, {bad} differ, {time.perf_counter() - start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
