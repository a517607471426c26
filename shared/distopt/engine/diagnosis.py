"""What a failed launch says: the end of a rank's log and its error, a few KB whatever the
rank printed, and where each unfinished rank of a launch that timed out is waiting.

Each rank dumps the Python stack of its main thread into its log when the launcher sends it
SIGUSR1 (:mod:`faulthandler`, registered in :mod:`distopt.engine.rank`; it works inside a C
call such as a collective that never completes); :func:`where_stuck` reads the innermost
``torch.distributed`` call and the rank code's own line from it.
"""

from __future__ import annotations

import contextlib
import linecache
import multiprocessing as mp
import os
import re
import signal
import time

__all__ = ["log_path", "log_tail", "shortened", "where_stuck"]


def log_path(log_dir: str, rank: int) -> str:
    """Where rank ``rank`` of a launch writes its stdout and stderr."""
    return os.path.join(log_dir, f"rank{rank}.log")


# What of a failing rank's log the error message quotes: its last lines, from its last bytes,
# and where the log is longer, its first bytes too (a rank can print without end).
_LOG_TAIL_LINES = 40
_LOG_HEAD_BYTES, _LOG_TAIL_BYTES = 1024, 3072
# Characters kept of a rank's exception and of its traceback in the message (head and tail).
_ERROR_CHARS = 4000

# What the ranks' stack dumps (faulthandler, on SIGUSR1) say, and how long to wait for them.
_FRAME = re.compile(r'File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>\S+)')
_DUMP_WAIT_S = 0.5
_POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


def where_stuck(procs: list[mp.process.BaseProcess], missing: list[int], log_dir: str) -> str:
    """One line per unfinished rank: the torch.distributed call it waits in and the line of
    the rank's code that made it (from its stack, dumped into its log), then a hint."""
    sizes = {}
    for rank in missing:
        sizes[rank] = _log_size(log_dir, rank)
        with contextlib.suppress(OSError, TypeError):
            os.kill(procs[rank].pid, signal.SIGUSR1)
    time.sleep(_DUMP_WAIT_S)
    lines, calls = [], []
    for rank in missing:
        frames = _dumped_frames(log_dir, rank, sizes[rank])
        torch_frames = [f for f in frames if f["file"].endswith("distributed_c10d.py")]
        own = next((f for f in frames if _is_own(f["file"])), None)
        call = torch_frames[0]["function"] if torch_frames else None
        calls.append(call)
        where = ""
        if own is not None:
            text = linecache.getline(own["file"], int(own["line"])).strip()
            where = f"line {own['line']} of {own['function']}" + (f": {text}" if text else "")
        if call and where:
            lines.append(f"rank {rank} waits in torch.distributed.{call}, called at {where}")
        elif where:
            lines.append(f"rank {rank} is at {where}")
        elif call:
            lines.append(f"rank {rank} waits in torch.distributed.{call}")
        else:
            lines.append(f"rank {rank}: where it waits could not be read")
    point_to_point = any(c in _POINT_TO_POINT for c in calls) or any(
        re.search(r"\b(i?send|i?recv)\(|\.wait\(", line) for line in lines
    )
    hint = (
        "A send or receive waits for a peer that never posts the matching call: check the "
        "dst= and src= of your point-to-point calls (each a rank in 0 .. world_size - 1, the "
        "other's rank), and that every send has its receive."
        if point_to_point
        else "Check for a rank that skips a collective the others call (they wait for it "
        "forever), or for an infinite loop."
    )
    return "\n".join(lines + [hint])


def _is_own(filename: str) -> bool:
    """Whether a frame's file is the rank code's (a cell or the user's module), not the
    launcher's, torch's or Python's."""
    parts = filename.replace("\\", "/")
    return not any(
        marker in parts
        for marker in ("/torch/", "/distopt/engine/", "/multiprocessing/", "/lib/python3")
    )


def _log_size(log_dir: str, rank: int) -> int:
    try:
        return os.path.getsize(log_path(log_dir, rank))
    except OSError:
        return 0


def _dumped_frames(log_dir: str, rank: int, since: int) -> list[dict[str, str]]:
    """The frames of the stack a rank dumped after byte ``since`` of its log, innermost
    first (faulthandler's order)."""
    try:
        with open(log_path(log_dir, rank), "rb") as log_file:
            log_file.seek(since)
            text = log_file.read(64_000).decode(errors="replace")
    except OSError:
        return []
    frames = [m.groupdict() for m in _FRAME.finditer(text)]
    # The rank's own stack ends where distopt.engine.rank called its function.
    ends = [k for k, frame in enumerate(frames) if frame["file"].endswith("engine/rank.py")]
    return frames[: ends[0]] if ends else frames


def shortened(text: str, limit: int = _ERROR_CHARS) -> str:
    """``text``, or its head and tail with the number of characters cut between them."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}\n[... {len(text) - 2 * keep:,} characters cut ...]\n{text[-keep:]}"


def log_tail(log_dir: str, rank: int) -> str:
    """The end of a rank's captured stdout/stderr (and its start, if it is long), for an
    error message: a few KB at most, however much the rank printed."""
    try:
        with open(log_path(log_dir, rank), "rb") as log_file:
            size = os.fstat(log_file.fileno()).st_size
            if size <= _LOG_HEAD_BYTES + _LOG_TAIL_BYTES:
                head, tail = b"", log_file.read()
            else:
                head = log_file.read(_LOG_HEAD_BYTES)
                log_file.seek(size - _LOG_TAIL_BYTES)
                tail = log_file.read()
    except OSError:
        return ""
    lines = tail.decode(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    if not lines and not head:
        return ""
    if not head:
        return f"\n\nLast {len(lines)} lines of rank {rank}'s output:\n" + "\n".join(lines)
    cut = size - len(head) - len(tail)
    return (
        f"\n\nRank {rank} printed {size:,} bytes; its first {len(head):,} and its last lines "
        f"follow ({cut:,} bytes between them cut):\n{head.decode(errors='replace')}\n"
        f"[... {cut:,} bytes cut ...]\n" + "\n".join(lines)
    )
