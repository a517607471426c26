"""Generate the student notebooks in notebooks/ from the reference notebooks in solutions/.

    python -m autograder.release [--release-dir DIR] [SECTION ...]

nbgrader's generate_assignment removes the solution regions and hidden tests, clears the
outputs, and records every graded cell in the gradebook (which `make grade` needs).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from autograder import course

# The gradebook URL reaches generate_assignment's process in its environment, not on its
# command line (which every user of the machine can read): it may hold a password.
GRADEBOOK_ENV = "AUTOGRADER_GRADEBOOK_URL"


def generate_assignment(
    sections: list[str], *, release_dir: str | Path | None = None, db_url: str | None = None
) -> None:
    """Run nbgrader's generate_assignment for each section with the course configuration.

    It records every graded cell and its points in the gradebook, and writes the student
    notebooks to ``release_dir`` (relative to the course root, or absolute; default:
    ``notebooks/``). The one way the autograder calls it: `make release` writes
    ``notebooks/``, `make grade` a scratch folder. ``db_url`` is the gradebook (default:
    nbgrader_config.py's, the course's SQLite file). All sections go through one nbgrader
    process, which loads nbgrader once (2 s) instead of once per section. Raises
    RuntimeError with nbgrader's log.
    """
    extra = [] if release_dir is None else ["--release-dir", str(release_dir)]
    env = course.tool_env()
    if db_url is not None:
        env[GRADEBOOK_ENV] = db_url
    done = subprocess.run(
        [sys.executable, "-m", "autograder.release", "--in-this-process", *extra, *sections],
        cwd=course.ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or done.stdout.strip())


def _generate_here(sections: list[str], release_dir: Path | None) -> int:
    """The nbgrader process of :func:`generate_assignment`: every section, one API."""
    from nbgrader.apps.api import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    os.chdir(course.AUTOGRADER)  # where nbgrader looks for its configuration, as on the CLI
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course.AUTOGRADER)).load_config()
    if release_dir is not None:
        config.CourseDirectory.release_directory = str(release_dir)
    if os.environ.get(GRADEBOOK_ENV):
        config.CourseDirectory.db_url = os.environ[GRADEBOOK_ENV]
    course.stamp_in_process()
    api = NbGraderAPI(config=config)
    for section in sections:
        done = api.generate_assignment(section, force=True)
        if not done["success"]:
            print(
                f"nbgrader generate_assignment {section} failed:\n"
                f"{done.get('log', '')}{done.get('error', '')}",
                file=sys.stderr,
            )
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", help="section ids (default: all)")
    parser.add_argument("--release-dir", type=Path, help="write here instead of notebooks/")
    parser.add_argument("--in-this-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.in_this_process:  # generate_assignment's nbgrader process
        return _generate_here(args.sections, args.release_dir)
    sections = args.sections or course.sections()
    unknown = sorted(set(sections) - set(course.sections()))
    if unknown:
        parser.error(f"no such section in solutions/: {', '.join(unknown)}")
    generate_assignment(sections, release_dir=args.release_dir)
    target = args.release_dir or course.NOTEBOOKS
    for section in sections:
        print(f"released {section} -> {target / section}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
