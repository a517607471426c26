"""The launcher's fork server: where ``distopt.launch`` forks its ranks from.

A Jupyter kernel runs threads, so forking it is unsafe; the ranks are forked instead from a
single-threaded server process that has imported torch once (:mod:`distopt.engine.preload`),
and a rank starts in milliseconds. :mod:`multiprocessing` starts that server as a fresh
interpreter at the first launch (:func:`context`), which then imports torch again: a few
CPU-seconds. A process that has imported torch already and is still single-threaded can
instead fork the server from itself (:func:`start_here`): the autograder's warm kernels do
that at birth (autograder/zygote.py).
"""

from __future__ import annotations

import multiprocessing as mp
import os

__all__ = ["context", "start_here"]


def context() -> mp.context.BaseContext:
    """The fork-server context of every launch, its server importing torch once."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["distopt.engine.preload"])
    return ctx


def start_here() -> bool:
    """Start the launcher's fork server now, as a fork of this process; True if started.

    For a process that has imported torch and is about to become a Jupyter kernel: the server
    then starts in milliseconds instead of importing torch again. This process must be
    single-threaded, as a fresh server is; otherwise, or where :mod:`multiprocessing`'s fork
    server is not the one this was written for (that of Python 3.11: no authentication key),
    nothing happens and the first launch starts the server as usual.
    """
    import inspect
    import socket
    from multiprocessing import connection, forkserver, resource_tracker

    server = forkserver._forkserver
    expected = ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]
    if (
        list(inspect.signature(forkserver.main).parameters) != expected
        or hasattr(server, "_forkserver_authkey")
        or server._forkserver_pid is not None
        or len(os.listdir("/proc/self/task")) != 1
    ):
        return False
    context()  # the server's preload
    resource_tracker.ensure_running()  # as ForkServer.ensure_running does first
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the server: it serves until this process (alive_w) is gone
            try:
                os.close(alive_w)
                # A process group of its own: at shutdown ipykernel signals the children in
                # its group and waits seconds for them to go; this one goes by itself.
                os.setpgid(0, 0)
                forkserver.main(listener.fileno(), alive_r, server._preload_modules)
            finally:
                os._exit(0)
        os.close(alive_r)
    # What ForkServer.ensure_running records of the server it starts.
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return True
