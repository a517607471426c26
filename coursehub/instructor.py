"""The instructor's side of nbgrader's exchange, from the course checkout (as root or the
account that owns it):

    python -m coursehub.instructor release SECTION...    notebooks/SECTION to the exchange
    python -m coursehub.instructor collect SECTION       submissions to autograder/submitted/
    python -m coursehub.instructor feedback SECTION      autograder/feedback/ back to students

nbgrader runs with the course's own configuration (autograder/nbgrader_config.py: notebooks/
is the release folder, autograder/submitted/ where collect writes, autograder/feedback/ where
`make grade` writes feedback pages) and the hub's exchange root.

collect takes the submission that counts (coursehub/counted.py: the newest on time, else the
newest late one), not nbgrader's newest: the same one the grading service graded, with its
timestamp.txt, which `make grade` reads as the time it was handed in.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from coursehub import settings

ACTIONS = {"release": "release_assignment", "collect": "collect", "feedback": "release_feedback"}
COLLECTOR = "--ExchangeFactory.collect=coursehub.counted.CountedCollect"


def nbgrader(action: str, section: str, *extra: str) -> subprocess.CompletedProcess:
    """Run one nbgrader exchange command for the course; raise with its log if it fails."""
    cmd = [
        str(settings.PYTHON.parent / "nbgrader"),
        ACTIONS[action],
        section,
        f"--course={settings.COURSE_ID}",
        f"--Exchange.root={settings.EXCHANGE}",
        *extra,
    ]
    env = dict(
        os.environ,
        # the course's autograder (class.toml) and coursehub.counted for nbgrader's plugins
        PYTHONPATH=os.pathsep.join([str(settings.ROOT), str(settings.HERE.parent)]),
        COURSEHUB_LEDGER=str(settings.LEDGER),
        # nbgrader runs alembic (its gradebook) from PATH: the course's .venv first
        PATH=os.pathsep.join([str(settings.PYTHON.parent), os.environ.get("PATH", "")]),
    )
    done = subprocess.run(
        cmd, cwd=settings.ROOT / "autograder", capture_output=True, text=True, timeout=600,
        env=env,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def stamp_feedback(section: str) -> None:
    """nbgrader's release_feedback reads the submission's timestamp.txt and secret beside the
    feedback pages (its own feedback step copies both; the course's grader writes pages only)."""
    course = settings.ROOT / "autograder"
    for name in ("timestamp.txt", "submission_secret.txt"):
        for stamp in (course / "submitted").glob(f"*/{section}/{name}"):
            pages = course / "feedback" / stamp.parent.parent.name / section
            if pages.is_dir():
                shutil.copy2(stamp, pages / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=sorted(ACTIONS))
    parser.add_argument("sections", nargs="+")
    args = parser.parse_args(argv)
    for section in args.sections:
        extra = {"release": ["--force"], "collect": ["--update", COLLECTOR], "feedback": []}[
            args.action
        ]
        if args.action == "feedback":
            stamp_feedback(section)
        try:
            done = nbgrader(args.action, section, *extra)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(done.stderr.strip() or done.stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
