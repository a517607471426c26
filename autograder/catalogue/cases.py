"""The catalogue of broken and hostile submissions, with the outcome each must get.

Every case writes one student's folder for the catalogue assignment (``99_catalogue``: three
exercises worth 2, 2 and 1 points, see ``catalogue.ipynb``). tests/grader/test_hostile.py grades
them all in one class run, next to an honest student, and checks each row of grades.csv: score,
status and reason. (Tampering on the real sections is graded in tests/grader/test_sections.py.)

The expected outcomes follow from what the student's code does, e.g. a kernel killed in the
second answer cell keeps the 2 points of the first test; a test run after ``np.allclose``
was patched scores 0 and the status says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from autograder import fixtures, outcomes

SECTION = "99_catalogue"
NOTEBOOK = "catalogue"
MAX_SCORE = 5
FOLDER = Path(__file__).resolve().parent / SECTION  # the reference notebook


@dataclass
class Context:
    """What the cases need to write submissions: the scratch course and a host port."""

    root: Path  # the scratch course: solutions/ and notebooks/ hold 99_catalogue
    host_port: int  # a TCP port listening on the host's 127.0.0.1 (must stay unreachable)

    def answered(self) -> nbformat.NotebookNode:
        return fixtures.answered_notebook(SECTION, NOTEBOOK, root=self.root)

    def released(self) -> nbformat.NotebookNode:
        return nbformat.read(self.root / "notebooks" / SECTION / f"{NOTEBOOK}.ipynb", 4)


@dataclass
class Case:
    """One kind of submission and what grading it must give."""

    write: Callable[[Path, Context], None]  # writes the student's section folder
    score: float
    status: str | tuple[str, ...]  # the status must start with this (or one of these)
    reason: list[str] = field(default_factory=list)  # each must occur in status or reason
    sandbox: bool = False  # only safe, or only meaningful, with the sandbox on
    cgroups: bool = False  # only with a control group per submission (autograder.bounds)
    section: str = SECTION


def _cell(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _index(nb: nbformat.NotebookNode, grade_id: str) -> int:
    return nb.cells.index(_cell(nb, grade_id))


def _save(nb: nbformat.NotebookNode, folder: Path, name: str = NOTEBOOK) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{name}.ipynb")


def _answered(edit: Callable[[nbformat.NotebookNode], None] | None = None, *, blank=False):
    """A writer: the answered (or released) notebook, changed by ``edit``."""

    def write(folder: Path, ctx: Context) -> None:
        nb = ctx.released() if blank else ctx.answered()
        if edit is not None:
            edit(nb)
        _save(nb, folder)

    return write


def _prepend(grade_id: str, code: str):
    return lambda nb: _cell(nb, grade_id).update(source=code + "\n" + _cell(nb, grade_id).source)


def _append(grade_id: str, code: str):
    return lambda nb: _cell(nb, grade_id).update(source=_cell(nb, grade_id).source + "\n" + code)


def _replace(grade_id: str, code: str):
    return lambda nb: _cell(nb, grade_id).update(source=code)


def _both(*edits):
    def edit(nb):
        for e in edits:
            e(nb)

    return edit


WRONG_MEAN_SQUARE = "def mean_square(xs):\n    return 0.0\n"
WRONG_NORMALIZE = "def normalize(v):\n    return v\n"
NUMPY_DOT = "def dot(a, b):\n    return float(np.dot(a, b))\n"


def _delete_tests(nb):
    nb.cells = [c for c in nb.cells if not c.metadata.get("nbgrader", {}).get("grade")]


def _edit_tests(nb):
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade"):
            c.source = "pass  # all good"


def _move_test_first(nb):
    test = _cell(nb, "test_mean_square")
    nb.cells.remove(test)
    nb.cells.insert(_index(nb, "mean_square"), test)


REACHES_A_SHOWN_NAME = """\
def mean_square(xs):
    # the show-only cell's EXAMPLES, reached by a route that names do not show
    examples = mean_square.__globals__["EXAMPLES"]
    return sum(x * x for x in xs) / len(xs) if examples else 0.0
"""


def _reach_a_shown_name(nb):
    """An answer that needs what the show-only cell binds, by a route reading names cannot
    see, and its test moved below that cell: left out, the test would fail with KeyError."""
    _cell(nb, "mean_square").source = REACHES_A_SHOWN_NAME
    test = _cell(nb, "test_mean_square")
    nb.cells.remove(test)
    nb.cells.append(test)


def _duplicate_test(nb):
    test = _cell(nb, "test_mean_square")
    copy = nbformat.from_dict(json.loads(json.dumps(test)))
    copy["id"] = "duplicate-test"
    copy.source = "pass  # my copy"
    nb.cells.insert(_index(nb, "test_mean_square") + 1, copy)


def _change_points(nb):
    _cell(nb, "test_dot").metadata["nbgrader"]["points"] = 100


def _strip_metadata(nb):
    for c in nb.cells:
        c.metadata.pop("nbgrader", None)


def _foreign_test(nb):
    cell = new_code_cell(
        "assert min_gpus_to_fit(13e9, 1, 80 * GB) == 6",
        metadata={
            "nbgrader": {
                "grade": True,
                "grade_id": "test_min_gpus_to_fit",
                "locked": True,
                "points": 2,
                "schema_version": 3,
                "solution": False,
                "task": False,
            }
        },
    )
    nb.cells.insert(_index(nb, "dot"), cell)


def _forge_records(nb):
    """Outcome records only the execute step may write, forged into the student's cells."""
    forged = {
        1: outcomes.Tampered(cell=2, when="before", changes=("forged",)),
        _index(nb, "mean_square"): outcomes.KernelDied(cell=4, cause="forged"),
    }
    for index, record in forged.items():
        nb.cells[index].metadata[outcomes.METADATA_KEY] = {"outcomes": [record.to_json()]}


# Code the hostile students run: what they could reach is written to loot.json in their own
# folder, where the test reads it after grading.
LOOT = """
import glob, json, os, socket, sqlite3
loot = {"read": [], "written": [], "network": []}
here = os.getcwd()
candidates = [os.path.join(here, "../../../solutions"), os.path.join(here, "../../gradebook.db"),
              os.path.join(here, "../../submitted"), os.path.join(here, "../../.work"),
              os.path.join(here, "../../autograded"), os.path.join(here, "..")]
import distopt
repo = os.path.dirname(os.path.dirname(os.path.dirname(distopt.__file__)))
candidates += [os.path.join(repo, "solutions"), os.path.join(repo, "autograder")]
for root in candidates:
    for path in glob.glob(os.path.join(root, "**"), recursive=True):
        if os.path.isfile(path) and not path.startswith(here + "/"):
            try:
                data = open(path, "rb").read()
                loot["read"].append(path)
            except OSError:
                pass
for path in glob.glob(os.path.join(here, "*.ipynb")):
    if "one negative " + "number" in open(path).read():  # split: this cell must not match
        loot["read"].append(path + " (hidden tests)")
"""

WRITE_OUTSIDE = """
for target in [os.path.join(here, "../../grades.csv"), os.path.join(here, "../../../pwned.txt"),
               os.path.join(here, "../other-student.txt"), os.path.join(repo, "pwned.txt"),
               "/etc/pwned.txt", "/root/pwned.txt"]:
    try:
        with open(target, "a") as f:
            f.write("pwned")
        loot["written"].append(target)
    except OSError:
        pass
"""

NETWORK = """
for address in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 53)]:
    try:
        socket.create_connection(address, timeout=3).close()
        loot["network"].append(address[0])
    except OSError:
        pass
try:
    server = socket.create_server(("127.0.0.1", 0))
    socket.create_connection(server.getsockname(), timeout=3).close()
    loot["loopback"] = True
except OSError as exc:
    loot["loopback"] = str(exc)
"""

# Every readable file of the machine, searched for hidden tests (as a first cell once found 34
# files holding them in another clone of the course): the marker outside an installed package
# (nbgrader's own code and examples carry it), or a hidden line of the catalogue. The kernel
# sees an allow list (autograder/sandbox.py), so nothing may be found; test_hostile.py puts a
# second clone of the repository outside the course root first, and shows that this very walk
# finds it there when run outside the sandbox. ``{walk_root}`` is "/" in the submission.
WALK_THE_MACHINE = """
import time
MARKER = b"### BEGIN " + b"HIDDEN TESTS"  # split: this cell's own text must not match
HIDDEN_LINE = b"one negative " + b"number"
SUFFIXES = (".ipynb", ".py", ".md", ".json", ".txt", ".cfg", ".csv", ".html")
started, walked, searched = time.monotonic(), 0, 0
for top, dirs, files in os.walk({walk_root!r}, onerror=lambda error: None):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in files:
        walked += 1
        path = os.path.join(top, name)
        package = "/site-packages/" in path or "/lib/python3" in path
        if not name.endswith(SUFFIXES) or (package and not name.endswith(".ipynb")):
            continue
        try:
            if os.path.getsize(path) > 8_000_000:
                continue
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        searched += 1
        if (MARKER in data and not package) or HIDDEN_LINE in data:
            loot["read"].append(path)
loot["walked"], loot["searched"] = walked, searched
loot["walk_s"] = round(time.monotonic() - started, 1)
"""


# A kernel forked warm by the grader's zygote (autograder/zygote.py) holds the zygote's frozen
# heap and what the graded section imports: installed with ``imports_torch`` (test_hostile.py),
# torch, and the launcher's fork server started at birth; nothing else of the zygote: no grader
# module, the kernel's own uid and environment, no way to the zygote's socket.
WARM_KERNEL = """
import gc, sys
from multiprocessing import forkserver
loot["warm"] = gc.get_freeze_count() > 0
loot["torch"] = "torch" in sys.modules
loot["fork_server"] = forkserver._forkserver._forkserver_pid is not None
loot["grader_modules"] = [m for m in sys.modules if m.split(".")[0] in ("autograder", "zygote")]
loot["uid"] = os.getuid()
loot["env"] = {k: os.environ.get(k) for k in ("HOME", "MPLCONFIGDIR", "JPY_PARENT_PID")}
try:
    loot["runtime_listed"] = os.listdir("/run/autograder-kernels")
except OSError:
    loot["runtime_listed"] = None
"""

# Every kernel draws its own numbers: the zygote's random state is not shared.
SAVE_LOOT = """
loot["draw"] = float(np.random.random())
json.dump(loot, open("loot.json", "w"))
"""


def _loot(extra: str = ""):
    def write(folder: Path, ctx: Context) -> None:
        nb = ctx.answered()
        extra_code = extra.replace("{port}", str(ctx.host_port))
        extra_code = extra_code.replace("{walk_root!r}", repr("/"))
        code = LOOT + extra_code + SAVE_LOOT
        nb.cells.insert(_index(nb, "mean_square"), new_code_cell(code))
        _save(nb, folder)

    return write


def _renamed(folder: Path, ctx: Context) -> None:
    _save(ctx.answered(), folder, "my_catalogue_final")


def _missing(folder: Path, ctx: Context) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("I forgot the notebook")


def _not_json(folder: Path, ctx: Context) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{NOTEBOOK}.ipynb").write_text('{"cells": [ this is not JSON')


def _empty_file(folder: Path, ctx: Context) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{NOTEBOOK}.ipynb").write_bytes(b"")


def _no_cells(folder: Path, ctx: Context) -> None:
    _save(new_notebook(metadata=ctx.released().metadata), folder)


def _extra_files(folder: Path, ctx: Context) -> None:
    nb = ctx.answered()
    _replace("normalize", WRONG_NORMALIZE)(nb)
    _save(nb, folder)
    (folder / "numpy.py").write_text("def allclose(*args, **kwargs):\n    return True\n")
    (folder / "data").mkdir()
    (folder / "data" / "big.bin").write_bytes(b"\0" * 1024)


HUNG_RANK = (
    "from distopt import launch\n"
    "from distopt.engine.examples import hang_on_rank\n"
    "launch(hang_on_rank, 2, 1, timeout=600)  # rank 1 never joins the all-reduce"
)

# Rank code written in a cell, as sections 01 and 02 ask: one rank skips the collective.
SKIPPING_RANK = (
    "import torch\n"
    "import torch.distributed as dist\n"
    "from distopt import launch\n"
    "def my_rank_code(rank, world_size):\n"
    "    if rank == 1:\n"
    "        dist.all_reduce(torch.ones(1))  # rank 0 never joins\n"
    "    return rank\n"
    "launch(my_rank_code, 2, timeout=5)"
)
# Rank code in a cell whose ranks each reserve 8 GiB, past the sandbox's memory limit.
GREEDY_RANKS = (
    "import torch\n"
    "from distopt import launch\n"
    "def my_rank_code(rank, world_size):\n"
    "    return torch.empty(2**31).sum().item()  # 8 GiB of float32 per rank\n"
    "launch(my_rank_code, 2, timeout=60)"
)

# Hundreds of processes forked from the kernel, each printing: their output reaches the
# kernel's channels from many writers at once (a storm like this once broke nbclient's reading
# of the kernel's messages, and a fully correct submission got 0).
PROCESS_STORM = """\
import os, sys
children = []
for i in range(150):
    pid = os.fork()
    if pid == 0:
        print(f"child {i} says hello " * 20)
        sys.stdout.flush()
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print(f"{len(children)} children done")
"""

# A child of the kernel looks up its own control groups: it must be inside the submission's
# memory and tasks bound (autograder.bounds), or the kernel exits and the grade shows it.
# (The kernel itself, not only a bound on memory being hit, which is slow and depends on the
# machine's kernel: a limit the whole tree shares is what makes four ranks safe.)
TREE_IN_ONE_BOUND = """\
import os, subprocess, sys
from pathlib import Path
groups = subprocess.run([sys.executable, "-c", "print(open('/proc/self/cgroup').read())"],
                        capture_output=True, text=True).stdout
limits = {}
for line in filter(None, groups.splitlines()):  # "4:memory:/path" (v1), "0::/path" (v2)
    _, controllers, path = line.split(":", 2)
    folder = Path("/sys/fs/cgroup", *controllers.split(",")[:1], path.lstrip("/"))
    for knob in ("memory.limit_in_bytes", "memory.max", "pids.max"):
        if "autograder-kernels/k" in path and (folder / knob).is_file():
            limits[knob] = (folder / knob).read_text().strip()
memory = limits.get("memory.limit_in_bytes", limits.get("memory.max"))
if memory != str(8 * 2**30) or limits.get("pids.max") != "512":
    os._exit(3)  # not bounded as a whole
"""

# A last cell that prints everything of the hidden tests a kernel still holds after running
# them: the input history, linecache, the notebook's functions' constants and globals, each
# plainly, base64-encoded, zlib-compressed and reversed. The feedback page must hold none of
# it (test_hostile.py decodes the page to check).
ENCODED_HISTORY = """\
import base64, gc, linecache, types, zlib
found = [str(source) for source in In]
found += ["".join(entry[2]) for name, entry in list(linecache.cache.items())
          if len(entry) > 2 and (name.startswith("<") or "ipykernel" in name)]
for obj in gc.get_objects():
    if isinstance(obj, types.FunctionType) and obj.__module__ == "__main__":
        found += [repr(obj.__code__.co_consts), repr(sorted(obj.__globals__))]
text = "\\n".join(found)
print("plain:", text)
print("base64:", base64.b64encode(text.encode()).decode())
print("zlib:", base64.b64encode(zlib.compress(text.encode())).decode())
print("reversed:", text[::-1])
"""

# After the first hidden tests ran, a cell puts what the kernel holds of them (In, linecache)
# into text the grader may quote: each hidden line, base64-encoded, as the __name__ of a fake
# module, as a notebook name bound to a fake module, as a key of sys.modules under distopt, and
# as the name of the error class that dot() (in test_dot's visible line) and a last cell raise.
# The tampering report and the error's name once quoted such text, and the sealed feedback page
# kept them: none may reach grades.csv, report.md or the page (test_hostile.py decodes them).
BASE64_MODULES = """\
import base64, linecache, sys, types
held = [str(source) for source in In]
held += ["".join(entry[2]) for entry in list(linecache.cache.values()) if len(entry) > 2]
lines = sorted({line.strip() for text in held for line in text.splitlines()
                if "negative" in line or "numbers" in line})
names = [base64.b64encode(line.encode()).decode() for line in lines]
for i, name in enumerate(names):
    globals()["fake%d" % i] = types.ModuleType(name)
    globals()[name] = types.ModuleType(name)
    module = types.ModuleType("distopt." + name)
    module.f = lambda: None
    sys.modules["distopt." + name] = module
Leak = type(names[0] if names else "Leak", (Exception,), {})
"""


# A rank that sends SIGKILL to its own process group: the ranks have a session of their own
# (distopt.engine.rank), so it ends only itself; the kernel and every later test live on.
KILLPG_RANK = """\
import os, signal
from distopt import launch
def my_rank_code(rank, world_size):
    os.killpg(os.getpgid(0), signal.SIGKILL)
launch(my_rank_code, 2, timeout=30)
"""

# Ranks that print 100 MB each on one line, past the sandbox's 64 MiB file-size limit: the
# launch's error quotes a few KB of each log, and the graded notebook stays small.
FLOODING_RANKS = """\
from distopt import launch
def my_rank_code(rank, world_size):
    for _ in range(100):
        print("x" * 2**20, end="")
    raise RuntimeError("flooded")
launch(my_rank_code, 2, timeout=60)
"""

# An answer that first starts 300 processes that sleep a minute: it runs into the process
# limit and raises, so its exercise is lost; the processes it started are ended after the
# cell (autograder/strays.py), so that the later exercises keep their points.
SLEEPING_STORM = """\
import subprocess
sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(300)]
"""
# A right answer that needs a process of its own: were the sleepers still there, it could not
# start one, and this exercise would be lost too.
NORMALIZE_IN_A_PROCESS = """\
def normalize(v):
    import subprocess
    subprocess.run(["true"], check=True)
    v = np.asarray(v, dtype=float)
    return v / np.sqrt((v * v).sum())
"""


CASES: dict[str, Case] = {
    # honest students, graded in the same run: their grades must not move
    "honest-complete": Case(_answered(), 5, "graded", ["every test passed"]),
    "honest-blank": Case(_answered(blank=True), 0, "graded", ["failed test_mean_square"]),
    # runaway code
    "infinite-loop": Case(
        _answered(_prepend("normalize", "while True:\n    pass")),
        3,
        "error: timeout in cell 7 (normalize)",
        ["failed test_normalize"],
    ),
    "memory-bomb": Case(
        _answered(_append("mean_square", "hog = []\nwhile True:\n    hog.append(bytes(2**30))")),
        5,
        "graded",
        ["cell 4 (mean_square) raised MemoryError"],
        sandbox=True,
    ),
    # Children die about as fast as they are born (each hits the process limit itself), so
    # the loop usually runs into the timeout; if the kernel meets the limit first, its cell
    # fails with BlockingIOError instead. Either way the machine is fine and dot() counts.
    "fork-bomb": Case(
        _answered(_append("dot", "import os\nwhile True:\n    os.fork()")),
        5,
        ("error: timeout in cell 10 (dot)", "graded"),
        sandbox=True,
    ),
    "kernel-exit": Case(
        _answered(_prepend("normalize", "import os\nos._exit(1)")),
        2,
        "error: kernel died in cell 7 (normalize)",
    ),
    "print-100mb": Case(
        _answered(_append("mean_square", "print('x' * 100_000_000)")),
        5,
        "graded",
        ["printed output of cell 4 (mean_square) cut after 1000000 bytes"],
    ),
    "hung-distributed-rank": Case(
        _answered(lambda nb: nb.cells.append(new_code_cell(HUNG_RANK))),
        5,
        "error: timeout in cell 13",
        sandbox=True,
    ),
    "hung-rank-in-a-cell": Case(
        _answered(lambda nb: nb.cells.append(new_code_cell(SKIPPING_RANK))),
        5,
        "graded",
        ["cell 13 raised LaunchTimeout"],
        sandbox=True,
    ),
    "greedy-ranks-in-a-cell": Case(
        _answered(lambda nb: nb.cells.append(new_code_cell(GREEDY_RANKS))),
        5,
        "graded",
        ["cell 13 raised LaunchError"],
        sandbox=True,
    ),
    "process-storm": Case(
        _answered(lambda nb: nb.cells.insert(_index(nb, "dot"), new_code_cell(PROCESS_STORM))),
        5,
        "graded",
        ["every test passed"],
        sandbox=True,
    ),
    "tree-in-one-bound": Case(
        _answered(_append("mean_square", TREE_IN_ONE_BOUND)),
        5,
        "graded",  # a right answer that starts a process: a person is asked to read it
        ["needs a person's review: cell 4 (mean_square) line 5, a child process"],
        sandbox=True,
        cgroups=True,
    ),
    "print-hidden-tests": Case(
        _answered(lambda nb: nb.cells.append(new_code_cell("print(In)"))),
        5,
        "graded",
        ["every test passed"],
    ),
    "base64-modules": Case(
        _answered(
            _both(
                _replace("dot", "def dot(a, b):\n    raise Leak('no')\n"),
                lambda nb: nb.cells.insert(_index(nb, "normalize"), new_code_cell(BASE64_MODULES)),
                lambda nb: nb.cells.append(new_code_cell("raise Leak('again')")),
            )
        ),
        2,
        "error: tampering detected at cell 9 (test_normalize)",
        [
            "names of the notebook: fake modules",
            "test_dot (tampering)",
            "cell 14 raised an error class of the notebook's own",
        ],
    ),
    # a right answer that walks frames: it keeps its points, and a person is asked to read it
    "needs-review": Case(
        _answered(
            _replace(
                "dot",
                "import sys\n\ndef dot(a, b):\n    caller = sys._getframe(1).f_locals\n"
                "    return sum(x * y for x, y in zip(a, b, strict=True))\n",
            )
        ),
        5,
        "graded",
        ["needs a person's review: cell 10 (dot) line 4, frames or the collector: `caller = sys"],
    ),
    "encoded-history": Case(
        _answered(lambda nb: nb.cells.append(new_code_cell(ENCODED_HISTORY))),
        5,
        "graded",
        ["for review: found += [repr(obj.__code__.co_consts)"],
    ),
    "killpg-from-a-rank": Case(
        _answered(lambda nb: nb.cells.insert(_index(nb, "normalize"), new_code_cell(KILLPG_RANK))),
        5,
        "graded",
        ["raised LaunchError"],
        sandbox=True,
    ),
    "flooding-ranks": Case(
        _answered(
            lambda nb: nb.cells.insert(_index(nb, "normalize"), new_code_cell(FLOODING_RANKS))
        ),
        5,
        "graded",
        ["raised LaunchError"],
        sandbox=True,
    ),
    "sleeping-storm-in-an-answer": Case(
        _answered(
            _both(
                _prepend("mean_square", SLEEPING_STORM),
                _replace("normalize", NORMALIZE_IN_A_PROCESS),
            )
        ),
        3,
        "graded",
        ["failed test_mean_square", "processes running; they were ended"],
        sandbox=True,
    ),
    # broken notebooks
    "syntax-error": Case(
        _answered(_replace("normalize", "def normalize(v)\n    return v")),
        3,
        "graded",
        ["failed test_normalize (NameError)", "cell 7 (normalize) raised SyntaxError"],
    ),
    "early-exception": Case(
        _answered(
            lambda nb: nb.cells[1].update(
                source="raise RuntimeError('oops')\n" + nb.cells[1].source
            )
        ),
        0,
        "graded",
        ["cell 2 raised RuntimeError"],
    ),
    "not-json": Case(_not_json, 0, "error: catalogue.ipynb is not a valid notebook"),
    "empty-file": Case(_empty_file, 0, "error: catalogue.ipynb is not a valid notebook", ["empty"]),
    "no-cells": Case(_no_cells, 0, "graded", ["deleted graded cells put back"]),
    "renamed": Case(_renamed, 5, "graded", ["graded my_catalogue_final.ipynb as catalogue.ipynb"]),
    "missing": Case(_missing, 0, "missing"),
    "extra-files": Case(_extra_files, 3, "graded", ["ignored extra files: data/big.bin, numpy.py"]),
    # test cells and metadata tampered with
    "deleted-tests": Case(_answered(_delete_tests), 5, "graded", ["deleted graded cells put back"]),
    "edited-tests": Case(
        _answered(_edit_tests, blank=True), 0, "graded", ["failed test_mean_square"]
    ),
    # grading leaves out the show-only cell; an error naming what it binds regrades with it
    "reaches-a-shown-name": Case(
        _answered(_reach_a_shown_name), 5, "graded", ["graded running every cell"]
    ),
    "reordered-tests": Case(
        _answered(_move_test_first), 3, "graded", ["failed test_mean_square (NameError)"]
    ),
    "duplicated-test": Case(
        _answered(_both(_duplicate_test, _replace("mean_square", WRONG_MEAN_SQUARE))),
        3,
        "graded",
        ["'test_mean_square' appears twice", "failed test_mean_square"],
    ),
    "changed-points": Case(_answered(_change_points), 5, "graded"),
    "stripped-metadata": Case(
        _answered(_strip_metadata), 5, "graded", ["restored the nbgrader metadata"]
    ),
    "forged-outcome-records": Case(_answered(_forge_records), 5, "graded", ["every test passed"]),
    "cell-from-other-notebook": Case(
        _answered(_foreign_test),
        5,
        "graded",
        ["'test_min_gpus_to_fit' is not part of this notebook"],
    ),
    # monkeypatching what the tests rely on
    "patch-numpy": Case(
        _answered(_replace("normalize", WRONG_NORMALIZE + "np.allclose = lambda *a, **k: True")),
        2,
        "error: tampering detected at cell 8 (test_normalize)",
        ["numpy.allclose was replaced", "for review: np.allclose = lambda *a, **k: True"],
    ),
    "patch-math": Case(
        _answered(
            _replace("mean_square", WRONG_MEAN_SQUARE + "math.isclose = lambda *a, **k: True")
        ),
        0,
        "error: tampering detected at cell 5 (test_mean_square)",
        ["math.isclose was replaced"],
    ),
    "patch-grading-helper": Case(
        _answered(
            _replace(
                "dot",
                NUMPY_DOT + "import distopt.grading\ndistopt.grading.own_work = lambda fn, *t: fn",
            )
        ),
        4,
        "error: tampering detected at cell 11 (test_dot)",
        ["distopt.grading.own_work was replaced"],
    ),
    # the exercise done by numpy instead (own_work refuses np.dot however it is held)
    "delegates-through-the-module": Case(
        _answered(_replace("dot", NUMPY_DOT)), 4, "graded", ["failed test_dot (NotYourOwnWork)"]
    ),
    "delegates-by-default-argument": Case(
        _answered(_replace("dot", "def dot(a, b, _f=np.dot):\n    return float(_f(a, b))\n")),
        4,
        "graded",
        ["failed test_dot (NotYourOwnWork)"],
    ),
    "delegates-through-a-partial-in-a-dict": Case(
        _answered(
            _replace(
                "dot",
                "import functools\nHELD = {'dot': functools.partial(np.dot)}\n"
                "def dot(a, b):\n    return float(HELD['dot'](a, b))\n",
            )
        ),
        4,
        "graded",
        ["failed test_dot (NotYourOwnWork)"],
    ),
    "delegates-by-keyword-default": Case(
        _answered(_replace("dot", "def dot(a, b, *, _f=np.inner):\n    return float(_f(a, b))\n")),
        4,
        "graded",
        ["failed test_dot (NotYourOwnWork)"],
    ),
    "delegates-through-a-class": Case(
        _answered(
            _replace(
                "dot",
                "class Helper:\n    product = staticmethod(np.dot)\n\n"
                "def dot(a, b):\n    return float(Helper.product(a, b))\n",
            )
        ),
        4,
        "graded",
        ["failed test_dot (NotYourOwnWork)"],
    ),
    "delegates-through-an-alias-module": Case(
        _answered(
            _replace(
                "dot",
                "import numpy as xp\n\n"
                "def dot(a, b):\n    return float(getattr(xp, 'in' + 'ner')(a, b))\n",
            )
        ),
        4,
        "graded",
        ["failed test_dot (NotYourOwnWork)"],
    ),
    "delegates-in-a-thread": Case(
        _answered(
            _replace(
                "dot",
                "import threading\n\n"
                "def dot(a, b):\n    out = []\n"
                "    worker = threading.Thread(target=lambda: out.append(np.dot(a, b)))\n"
                "    worker.start()\n    worker.join()\n    return float(out[0]) if out else 0.0\n",
            )
        ),
        4,
        "graded",
        ["failed test_dot (NotYourOwnWork)"],
    ),
    "fake-math-module": Case(
        _answered(
            _replace(
                "mean_square",
                WRONG_MEAN_SQUARE
                + "class FakeMath:\n    isclose = staticmethod(lambda *a, **k: True)\n"
                "math = FakeMath()",
            )
        ),
        0,
        "error: tampering detected at cell 5 (test_mean_square)",
        ["'math' no longer refers to the module math"],
    ),
    "redefine-assertion-error": Case(
        _answered(
            _both(
                _replace(
                    "mean_square", WRONG_MEAN_SQUARE + "class AssertionError(Warning):\n    pass"
                ),
            )
        ),
        0,
        "error: tampering detected at cell 5 (test_mean_square)",
        ["AssertionError"],
    ),
    "patch-builtins": Case(
        _answered(
            _replace(
                "mean_square",
                WRONG_MEAN_SQUARE + "import builtins\nbuiltins.AssertionError = Warning",
            )
        ),
        0,
        "error: tampering detected at cell 5 (test_mean_square)",
        ["builtins.AssertionError was replaced"],
    ),
    "swallow-cells": Case(
        _answered(
            _prepend(
                "mean_square", "get_ipython().input_transformers_cleanup.append(lambda lines: [])"
            ),
            blank=True,
        ),
        0,
        "error: tampering detected at cell 5 (test_mean_square)",
        ["input_transformers_cleanup"],
    ),
    "swallow-errors": Case(
        _answered(
            _prepend(
                "mean_square",
                "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)",
            ),
            blank=True,
        ),
        0,
        "error: tampering detected at cell 5 (test_mean_square)",
        ["custom_exceptions"],
    ),
    # reaching outside the submission
    "read-solutions-and-others": Case(_loot(), 5, "graded", sandbox=True),
    "write-outside": Case(_loot(WRITE_OUTSIDE), 5, "graded", sandbox=True),
    "network": Case(_loot(NETWORK), 5, "graded", sandbox=True),
    "warm-kernel": Case(_loot(WARM_KERNEL), 5, "graded", sandbox=True),
    "walk-the-machine": Case(_loot(WALK_THE_MACHINE), 5, "graded", sandbox=True),
}


def install(root: Path, *, imports_torch: bool = False) -> None:
    """Put the catalogue assignment into the scratch course at ``root`` (solutions/).

    imports_torch -- its set-up cell imports torch too, as every course section's does: the
    grader's zygote then preloads torch and its kernels start the launcher's fork server, so
    that the cases that launch ranks are graded as in a course section (test_hostile.py).
    Without it the catalogue's kernels start without torch, in half a second.
    """
    target = root / "solutions" / SECTION
    target.mkdir(parents=True, exist_ok=True)
    for path in FOLDER.glob("*.ipynb"):
        if not imports_torch:
            (target / path.name).write_bytes(path.read_bytes())
            continue
        nb = nbformat.read(path, as_version=4)
        setup = next(c for c in nb.cells if c.cell_type == "code")
        assert "import numpy as np\n" in setup.source, setup.source
        setup.source = setup.source.replace(
            "import numpy as np\n", "import numpy as np\nimport torch\n"
        )
        nbformat.write(nb, target / path.name)


def cell_text(path: Path) -> str:
    """All the sources and outputs of a notebook, for searching (e.g. for leaked tests)."""
    nb = nbformat.read(path, as_version=4)
    return "\n".join(
        [c.source for c in nb.cells]
        + [re.sub(r"\s+", " ", json.dumps(c.get("outputs", []))) for c in nb.cells]
    )
