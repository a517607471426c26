"""Grade a demo class in a scratch copy of the course, and print the grades and the time.

    python -m autograder.demo [--jobs N]        (or: make grade-demo)

For every section, six students: a complete answer, the blank notebook, half the exercises
done, a kernel that dies halfway, a missing notebook and a file that is not JSON. Your own
autograder/ folder is not touched. This is also the autograder's timing benchmark.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder import course, fixtures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="submissions graded at once")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grade-demo-") as tmp:
        scratch = fixtures.copy_course(Path(tmp))
        count = 0
        for section in course.sections():
            for notebook in course.section_notebooks(section):
                for student, write in fixtures.demo_class(section, notebook).items():
                    folder = scratch / "autograder" / "submitted" / student / section
                    folder.mkdir(parents=True, exist_ok=True)
                    write(folder / f"{notebook}.ipynb")
                    count += 1
        env = course.tool_env()
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "autograder.grade", "--jobs", str(args.jobs)],
            cwd=scratch,
            env=env,
        )
        elapsed = time.perf_counter() - start
        print(
            f"\ngrade-demo: {count} submissions, {args.jobs} at a time, "
            f"{elapsed:.1f} s wall on {os.cpu_count()} cores (exit status {done.returncode})"
        )
        print((scratch / "autograder" / "grades.csv").read_text())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
