"""Nothing drops out of the checks unseen: every test file yields tests, every .py file is
linted and format-checked, and the docs' hand-kept module lists name every module once.

pytest and ruff skip folders named dist, build or venv by default: a test folder tests/dist/
went uncollected for months that way. pyproject.toml now lists what each tool skips, and these
tests compare what the tools see with git's list of the repository's files (tracked, or new
and not ignored), so that a file they skip fails here instead of passing unchecked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path, PurePosixPath

import pytest

from tests.helpers import ROOT
from tests.repo.record_collection import OUTPUT_VARIABLE

RUFF = Path(sys.executable).parent / "ruff"
PACKAGE = "shared/distopt/"
LAYOUT_DOC = "docs/authors.md"  # its "## Layout" names every module of the package


def _repo_files() -> list[str]:
    """The repository's files as git sees them, relative to the root: tracked, or new and not
    ignored (what a commit would hold), that exist in the working tree. Skips the test where
    git cannot tell (no git, or a copy of the course without .git)."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed: this check compares with git's list of files")
    done = subprocess.run(
        [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"not a git checkout, so no list of files to compare with: {done.stderr}")
    return sorted({name for name in done.stdout.split("\0") if name and (ROOT / name).is_file()})


def _python_files() -> list[str]:
    """Every .py file of the repository (see _repo_files)."""
    return [name for name in _repo_files() if name.endswith(".py")]


def _listed(names: list[str], limit: int = 20) -> str:
    """``names`` one per line, the first ``limit`` of them, for an assertion message."""
    more = f"\n  ... and {len(names) - limit} more" if len(names) > limit else ""
    return "".join(f"\n  {name}" for name in names[:limit]) + more


# --- every test file is collected ---------------------------------------------------------


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What a whole-suite collection finds: `pytest --collect-only` over tests/ and the
    reference notebooks (nbval), in a subprocess, with tests/repo/record_collection.py writing
    down each item's file and slow mark and the conftest files loaded. Collecting runs no test,
    so this module is collected there but not run again."""
    record = tmp_path_factory.mktemp("collection") / "collection.json"
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_ADDOPTS"}
    env[OUTPUT_VARIABLE] = str(record)
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "tests.repo.record_collection", "tests", "solutions", "--nbval"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = (done.stdout + done.stderr)[-6000:]
    assert record.is_file(), f"the collection recorded nothing (exit {done.returncode}):\n{output}"
    return json.loads(record.read_text())


def test_the_whole_suite_collects_without_errors(collection: dict) -> None:
    errors = collection["errors"]
    assert not errors, (
        "collecting these failed (pytest --collect-only tests solutions --nbval):\n"
        + ("\n".join(f"{error['path']}:\n{error['why']}" for error in errors))
    )


def test_every_test_file_yields_collected_tests(collection: dict) -> None:
    collected = {item["file"] for item in collection["items"]}
    test_files = [
        name
        for name in _repo_files()
        if (name.startswith("tests/") and PurePosixPath(name).match("test_*.py"))
        or (name.startswith("solutions/") and name.endswith(".ipynb"))
    ]
    assert test_files, "git lists no test file: is this the course repository?"
    uncollected = [name for name in test_files if name not in collected]
    assert not uncollected, (
        f"these test files yield no test in a whole-suite collection:{_listed(uncollected)}\n"
        "is a folder above them skipped (norecursedirs in pyproject.toml), did collecting "
        "them fail, or do they hold no test_ function or Test class?"
    )


def _root_conftest():
    """The repository root's conftest.py, loaded as a module of its own."""
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_conftest_is_loaded(collection: dict) -> None:
    conftests = [name for name in _repo_files() if PurePosixPath(name).name == "conftest.py"]
    expected = [name for name in conftests if name.split("/")[0] in ("tests", "solutions")]
    expected += ["conftest.py"]
    unloaded = sorted(set(expected) - set(collection["conftests"]))
    assert not unloaded, (
        f"pytest did not load these conftest files:{_listed(unloaded)}\n"
        "their fixtures, hooks and marks do not apply: is their folder skipped (norecursedirs "
        "in pyproject.toml), or is the rootdir no longer the repository's root?"
    )


def test_every_slow_entry_of_the_conftest_names_collected_tests(collection: dict) -> None:
    conftest = _root_conftest()
    files = {item["file"] for item in collection["items"]}
    entries = [*conftest.SLOW, *sorted(conftest.CLASS_RUN)]
    stale = [entry for entry in entries if not any(name.startswith(entry) for name in files)]
    assert not stale, (
        f"conftest.py's SLOW or CLASS_RUN names paths with no collected test:{_listed(stale)}\n"
        "was a file or folder renamed? Write its new path there, or the tests it meant run "
        "unmarked (in `make test-fast`, and in the wrong order under `make test`)."
    )


def test_the_conftest_marks_exactly_the_slow_paths(collection: dict) -> None:
    slow = _root_conftest().SLOW
    wrong = sorted(
        {
            f"{item['file']} ({'marked slow' if item['slow'] else 'not marked slow'})"
            for item in collection["items"]
            if item["slow"] != any(item["file"].startswith(prefix) for prefix in slow)
        }
    )
    assert not wrong, (
        f"these files' tests are marked against conftest.py's SLOW list:{_listed(wrong)}\n"
        "does the root conftest.py still mark the items (pytest_collection_modifyitems)?"
    )


# --- ruff sees every .py file ----------------------------------------------------------------


def _ruff(*args: str) -> subprocess.CompletedProcess:
    """`ruff ARGS` at the repository's root, without writing ruff's cache."""
    return subprocess.run(
        [str(RUFF), *args, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_walks_into_every_folder_that_holds_python() -> None:
    done = _ruff("check", "--show-files", ".")
    assert done.returncode == 0, done.stdout + done.stderr
    shown = {Path(line).relative_to(ROOT).as_posix() for line in done.stdout.splitlines() if line}
    skipped = [name for name in _python_files() if name not in shown]
    assert not skipped, (
        f"`ruff check .` and `ruff format --check .` (make lint) skip these files:"
        f"{_listed(skipped)}\nnarrow the pattern of [tool.ruff] exclude in pyproject.toml "
        "that matches them, or rename their folder (dist, build and venv are names tools skip)"
    )


def test_ruff_lints_every_python_file() -> None:
    """Every .py file, named on the command line, is linted: none is left out by an exclude
    of the linter's own ([tool.ruff.lint] exclude), which `--show-files` does not apply."""
    files = _python_files()
    done = _ruff("check", "--force-exclude", "--exit-zero", "--verbose", *files)
    checked = re.search(r"Checked (\d+) files?", done.stderr)
    assert checked, f"ruff's verbose log no longer says how many files it checked:\n{done.stderr}"
    assert int(checked.group(1)) == len(files), (
        f"ruff linted {checked.group(1)} of the {len(files)} .py files: an exclude in "
        "pyproject.toml ([tool.ruff] or [tool.ruff.lint]) hides the others from `make lint`"
    )


def test_ruff_format_checks_every_python_file() -> None:
    files = _python_files()
    done = _ruff("format", "--check", "--force-exclude", *files)
    counts = re.findall(r"(\d+) files? (?:would be reformatted|already formatted)", done.stdout)
    formatted = sum(int(count) for count in counts)
    assert formatted == len(files), (
        f"ruff format checked {formatted} of the {len(files)} .py files: an exclude in "
        "pyproject.toml ([tool.ruff] or [tool.ruff.format]) hides the others from `make lint`\n"
        + done.stdout
        + done.stderr
    )


# --- the hand-kept module lists (docs/authors.md, autograder/README.md) -----------------------


def _layout_modules(readme: str) -> list[str]:
    """The package modules that the fenced block under docs/authors.md's "## Layout" names, as
    paths under shared/distopt/ (``costs/comm.py``), in order, repeats kept.

    In that block an entry's name starts its line, two columns deeper than its folder's
    (``  costs/``, then ``    comm.py   ...``); a line indented further carries on the
    description of the entry above it."""
    after = readme.split("\n## Layout\n", 1)
    assert len(after) == 2, f"{LAYOUT_DOC} has no '## Layout' section"
    fenced = after[1].split("```")
    assert len(fenced) >= 3, f"{LAYOUT_DOC}'s '## Layout' section has no fenced block"
    lines = fenced[1].splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith(PACKAGE)), None)
    assert start is not None, f"{LAYOUT_DOC}'s layout block has no line for {PACKAGE}"
    folders = [(0, "")]  # the open folders: (indent of their line, path under the package)
    modules = []
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            break  # the next top-level entry: the package's part of the block ends
        while indent <= folders[-1][0]:
            folders.pop()
        folder_indent, folder = folders[-1]
        if indent != folder_indent + 2:
            continue
        name = line.split()[0]
        if name.endswith("/"):
            folders.append((indent, folder + name))
        else:
            modules.append(folder + name)
    return modules


def _compare_names(named: list[str], expected: list[str], where: str, how: str) -> None:
    """Fail unless ``named`` holds each of ``expected`` exactly once, and nothing else."""
    counts = Counter(named)
    missing = [name for name in expected if name not in counts]
    repeated = sorted(name for name, count in counts.items() if count > 1)
    unknown = sorted(name for name in counts if name not in expected)
    problems = [
        f"missing (add a line for each: {how}):{_listed(missing)}" * bool(missing),
        f"named more than once:{_listed(repeated)}" * bool(repeated),
        f"named but not in the repository (renamed, moved or removed?):{_listed(unknown)}"
        * bool(unknown),
    ]
    problems = [problem for problem in problems if problem]
    assert not problems, f"{where} should name each module once:\n" + "\n".join(problems)


def test_the_authors_guide_layout_names_every_package_module_once() -> None:
    modules = [
        name.removeprefix(PACKAGE)
        for name in _python_files()
        if name.startswith(PACKAGE) and PurePosixPath(name).name != "__init__.py"
    ]
    named = _layout_modules((ROOT / LAYOUT_DOC).read_text(encoding="utf-8"))
    _compare_names(
        named,
        modules,
        f"{LAYOUT_DOC}'s layout block (under {PACKAGE}, each module under its folder)",
        "its name two columns right of its folder's, then what it is for",
    )


def _autograder_readme_files(readme: str) -> list[str]:
    """The names in the first column of autograder/README.md's "## Files" table, in order."""
    after = readme.split("\n## Files\n", 1)
    assert len(after) == 2, "autograder/README.md has no '## Files' section"
    section = after[1].split("\n## ", 1)[0]
    return [
        line.split("|")[1].strip().strip("`")
        for line in section.splitlines()
        if line.startswith("| `")
    ]


def test_the_autograder_readme_names_every_autograder_module_once() -> None:
    """Its table names each module of autograder/ and each of its folders (``cluster/``)."""
    files = _repo_files()
    inside = [name.removeprefix("autograder/") for name in files if name.startswith("autograder/")]
    modules = [name for name in inside if "/" not in name and name.endswith(".py")]
    modules = [name for name in modules if name != "__init__.py"]
    folders = sorted({name.split("/")[0] + "/" for name in inside if "/" in name})
    named = _autograder_readme_files((ROOT / "autograder" / "README.md").read_text("utf-8"))
    other_files = [name for name in named if (ROOT / "autograder" / name).is_file()]
    _compare_names(
        named,
        [*modules, *folders, *[name for name in other_files if name not in modules]],
        "autograder/README.md's table of files (## Files)",
        "| `name.py` | what it is for |",
    )
