"""Generate the student notebooks in notebooks/ from the reference notebooks in solutions/.

    python -m autograder.release [--release-dir DIR] [SECTION ...]

nbgrader's generate_assignment removes the solution regions and hidden tests, clears the
outputs, and records every graded cell in the gradebook (which `make grade` needs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder import course


class ReleaseError(RuntimeError):
    """nbgrader could not release a section; the message is its log (which notebook, which
    cell, why)."""


def generate_assignment(
    sections: list[str], *, release_dir: str | Path | None = None, db_url: str | None = None
) -> None:
    """Run nbgrader's generate_assignment for each section with the course configuration.

    It records every graded cell and its points in the gradebook, and writes the student
    notebooks to ``release_dir`` (relative to the course root, or absolute; default:
    ``notebooks/``). The one way the autograder calls it: `make release` writes
    ``notebooks/``, `make grade` a scratch folder. ``db_url`` is the gradebook (default:
    nbgrader_config.py's, the course's SQLite file). It runs in this process, with one
    nbgrader API for all sections. Raises ReleaseError with nbgrader's log.
    """
    from nbgrader.apps.api import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course.AUTOGRADER)).load_config()
    if release_dir is not None:
        config.CourseDirectory.release_directory = str(release_dir)
    if db_url is not None:
        config.CourseDirectory.db_url = db_url
    course.stamp_in_process()
    api = NbGraderAPI(config=config)
    for section in sections:
        done = api.generate_assignment(section, force=True)
        if not done["success"]:
            raise ReleaseError(
                f"nbgrader generate_assignment {section} failed:\n"
                f"{done.get('log', '')}{done.get('error', '')}".strip()
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", help="section ids (default: all)")
    parser.add_argument("--release-dir", type=Path, help="write here instead of notebooks/")
    args = parser.parse_args(argv)
    sections = args.sections or course.sections()
    unknown = sorted(set(sections) - set(course.sections()))
    if unknown:
        parser.error(f"no such section in solutions/: {', '.join(unknown)}")
    try:
        generate_assignment(sections, release_dir=args.release_dir)
    except ReleaseError as exc:  # nbgrader's log says which cell of which notebook
        print(exc, file=sys.stderr)
        return 1
    target = args.release_dir or course.NOTEBOOKS
    for section in sections:
        print(f"released {section} -> {target / section}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
