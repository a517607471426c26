"""Inside the kernel: end the processes a cell left behind when it failed (sent as source).

A cell that starts hundreds of processes and then fails (a storm that ran into the process
limit, say) leaves them running, and they starve the cells after it: the kernel can no longer
start a thread, and it is lost some cells later, with the points of every later exercise.
After each cell that raised or timed out, the grader
(:class:`autograder.nbgrader_plugins.ExecuteUntilKernelDeath`) runs :func:`end_strays` in
the kernel over a silent request, as it does the fingerprint (:mod:`autograder.fingerprint`).

What stays: the kernel itself, and the launcher's fork server and resource tracker, which
``distopt.launch`` keeps between cells (a cell that raised has no launch running: a launch
ends its ranks before it returns or raises). What ends: in the sandbox, every other process
of the kernel's uid (each kernel has a uid of its own there, and the processes whose parent
died are the namespace's PID 1's, no longer the kernel's descendants); without the sandbox,
only the kernel's descendants. The kernel reaps its own children among them.
"""

from __future__ import annotations


def end_strays(whole_uid: bool) -> int:
    """Kill the stray processes (see the module doc); return how many were ended."""
    import os
    import signal
    import time

    me = os.getpid()
    keep = {me}
    try:
        from multiprocessing import forkserver, resource_tracker

        keep.add(forkserver._forkserver._forkserver_pid)
        keep.add(resource_tracker._resource_tracker._pid)
    except (ImportError, AttributeError):
        pass
    uid = os.getuid()
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                parents[int(entry)] = int(fields["PPid"])
        except (OSError, KeyError, ValueError):
            continue  # gone meanwhile

    def descends_from_kernel(pid: int) -> bool:
        seen = set()
        while pid in parents and pid not in seen:
            seen.add(pid)
            pid = parents[pid]
            if pid == me:
                return True
        return False

    strays = [
        pid
        for pid in parents
        if pid not in keep
        and pid not in _ancestors(me, parents)
        and (whole_uid or descends_from_kernel(pid))
    ]
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 2.0
    for pid in (p for p in strays if parents.get(p) == me):  # the kernel's own: reap them
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.01)
    return len(strays)


def _ancestors(pid: int, parents: dict[int, int]) -> set[int]:
    """The processes of this uid above ``pid`` (they started the kernel)."""
    found = set()
    while pid in parents and parents[pid] not in found:
        pid = parents[pid]
        found.add(pid)
    return found
