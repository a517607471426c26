"""Refuse the escapes a rank's answer could take around the checks: child processes, frames,
new code objects, ctypes, threads and channels between the ranks that no collective carries.

The checks of a rank exercise run the student's function in a rank process under the
recorder (:mod:`distopt.engine.record`) and, for some exercises, :func:`distopt.grading.own_work`.
A child interpreter started from the rank runs under neither; a frame reached with
``sys._getframe`` or ``inspect.stack()`` hands over the caller's objects (the recording, the
launch's arguments); a code object built with ``CodeType(...)`` or ``code.replace(...)`` can
pass a package function off as the student's own; ctypes reads and writes any memory; and a
thread's collectives are not seen by the recorder's c10d watch, which looks at the thread it
was opened on. While :func:`armed` is open (:mod:`distopt.engine.rank` opens it around the
rank's function), each of these is refused with :class:`Refused`, whose message names what was
refused. Catching :class:`Refused` leaves the answer without what it asked for.

How it is told apart from torch's and the course's own use of the same things:

* A Python audit hook (``sys.addaudithook``; one installed cannot be removed) sees the events
  ``os.fork``, ``os.forkpty``, ``os.exec``, ``os.spawn``, ``os.posix_spawn``, ``os.system``,
  ``subprocess.Popen``, ``sys._getframe``, ``sys._current_frames``, ``sys._current_exceptions``,
  ``sys.settrace``, ``sys.setprofile``, ``gc.get_objects``, ``gc.get_referrers``,
  ``gc.get_referents``, the reads of ``tb_frame``, ``gi_frame``, ``cr_frame`` and ``ag_frame``
  (``object.__getattr__``), ``code.__new__`` (which ``code.replace`` raises too), every
  ``ctypes.*`` event, and ``socket.connect`` and ``socket.bind`` (a socket of the answer's
  could ask the launcher's fork server for a child; torch's own sockets are C++'s). What
  Python 3.11 raises no event for is replaced, at :func:`install`, by a function that checks
  the same way first: ``_posixsubprocess.fork_exec`` (which :mod:`multiprocessing` calls
  directly), ``_thread.start_new_thread`` (and threading's copy of it), ``ctypes.cast``,
  ``ctypes.memmove``, ``ctypes.memset``, ``signal.signal`` (a handler gets the interrupted
  frame) and threading's ``settrace`` and ``setprofile`` (for threads to come).
* Channels between the ranks that no collective carries (a red team passed five exercises
  through the process group's store): a file opened for writing and the events that change
  the file system (``open`` with a write mode, ``os.mkdir``, ``os.rename``, ``os.utime``,
  ...), shared memory (``_posixshmem.shm_open``, replaced) and the methods of the process
  group's key-value store (``Store.set``, ``get``, ``add``, ...; replaced on the class), and
  torch's C++ file writers that raise no event (``from_file``, torch.save's zip writer).
  :func:`install`
  runs before the rank unpickles the student's function, so a name it bound earlier gets the
  replacement.
* **Who asks** decides. A frame's code file is the *student's* unless it lies in the Python
  installation (standard library, installed packages such as torch) or in this package.
  A child process is refused while any frame of the asking thread's stack is the student's
  (``torch.multiprocessing.spawn`` called by the answer is the answer's). Frames, ``gc``,
  code objects and threads are refused where the nearest frame asking is the student's,
  :mod:`inspect`'s and :mod:`traceback`'s frames skipped (they hand frames to their caller);
  so ``logging``, ``collections.namedtuple``, torch and the course's own code (the
  recorder's ``inspect.signature``, ``own_work``'s profile hook) keep working inside the
  answer. ctypes and threads are refused where the nearest frame outside the standard
  library is the student's (ctypes' and threading's own Python code asks on its caller's
  behalf): torch's threads and the package's (the asynchronous server's waiter) start.
  Writing a file, shared memory and the store's methods are refused where the nearest frame
  that is neither Python's nor an installed package's is the student's: ``torch.save`` or
  ``np.save`` called by the answer write on its behalf, while the launch's own files and
  torch's use of the store for the package's code go on.
* Nothing is refused outside :func:`armed`: the rank's start-up (the fork server, unpickling,
  joining gloo), its report, and the launcher's diagnosis of a hang run as before.

What it does not stop: code the answer reaches without Python (a C extension it compiled),
a frame a package function hands back. Such answers are left to a person's review.
"""

from __future__ import annotations

import os
import signal
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Refused", "armed", "install", "is_armed"]


class Refused(PermissionError):
    """The answer tried something a rank's answer may not do (see the module doc)."""


_STDLIB = tuple(
    {os.path.join(sysconfig.get_path(name), "") for name in ("stdlib", "platstdlib")}
) + ("<frozen ",)
_INSTALLED = tuple({os.path.join(sysconfig.get_path(name), "") for name in ("purelib", "platlib")})
_PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
# Standard-library files that hand frames to their caller: their caller is the one asking.
_FRAME_HANDLERS = tuple(
    os.path.join(sysconfig.get_path("stdlib"), name) for name in ("inspect.py", "traceback.py")
)

_PROCESS_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.spawn",
        "os.posix_spawn",
        "os.system",
        "subprocess.Popen",
        "pty.spawn",
    }  # fmt: skip
)
_FRAME_EVENTS = frozenset(
    {
        "sys._getframe",
        "sys._current_frames",
        "sys._current_exceptions",
        "sys.settrace",
        "sys.setprofile",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
    }  # fmt: skip
)
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})

# What each refusal says: what was refused, and why the answer may not.
_WHY = {
    "process": "a child process runs under no check, recorder or guard",
    "frame": "a frame (or gc's list of objects) hands over the callers' objects, the "
    "recording and the launch's arguments among them",
    "code": "a code object built by hand can pass the package's code off as the answer's",
    "ctypes": "ctypes reads and writes any memory of the process",
    "thread": "the recorder watches the communication of the rank's own thread",
    "socket": "a socket of the answer's own can ask another process (the launcher's fork "
    "server) to start a child, or carry messages the recorder does not see",
    "channel": "a file, shared memory or the process group's key-value store carries data "
    "between the ranks that the recorder does not see; messages go through "
    "torch.distributed's collectives and point-to-point calls",
}
# Writing to the file system: the audit events that change a file or its metadata (a rank
# could leave its data where another reads it). Opening for reading is left alone.
_WRITE_EVENTS = frozenset(
    {
        "os.mkdir",
        "os.rename",
        "os.remove",
        "os.rmdir",
        "os.symlink",
        "os.link",
        "os.utime",
        "os.chmod",
        "os.chown",
        "os.truncate",
        "os.chflags",
        "os.setxattr",
        "os.removexattr",
        "shutil.copyfile",
        "shutil.copymode",
        "shutil.copystat",
        "shutil.copytree",
        "shutil.move",
        "shutil.rmtree",
    }  # fmt: skip
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# The key-value store every process group has (torch.distributed's TCPStore): its methods,
# called from Python, carry bytes between the ranks outside any collective.
_STORE_METHODS = (
    "set", "get", "add", "compare_set", "wait", "multi_get", "multi_set", "append",
    "delete_key", "check", "num_keys", "queue_push", "queue_pop", "list_keys",
)  # fmt: skip

_state = threading.local()  # .busy: this thread is inside the hook (its own frames asked)
_armed: list[str] = []  # what is armed now, innermost last (every thread of the process)
_installed: list[bool] = []


def is_armed() -> bool:
    """Whether refusals are on in this process."""
    return bool(_armed)


@contextmanager
def armed(what: str = "a rank's answer") -> Iterator[None]:
    """Refuse the escapes (module doc) in this process until the block ends; ``what`` names
    the code the refusal is about in its message. Installs the guard if needed."""
    install()
    _armed.append(what)
    try:
        yield
    finally:
        _armed.pop()


def install() -> None:
    """Install the audit hook and the replacements (module doc), once per process."""
    if _installed:
        return
    _installed.append(True)
    sys.addaudithook(_hook)
    import _posixsubprocess
    import _thread
    import ctypes

    _replace(_posixsubprocess, "fork_exec", "process", _anywhere, "a child process")
    for module in (_thread, threading):
        name = "start_new_thread" if module is _thread else "_start_new_thread"
        _replace(module, name, "thread", _nearest_outside_stdlib, "a new thread")
    for name in ("cast", "memmove", "memset"):
        _replace(ctypes, name, "ctypes", _nearest_outside_stdlib, f"ctypes.{name}")
    # A signal handler is handed the interrupted frame; a trace or profile function set for
    # threads to come, every frame of theirs.
    _replace(signal, "signal", "frame", _nearest_outside_stdlib, "signal.signal")
    for name in ("settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads"):
        if hasattr(threading, name):
            _replace(threading, name, "frame", _nearest_outside_stdlib, f"threading.{name}")
    # Channels between the ranks that no collective carries: shared memory (no audit event
    # in 3.11) and the process group's store (C++ methods; torch's own Python calls them too,
    # so a call is refused where the nearest frame that is neither Python's nor torch's is
    # the student's).
    try:
        import _posixshmem

        _replace(
            _posixshmem, "shm_open", "channel", _nearest_outside_python, "shared memory (shm_open)"
        )
    except ImportError:  # not on this platform
        pass
    import torch

    # torch's C++ file writers, which raise no audit event: a file mapped with
    # ``from_file(..., shared=True)`` (created if missing) and torch.save's zip writer.
    # (torch._C._VariableFunctions.from_file cannot be replaced: its attributes are
    # read-only; a call of it is left to a person's review, which lists ``_C`` routes.)
    for holder in (torch, torch.UntypedStorage):
        _replace(holder, "from_file", "channel", _nearest_outside_python, "from_file")
    _replace(torch._C, "PyTorchFileWriter", "channel", _nearest_outside_python, "torch.save")
    try:
        from torch._C._distributed_c10d import Store
    except ImportError:  # torch without distributed
        return
    for name in _STORE_METHODS:
        if hasattr(Store, name):
            _replace(Store, name, "channel", _nearest_outside_python, f"the store's {name}()")


def _replace(module: Any, name: str, kind: str, asks: Callable[[Any], bool], what: str) -> None:
    original = getattr(module, name)

    def refusing(*args: Any, **kwargs: Any) -> Any:
        if _armed and asks(sys._getframe(1)):
            _refuse(kind, what)
        return original(*args, **kwargs)

    refusing.__wrapped__ = original
    refusing.__name__ = getattr(original, "__name__", name)
    setattr(module, name, refusing)


def _refuse(kind: str, what: str) -> None:
    raise Refused(
        f"{what} is refused inside {_armed[-1] if _armed else 'the answer'}: {_WHY[kind]}. "
        "Compute the answer in the rank's own code, with the rank's own data."
    )


def _students(filename: str) -> bool:
    """Whether code of ``filename`` is the student's: not Python's, an installed package's
    or this package's (a notebook cell, a file of the student's, exec'd text)."""
    return not filename.startswith((*_STDLIB, *_INSTALLED, _PACKAGE))


def _anywhere(frame: Any) -> bool:
    """The student's code is somewhere on the stack (a child process on its behalf)."""
    while frame is not None:
        if _students(frame.f_code.co_filename):
            return True
        frame = frame.f_back
    return False


def _nearest(frame: Any) -> bool:
    """The nearest frame asking, past inspect's and traceback's, is the student's."""
    while frame is not None and frame.f_code.co_filename in _FRAME_HANDLERS:
        frame = frame.f_back
    return frame is not None and _students(frame.f_code.co_filename)


def _nearest_outside_stdlib(frame: Any) -> bool:
    """The nearest frame outside the standard library is the student's."""
    while frame is not None and frame.f_code.co_filename.startswith(_STDLIB):
        frame = frame.f_back
    return frame is not None and _students(frame.f_code.co_filename)


def _writes(args: tuple) -> bool:
    """Whether an ``open`` event's (path, mode, flags) open for writing: a mode string with
    w, a, x or + (``open``), or write flags (``os.open``)."""
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 else 0
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _nearest_outside_python(frame: Any) -> bool:
    """The nearest frame that is neither Python's nor an installed package's is the
    student's: torch or numpy writing a file, or torch using the store, on the answer's
    behalf (``torch.save``, ``np.save``, ``torch.distributed.elastic``'s store helpers) is
    the answer's; on this package's behalf (the launch's own parts, a profiler trace), not."""
    while frame is not None and frame.f_code.co_filename.startswith((*_STDLIB, *_INSTALLED)):
        frame = frame.f_back
    return frame is not None and _students(frame.f_code.co_filename)


def _hook(event: str, args: tuple) -> None:
    if not _armed or getattr(_state, "busy", False):
        return
    if event in _PROCESS_EVENTS:
        kind, asks, what = "process", _anywhere, f"a child process ({event})"
    elif event in _FRAME_EVENTS:
        kind, asks, what = "frame", _nearest, event
    elif event == "object.__getattr__":
        if len(args) < 2 or args[1] not in _FRAME_ATTRIBUTES:
            return
        kind, asks, what = "frame", _nearest, f"reading .{args[1]}"
    elif event == "code.__new__":
        kind, asks, what = "code", _nearest, "building a code object (CodeType, code.replace)"
    elif event.startswith("ctypes."):
        kind, asks, what = "ctypes", _nearest_outside_stdlib, event
    elif event in ("socket.connect", "socket.bind"):
        kind, asks, what = "socket", _nearest_outside_stdlib, event
    elif event == "open":
        if not _writes(args):
            return
        kind, asks, what = "channel", _nearest_outside_python, f"writing a file ({args[0]!r})"
    elif event in _WRITE_EVENTS:
        kind, asks, what = "channel", _nearest_outside_python, f"changing the file system ({event})"
    else:
        return
    _state.busy = True  # sys._getframe below raises an event of its own
    try:
        asking = asks(sys._getframe(1))
    finally:
        _state.busy = False
    if asking:
        _refuse(kind, what)
