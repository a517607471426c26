"""One bound per submission: a control group around a sandboxed kernel's whole process tree.

The sandbox's rlimits (autograder.sandbox.Limits) bound each *process*; a submission that
starts four ranks, or a few hundred children, needs a bound on all of them together. Where
the machine lets this process create control groups (root, cgroup v2 with the memory and pids
controllers, or the v1 memory and pids hierarchies), each kernel gets a group of its own,
``autograder-kernels/k<uid>``: its memory (``memory.max`` / ``memory.limit_in_bytes``) and its
number of tasks (``pids.max``) are bounded, and the sandbox's PID 1 joins it before it starts
the kernel, so everything the kernel starts is inside. Elsewhere grading falls back to the
per-process rlimits, and ``make grade``'s first line says so (:func:`describe`).

Kernels also get their uid here, deterministically: the lowest free one from ``FIRST_UID``,
claimed by creating a file named after it (``O_EXCL``), so that two graders on one machine
never share a uid, and a uid left by a killed grader is taken back.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "autograder-kernels"
FIRST_UID, UIDS = 200_000, 10_000


@dataclass(frozen=True)
class Hierarchy:
    """Where this machine's kernel groups go: one folder (v2), or one per controller (v1)."""

    version: int
    parents: tuple[Path, ...]  # v2: (root/GROUP,); v1: (root/memory/GROUP, root/pids/GROUP)


def detect(root: Path = CGROUP_ROOT) -> Hierarchy | str:
    """The hierarchy kernel groups can be made in, or why there is none (one line)."""
    controllers = root / "cgroup.controllers"
    if controllers.is_file():
        found = set(controllers.read_text().split())
        if {"memory", "pids"} <= found and os.access(root, os.W_OK):
            return Hierarchy(2, (root / GROUP,))
        return f"cgroup v2 without the memory and pids controllers for this user ({root})"
    v1 = (root / "memory", root / "pids")
    if all((d / "cgroup.procs").is_file() for d in v1):
        if all(os.access(d, os.W_OK) for d in v1):
            return Hierarchy(1, tuple(d / GROUP for d in v1))
        return f"cgroup v1 memory and pids hierarchies not writable by this user ({root})"
    return f"no cgroup memory and pids controllers under {root}"


def describe(found: Hierarchy | str, memory_bytes: int, tasks: int) -> str:
    """The bound each submission gets, for `make grade`'s first line."""
    if isinstance(found, str):
        return f"per process only (rlimits): {found}"
    return f"per submission, cgroup v{found.version}: {memory_bytes / 2**30:g} GiB, {tasks} tasks"


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def create(found: Hierarchy, name: str, memory_bytes: int, tasks: int) -> list[Path]:
    """Make the kernel group ``name``; the ``cgroup.procs`` files its PID 1 must join."""
    groups = [parent / name for parent in found.parents]
    if found.version == 2:
        parent = found.parents[0]
        parent.mkdir(exist_ok=True)
        # the root and our folder hand the two controllers down (neither holds processes)
        for folder in (parent.parent, parent):
            _write(folder / "cgroup.subtree_control", "+memory +pids")
        groups[0].mkdir(exist_ok=True)
        _write(groups[0] / "memory.max", str(memory_bytes))
        _write(groups[0] / "memory.swap.max", "0")
        _write(groups[0] / "pids.max", str(tasks))
    else:
        memory, pids = groups
        for folder in groups:
            folder.mkdir(parents=True, exist_ok=True)
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
        _write(pids / "pids.max", str(tasks))
    return [g / "cgroup.procs" for g in groups]


def remove(procs: list[str], wait_s: float = 5.0) -> None:
    """Remove the kernel's groups once their processes are gone (they die with the kernel's
    PID namespace; the kernel may take a moment)."""
    deadline = time.monotonic() + wait_s
    for group in (Path(p).parent for p in procs):
        while group.is_dir():
            try:
                group.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)


def claim_uid(folder: Path) -> int:
    """The lowest uid from FIRST_UID no live grader holds; held until :func:`release_uid`."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for uid in range(FIRST_UID, FIRST_UID + UIDS):
        path = folder / str(uid)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            if _holder_alive(path):
                continue
            path.unlink(missing_ok=True)  # left by a grader that was killed: take it back
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue  # another grader took it back first
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return uid
    raise RuntimeError(f"all {UIDS} kernel uids from {FIRST_UID} are held ({folder})")


def release_uid(folder: Path, uid: int) -> None:
    (folder / str(uid)).unlink(missing_ok=True)


def _holder_alive(path: Path) -> bool:
    try:
        pid = int(path.read_text() or "0")
    except (OSError, ValueError):
        return True  # being written right now
    return pid > 0 and Path(f"/proc/{pid}").exists()
