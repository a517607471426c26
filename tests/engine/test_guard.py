"""The guard of a rank's answer (distopt.engine.guard): every escape refused with a message
naming it, torch's and the package's own use of the same things allowed, nothing refused
outside the armed block; and a real launch refuses the escapes inside its ranks."""

import collections
import ctypes
import gc
import inspect
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback

import numpy as np
import pytest
import torch

from distopt.engine import guard
from distopt.engine.launcher import LaunchError, launch


def _frame_of_a_traceback():
    try:
        raise ValueError
    except ValueError as exc:
        return exc.__traceback__.tb_frame


def _generator_frame():
    def numbers():
        yield 1

    return numbers().gi_frame


def _new_code(c):
    """A code object built field by field from ``c``, under another name."""
    return type(c)(
        c.co_argcount, c.co_posonlyargcount, c.co_kwonlyargcount, c.co_nlocals,
        c.co_stacksize, c.co_flags, c.co_code, c.co_consts, c.co_names, c.co_varnames,
        c.co_filename, "mine", "mine", c.co_firstlineno, c.co_linetable,
        c.co_exceptiontable, c.co_freevars, c.co_cellvars,
    )  # fmt: skip


# name -> (what the answer does, a word the refusal's message holds)
ESCAPES = {
    "sys._getframe": (lambda: sys._getframe(1), "sys._getframe"),
    "inspect.currentframe": (inspect.currentframe, "sys._getframe"),
    "inspect.stack": (inspect.stack, "sys._getframe"),
    "traceback.walk_stack": (lambda: list(traceback.walk_stack(None)), "sys._getframe"),
    "sys._current_frames": (sys._current_frames, "sys._current_frames"),
    "tb_frame": (_frame_of_a_traceback, "tb_frame"),
    "gi_frame": (_generator_frame, "gi_frame"),
    "sys.settrace": (lambda: sys.settrace(None), "sys.settrace"),
    "sys.setprofile": (lambda: sys.setprofile(None), "sys.setprofile"),
    "gc.get_objects": (gc.get_objects, "gc.get_objects"),
    "gc.get_referrers": (lambda: gc.get_referrers(ESCAPES), "gc.get_referrers"),
    "gc.get_referents": (lambda: gc.get_referents(ESCAPES), "gc.get_referents"),
    "code.replace": (lambda: _frame_of_a_traceback.__code__.replace(co_name="mine"), "code"),
    "CodeType": (lambda: _new_code(_frame_of_a_traceback.__code__), "code"),
    "subprocess": (lambda: subprocess.run(["true"], check=False), "subprocess.Popen"),
    "os.system": (lambda: os.system("true"), "os.system"),
    "os.fork": (os.fork, "os.fork"),
    "os.posix_spawn": (
        lambda: os.posix_spawn("/bin/true", ["true"], dict(os.environ)),
        "os.posix_spawn",
    ),
    "os.execv": (lambda: os.execv("/bin/true", ["true"]), "os.exec"),
    "multiprocessing": (
        lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
        "child process",
    ),
    "ctypes.CDLL": (lambda: ctypes.CDLL(None), "ctypes.dlopen"),
    "ctypes.cast": (lambda: ctypes.cast(id(ESCAPES), ctypes.py_object).value, "ctypes.cast"),
    "thread": (lambda: threading.Thread(target=print).start(), "thread"),
    "signal.signal": (lambda: signal.signal(signal.SIGUSR2, lambda *_: None), "signal.signal"),
    "threading.settrace": (lambda: threading.settrace(print), "threading.settrace"),
    "threading.setprofile": (lambda: threading.setprofile(print), "threading.setprofile"),
    "socket.connect": (lambda: socket.socket(socket.AF_UNIX).connect("/nonexistent"), "socket"),
    "socket.bind": (lambda: socket.socket(socket.AF_UNIX).bind(""), "socket.bind"),
    # channels between the ranks that no collective carries (issue 53's red team)
    "open for writing": (lambda: open(_scratch("open"), "w"), "writing a file"),  # noqa: SIM115
    "os.open for writing": (
        lambda: os.open(_scratch("os-open"), os.O_WRONLY | os.O_CREAT),
        "writing a file",
    ),
    "os.mkdir": (lambda: os.mkdir(_scratch("dir")), "os.mkdir"),
    "os.utime": (lambda: os.utime(tempfile.gettempdir()), "os.utime"),
    "torch.save": (lambda: torch.save(torch.ones(2), _scratch("t")), "torch.save"),
    "torch.from_file": (lambda: torch.from_file(_scratch("f"), True, 4), "from_file"),
    "np.save": (lambda: np.save(_scratch("a.npy"), np.ones(2)), "writing a file"),
    "shared memory": (
        lambda: __import__("multiprocessing.shared_memory").shared_memory.SharedMemory(
            create=True, size=8
        ),
        "shared memory",
    ),
    "the store": (lambda: torch.distributed.HashStore().set("k", "v"), "the store's set()"),
}


def _scratch(name: str) -> str:
    """A path in this process's temporary folder that no test leaves behind."""
    return os.path.join(tempfile.gettempdir(), f"distopt-guard-{os.getpid()}-{name}")


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_every_escape_is_refused_with_its_name(name):
    escape, named = ESCAPES[name]
    with guard.armed("the test's answer"), pytest.raises(guard.Refused) as refused:
        escape()
    message = str(refused.value)
    assert named in message and "the test's answer" in message, message


@pytest.mark.parametrize("name", ["sys._getframe", "gc.get_objects", "thread", "code.replace"])
def test_nothing_is_refused_outside_the_armed_block(name):
    escape, _ = ESCAPES[name]
    with guard.armed():
        pass
    result = escape()
    if isinstance(result, threading.Thread):
        result.join()


def test_torch_the_standard_library_and_the_package_keep_working_inside():
    """What torch, logging, namedtuple and the package do for the answer is not refused: the
    nearest frame asking is theirs, not the answer's."""
    from distopt.grading import own_work

    def answer(x):
        return x * 2

    with guard.armed():
        point = collections.namedtuple("Point", "x y")(1, 2)  # sys._getframe in collections
        logging.getLogger("distopt.test").info("logged")  # findCaller walks frames
        model = torch.nn.Linear(3, 2)
        model(torch.ones(4, 3)).sum().backward()  # autograd, torch's own Python
        assert inspect.signature(answer).parameters  # reads __code__, no frame
        assert own_work(answer)(3) == 6  # the package's profile hook and frames
        traceback.format_stack  # noqa: B018  (looking a function up is not a call)
        with open(guard.__file__) as file:  # reading a file is not a channel
            assert file.read(3) == '"""'
    assert point.y == 2 and model.weight.grad is not None


def test_a_refusal_cannot_be_caught_into_a_frame():
    """Catching the refusal leaves the answer without what it asked for."""
    got = []
    with guard.armed():
        try:
            got.append(sys._getframe())
        except guard.Refused:
            pass
    assert got == []


def _tries_to_escape(rank, world_size):
    """Rank code that tries each kind of escape and reports what happened to each."""
    import torch.distributed as dist

    found = {}
    for name, (escape, _) in {
        "frame": (lambda: sys._getframe(1), None),
        "process": (lambda: subprocess.run(["true"], check=False), None),
        "code": (lambda: _tries_to_escape.__code__.replace(co_name="x"), None),
        "ctypes": (lambda: ctypes.CDLL(None), None),
        "thread": (lambda: threading.Thread(target=print).start(), None),
        "store": (lambda: dist.distributed_c10d._get_default_store().set("k", b"v"), None),
        "file": (lambda: open(_scratch(f"rank{rank}"), "wb"), None),  # noqa: SIM115
    }.items():
        try:
            escape()
            found[name] = "allowed"
        except PermissionError as exc:
            found[name] = str(exc)
    tensor = torch.ones(3) * (rank + 1)
    dist.all_reduce(tensor)  # the rank's own work still runs
    return found, tensor.tolist()


def test_a_launched_rank_refuses_every_escape_and_still_communicates():
    results = launch(_tries_to_escape, 2, timeout=60)
    for rank, (found, reduced) in enumerate(results):
        assert reduced == [3.0, 3.0, 3.0], rank
        for name, outcome in found.items():
            refused = ("sys._getframe", "a child process", "building", "ctypes", "a new thread",
                       "the store's set()", "writing a file")  # fmt: skip
            assert outcome.startswith(refused), (rank, name, outcome)
            assert f"rank {rank}'s code" in outcome, outcome


def _forks_after_returning(rank, world_size):
    return os.getpid()


def test_the_ranks_start_and_report_as_before():
    """Start-up (the fork server, unpickling, gloo) and the report run outside the block."""
    pids = launch(_forks_after_returning, 2, timeout=60)
    assert len(set(pids)) == 2 and os.getpid() not in pids


def test_a_rank_that_escapes_unguarded_fails_the_launch_with_the_refusal():
    def escapes(rank, world_size):
        return subprocess.run(["python3", "-c", "print(1)"], capture_output=True).stdout

    with pytest.raises(LaunchError, match="a child process .subprocess.Popen. is refused"):
        launch(escapes, 1, timeout=60)
