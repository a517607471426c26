"""What runs in each process ``distopt.launch`` spawns: one rank of the process group.

Leave the parent's process group for a session of its own, redirect this process's output to
its log file (before torch, or the module of ``fn``, is imported and prints anything), join
the gloo process group through the parent's TCPStore, run ``fn(rank, world_size, *args)``
with the escapes of :mod:`distopt.engine.guard` refused, and report its value or its
exception to the parent.
"""

from __future__ import annotations

import ctypes
import faulthandler
import linecache
import os
import pickle
import signal
import sys
import traceback
from typing import Any

from distopt.engine import guard
from distopt.engine.device import DEVICE_ENV, to_cpu

__all__ = ["main"]

# Set in the children only when the user has not set them: gloo should use loopback.
_CHILD_ENV_DEFAULTS = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
# Set in the parent's store once every rank has reported: then the ranks leave the group.
DONE_KEY = "distopt/all-reported"
# Seconds the process group's collectives wait beyond the launch's own timeout.
_COLLECTIVE_GRACE_S = 30


def main(
    rank: int,
    world_size: int,
    port: int,
    timeout_s: float,
    payload: bytes,
    log_path: str,
    results_queue: Any,
    environ: dict[str, str],
    backend: str = "gloo",
    device_name: str = "cpu",
) -> None:
    """Entry point of a spawned rank: redirect output, join the group, run fn, report.

    ``environ`` is the launching process's environment at the launch: the fork server may
    be older than the latest change to it. ``backend`` and ``device_name`` are the launch's
    :class:`distopt.engine.device.Placement` for this rank: on a GPU it becomes the default
    device, so that tensors made without a device land on it.
    """
    # A session of its own: a signal a rank sends to its process group (``os.killpg``) or
    # session reaches only itself and what it started, never the kernel or the fork server.
    os.setsid()
    os.environ.clear()
    os.environ.update(environ)
    _redirect_output(log_path)
    # Asked by the launcher when the launch times out: where this rank waits, into its log,
    # even from inside a C call (a collective that never completes).
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)
    for key, value in _CHILD_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ[DEVICE_ENV] = device_name
    initialised = False
    store = None
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        on_gpu = device_name != "cpu"
        if on_gpu:
            torch.cuda.set_device(device_name)
            torch.set_default_device(device_name)
        # Before unpickling: a name fn's module bound to a guarded function gets the
        # guarded version (distopt.engine.guard).
        guard.install()
        # Unpickled here, after the redirection, so that importing fn's module cannot print
        # into the parent's output.
        fn, args, sources = pickle.loads(payload)
        for filename, lines in sources.items():  # notebook cells: tracebacks show their lines
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            world_size + 1,
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            # Longer than the launch: a rank stuck in a collective is ended by the parent, whose
            # message names the ranks that had not finished, not by gloo's own timeout.
            timeout=timedelta(seconds=timeout_s + _COLLECTIVE_GRACE_S),
        )
        initialised = True
        # Child processes, frames, hand-built code objects, ctypes and threads of the
        # function's own are refused while it runs (distopt.engine.guard).
        with guard.armed(f"rank {rank}'s code"):
            value = fn(rank, world_size, *args)
        if on_gpu:  # the launching process may have no CUDA context: hand back CPU tensors
            value = to_cpu(value)
        # Pickled here so that an unpicklable result is reported like any other error.
        message = (rank, "ok", pickle.dumps(value))
    except BaseException as exc:  # also SystemExit: every rank must report something
        summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        message = (rank, "error", (summary, traceback.format_exc()))
    try:
        results_queue.put(message)
        # Flush the message into the pipe before tearing down the process group: the other
        # ranks fail as soon as this one disconnects, and this rank's report must come first.
        results_queue.close()
        results_queue.join_thread()
        if initialised:
            import torch.distributed as dist

            # Stay in the group until every rank has reported: a rank that returned early
            # must not disconnect from one still running (that one would fail with "connection
            # closed by peer" instead of the launch naming it as the one that hung).
            store.wait([DONE_KEY], timedelta(seconds=timeout_s + _COLLECTIVE_GRACE_S))
            dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()  # into the log, which the parent quotes if this rank failed
    finally:
        _flush_output()
        # Everything is reported and flushed: skip the interpreter's shutdown, which with
        # torch loaded takes 0.5-2 s per rank on a busy 2-core machine, for nothing.
        os._exit(0)


def _redirect_output(log_path: str) -> None:
    """Point this process's fds 1 and 2 (and so sys.stdout/sys.stderr) at a log file."""
    _flush_output()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _flush_output() -> None:
    """Flush Python's and C's stdio buffers (C++ libraries print through the latter)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
