"""Run a function on several local CPU processes with ``torch.distributed`` initialised.

``launch(fn, world_size, *args)`` is the course's replacement for ``torchrun`` inside a notebook:
it spawns ``world_size`` processes, initialises a gloo process group in each, calls
``fn(rank, world_size, *args)`` and returns the ranks' return values ordered by rank.

Design choices, and why:

* The "forkserver" start method: forking a Jupyter kernel (which runs threads) is unsafe, so
  the ranks are forked from a fresh single-threaded server process that has imported torch
  once (:mod:`distopt.engine.preload`); a rank then starts in milliseconds, not the seconds an
  interpreter needs to import torch. The server starts at the first launch (or earlier, see
  :mod:`distopt.engine.fork_server`); each rank takes the caller's environment at its launch.
* ``fn`` and its arguments travel with ``cloudpickle`` (the serializer of Ray, Dask and
  joblib): a function of an importable module by name, one defined in a notebook cell (or a
  lambda, or a nested function) by value. The source lines of notebook cells go along, so
  a rank's traceback shows the student's own lines (:mod:`distopt.engine.shipping`).
* The parent owns a ``TCPStore`` server bound to port 0, so the OS picks a free port and
  there is no window in which another program can take it (no port race).
* Children write their stdout/stderr to per-rank log files: ipykernel captures fd-level
  output of child processes into whichever cell happens to run, which would break the
  comparison of notebook outputs. The tail of a failing rank's log goes into the error.
* Every failure mode (exception, hang, silent death, Ctrl-C) ends with all children gone.
* A bench whose class says ``ships_by_parts = True`` is never shipped whole: as an argument
  or inside tuples and lists of them, each rank gets ``bench.own_part(rank)`` in its place,
  built here, in its own private file (:class:`distopt.engine.own_parts.OwnParts`); any other
  copy (a global or closure of the rank code) travels withheld. No rank holds another rank's
  data.

This module imports torch only inside functions, so that a child can redirect its output
before torch (or the module of ``fn``) is imported and prints anything. What runs in each
child is :mod:`distopt.engine.rank`.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import pickle
import queue as queue_lib
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from distopt.engine import device, fork_server
from distopt.engine.diagnosis import log_path, log_tail, shortened, where_stuck
from distopt.engine.rank import DONE_KEY
from distopt.engine.rank import main as rank_main
from distopt.engine.shipping import cell_sources, dumps

__all__ = ["LaunchError", "LaunchTimeout", "launch", "launch_map", "start_fork_server"]

# How long a child gets to exit after SIGTERM before it is SIGKILLed, in seconds.
_TERMINATE_GRACE_S = 2.0
# How often the parent checks for dead children while waiting for results, in seconds.
_POLL_INTERVAL_S = 0.1
# How long to keep reading the queue once a child is seen dead, in seconds: a child that
# reported and then exited may have its message still in the pipe.
_DRAIN_S = 0.5
# How long to wait for more reports once a rank reported an error, in seconds: if another
# rank died silently, the reported error is probably only a consequence of that death.
_SETTLE_S = 0.2
# Environment variables set in the children before torch is imported. One OpenMP thread per
# rank: with several ranks on few cores, oversubscription makes everything ~10x slower.
_CHILD_ENV = {"OMP_NUM_THREADS": "1"}


class LaunchError(RuntimeError):
    """A rank failed (raised, died or hung). ``pids`` lists the pids of all the children."""

    def __init__(self, message: str, pids: list[int] | None = None) -> None:
        super().__init__(message)
        self.pids: list[int] = list(pids or [])

    def __reduce__(self) -> tuple[type, tuple[str, list[int]]]:
        # The default would call cls(message) and lose the pids.
        return type(self), (str(self), self.pids)


class LaunchTimeout(LaunchError, TimeoutError):
    """Some ranks had not finished after ``timeout`` seconds."""


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    backend: str | None = None,
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes: gloo on CPUs, or NCCL
    with one GPU per rank (:mod:`distopt.engine.device`).

    Args:
        fn: any function: of an importable module, or defined in a notebook cell (it and
            what it uses from the notebook travel by value).
        world_size: number of processes (ranks), an int >= 1.
        *args: extra arguments passed to ``fn`` on every rank (cloudpickle must handle them).
            A bench whose class sets ``ships_by_parts`` (the rank exercises' benches), there
            or inside tuples and lists, reaches rank r as ``bench.own_part(r)`` only, built
            here.
        timeout: seconds the whole run may take, spawning included. A rank that waits in a
            collective another rank never calls ends the run here, with the ranks that had
            not finished named.
        backend: ``"auto"`` (NCCL where there is a GPU for every rank, else gloo),
            ``"gloo"`` or ``"nccl"``; None: ``$DISTOPT_BACKEND``, else gloo
            (:data:`distopt.engine.device.DEFAULT`).

    Returns:
        The return values of the ranks, ordered by rank (their tensors on the CPU).

    Raises:
        ValueError: invalid arguments, ``fn`` or its arguments cannot be pickled, or NCCL
            asked for where it cannot run.
        LaunchTimeout: some ranks had not finished after ``timeout`` seconds.
        LaunchError: a rank raised an exception or died without reporting.
        NotImplementedError: a rank raised it (rank code that is not written yet).
    """
    _check_arguments(fn, world_size, timeout)
    shipped, benches = _cut(args)
    if benches:  # each reaches each rank as that rank's own part, never whole
        from distopt.engine.own_parts import OwnParts

        for bench in benches:
            if bench.world_size != world_size:
                raise ValueError(
                    f"launch: this {type(bench).__name__} is shipped one part per rank and "
                    f"needs world_size={bench.world_size}, got {world_size}"
                )
        per_rank = [[bench.own_part(rank) for bench in benches] for rank in range(world_size)]
        with OwnParts(per_rank) as parts:
            runner = functools.partial(_on_own_parts, fn, parts)
            return launch(runner, world_size, *shipped, timeout=timeout, backend=backend)
    placement = device.choose(world_size, backend)
    _note_backend(world_size, placement)
    sources = cell_sources((fn, *args))  # the rank code, and functions passed to it
    try:
        payload = dumps((fn, args, sources))
    except Exception as exc:
        raise ValueError(f"launch: fn and its arguments must be picklable ({exc!r})") from exc

    # Imported here, not at module level: see the module docstring.
    from torch.distributed import TCPStore

    deadline_s = time.monotonic() + timeout
    ctx = fork_server.context()
    log_dir = tempfile.mkdtemp(prefix="distopt-launch-")
    results_queue = ctx.Queue()
    procs: list[mp.process.BaseProcess] = []
    try:
        # Port 0: the OS picks a free port and the store holds it until we are done.
        store = TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False)
        for rank in range(world_size):
            procs.append(
                ctx.Process(
                    target=rank_main,
                    args=(
                        rank,
                        world_size,
                        store.port,
                        timeout,
                        payload,
                        log_path(log_dir, rank),
                        results_queue,
                        {**os.environ, **_CHILD_ENV},
                        placement.backend,
                        placement.device(rank),
                    ),
                    name=f"distopt-rank-{rank}",
                    daemon=True,
                )
            )
        with _environ(_CHILD_ENV), _without_main_module():
            for proc in procs:
                proc.start()
        results = _collect(procs, results_queue, log_dir, deadline_s, timeout)
        store.set(DONE_KEY, "1")  # every rank reported: they may leave the group now
        # The ranks are tearing down their process group: let them exit on their own rather
        # than cut that short (the finally block still kills stragglers).
        _join_all(procs, _TERMINATE_GRACE_S)
        return results
    finally:
        _stop_all(procs)
        for proc in procs:
            if proc.pid is not None and proc.exitcode is not None:
                proc.close()  # releases the sentinel pipe now rather than at garbage collection
        results_queue.close()
        # Nothing was put from the parent; do not wait for a feeder thread.
        results_queue.cancel_join_thread()
        shutil.rmtree(log_dir, ignore_errors=True)


def launch_map(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    processes: int | None = None,
    timeout: float = 600.0,
) -> list:
    """``[fn(item) for item in items]``, the items shared among processes, one per core.

    Independent runs (seeds, settings of a sweep) of one-thread work finish in about
    1/processes of the time; each process runs with one torch thread, as the notebooks'
    own training does, so every value equals the one ``fn(item)`` gives in a process with
    one thread. Item ``i`` goes to process ``i % processes``.

    Args:
        fn: a function of one item (a notebook's too: it travels as :func:`launch`'s do).
        items: what to call it on.
        processes: how many (at most ``len(items)``); None: one per core this process may
            use, or one per item for a few items the cores cannot share evenly.
        timeout: seconds the whole map may take.

    Returns:
        The values, in the items' order.

    Raises:
        LaunchError: ``fn`` raised on an item (the error quotes the process's traceback).
    """
    items = list(items)
    if not items:
        return []
    if processes is None:
        processes = _processes_for(len(items))
    processes = max(1, min(processes, len(items)))
    shares = launch(_map_share, processes, fn, items, timeout=timeout, backend="gloo")
    values = [None] * len(items)
    for rank, share in enumerate(shares):
        values[rank::processes] = share
    return values


def start_fork_server() -> None:
    """Start the process launches fork their ranks from now, in the background.

    Its start imports torch: a few CPU-seconds the first launch would otherwise wait for.
    Started early (a notebook's set-up cell), it takes them on an idle core while the cells
    before the first launch run. Nothing happens if it runs already.
    """
    from multiprocessing import forkserver

    fork_server.context()
    with _environ(_CHILD_ENV), _without_main_module():
        forkserver.ensure_running()


def _processes_for(jobs: int) -> int:
    """One process per core; but a few jobs that the cores cannot share evenly (3 on 2 cores)
    get one process each: the system then shares the cores among them, at about 15 % more
    CPU than one process per core (measured on 2 cores) but with no core idle at the end."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    return jobs if jobs % cores and jobs <= 2 * cores else cores


def _map_share(rank: int, world_size: int, fn: Callable[[Any], Any], items: list) -> list:
    return [fn(item) for item in items[rank::world_size]]


def _ships_by_parts(arg: Any) -> bool:
    """Whether ``arg`` is a bench that ``launch`` ships as each rank's own part only."""
    return getattr(type(arg), "ships_by_parts", False) is True and hasattr(arg, "own_part")


class _PartOf:
    """Where a bench stood in ``launch``'s arguments: the rank puts its own part there."""

    def __init__(self, index: int) -> None:
        self.index = index


_CUT_DEPTH = 3  # how deep into tuples and lists of the arguments benches are looked for


def _cut(args: tuple) -> tuple[tuple, list[Any]]:
    """``args`` with every bench that ships by parts, as an argument or inside tuples and
    lists of them (``runs = [(fn, problem, ...)]``), replaced by a :class:`_PartOf`; and the
    benches, in order."""
    benches: list[Any] = []

    def cut(value: Any, depth: int) -> Any:
        if _ships_by_parts(value):
            benches.append(value)
            return _PartOf(len(benches) - 1)
        if depth < _CUT_DEPTH and type(value) in (tuple, list):
            return type(value)(cut(item, depth + 1) for item in value)
        return value

    return tuple(cut(arg, 0) for arg in args), benches


def _put_parts(value: Any, parts: list[Any], depth: int = 0) -> Any:
    if isinstance(value, _PartOf):
        return parts[value.index]
    if depth < _CUT_DEPTH and type(value) in (tuple, list):
        return type(value)(_put_parts(item, parts, depth + 1) for item in value)
    return value


def _on_own_parts(fn: Callable[..., Any], parts: Any, rank: int, world_size: int, *args: Any):
    """In a rank: this rank's parts read (and the ranks' barrier passed), each put where its
    bench stood in the arguments, before ``fn(rank, world_size, *args)`` starts."""
    own = parts.take(rank)
    return fn(rank, world_size, *_put_parts(args, own))


def _note_backend(world_size: int, placement: device.Placement) -> None:
    """Append the launch's backend to ``$DISTOPT_BACKEND_LOG`` where it is set (gpu-check
    counts the launches that ran on NCCL and those that could not)."""
    path = os.environ.get(device.LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{world_size} {placement.backend} {placement.why}\n")


def _check_arguments(fn: Callable[..., Any], world_size: int, timeout: float) -> None:
    """Raise ValueError for arguments that cannot work, before anything is spawned."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"launch: world_size must be an int >= 1, got {world_size!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"launch: timeout must be a number of seconds > 0, got {timeout!r}")
    if not callable(fn):
        raise ValueError(f"launch: fn must be callable, got {fn!r}")


class _environ:
    """Context manager setting environment variables, restoring the previous values on exit."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self._values.items():
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc_info: object) -> None:
        for key, old in self._saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def _without_main_module() -> Iterator[None]:
    """Ranks started meanwhile do not run the caller's main module again.

    :mod:`multiprocessing` has each child import the parent's ``__main__`` first, as
    ``__mp_main__``: a script's top level (a launch without ``if __name__ == "__main__"``
    starts ranks that launch again and die) or, for ``python - < script.py``, a file named
    ``<stdin>`` (every rank dies at once). A rank needs none of it: ``fn`` and what it uses
    from the main module travel by value (:mod:`distopt.engine.shipping`).
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def without_main(name: str) -> dict:
        data = original(name)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        spawn.get_preparation_data = original


def _collect(
    procs: list[mp.process.BaseProcess],
    results_queue: Any,
    log_dir: str,
    deadline_s: float,
    timeout_s: float,
) -> list:
    """Wait for every rank's report; raise LaunchError on the first failure.

    ``deadline_s`` is a ``time.monotonic()`` value, ``timeout_s`` is only quoted in messages.
    """
    world_size = len(procs)
    pids = [proc.pid for proc in procs if proc.pid is not None]
    results: dict[int, Any] = {}
    errors: dict[int, tuple[str, str]] = {}
    while len(results) < world_size:
        _receive(results_queue, results, errors, _POLL_INTERVAL_S)
        if errors:
            # When one rank fails, the others soon fail too ("connection reset by peer").
            # Give those secondary reports a moment, then blame the most likely root cause.
            time.sleep(_SETTLE_S)
            _drain(results_queue, results, errors, world_size)
            # Before _stop_all: the ranks it terminates would look silently dead too.
            silent = _silently_dead(procs, results, errors)
            _stop_all(procs)
            if silent:
                raise LaunchError(_death_message(procs, silent[0], log_dir), pids)
            rank = next(iter(errors))
            summary, formatted_traceback = (shortened(text) for text in errors[rank])
            message = (
                f"launch: rank {rank} of {world_size} raised {summary}\n\n"
                f"Traceback of rank {rank}:\n{formatted_traceback.rstrip()}"
                + log_tail(log_dir, rank)
            )
            if summary.startswith("NotImplementedError"):
                # An exercise the rank code calls is not answered yet: say so as the
                # notebook's own cells do, not as a failure of the launch.
                raise NotImplementedError(message)
            raise LaunchError(message, pids)
        if _silently_dead(procs, results, errors):
            # A dead rank may have reported just before exiting: read what is left first.
            _drain(results_queue, results, errors, world_size)
            silent = _silently_dead(procs, results, errors)
            if silent and not errors:
                _stop_all(procs)
                raise LaunchError(_death_message(procs, silent[0], log_dir), pids)
            continue  # errors (if any) are handled at the top of the loop
        if time.monotonic() > deadline_s:
            missing = [r for r in range(world_size) if r not in results]
            stuck = where_stuck(procs, missing, log_dir)
            _stop_all(procs)
            tails = "".join(log_tail(log_dir, r) for r in missing)
            raise LaunchTimeout(
                f"launch: timed out after {timeout_s:g} s; ranks {missing} of {world_size} had "
                f"not finished.\n{stuck}" + tails,
                pids,
            )
    return [results[rank] for rank in range(world_size)]


def _receive(
    results_queue: Any,
    results: dict[int, Any],
    errors: dict[int, tuple[str, str]],
    wait_s: float,
) -> bool:
    """Read one message if one arrives within ``wait_s`` seconds; return whether one did."""
    try:
        rank, status, payload = results_queue.get(timeout=wait_s)
    except queue_lib.Empty:
        return False
    if status == "ok":
        results[rank] = pickle.loads(payload)
    else:
        errors[rank] = payload
    return True


def _drain(
    results_queue: Any,
    results: dict[int, Any],
    errors: dict[int, tuple[str, str]],
    world_size: int,
) -> None:
    """Read the messages still in the queue, for up to _DRAIN_S seconds in all."""
    end_s = time.monotonic() + _DRAIN_S
    while len(results) + len(errors) < world_size:
        remaining_s = end_s - time.monotonic()
        if remaining_s <= 0 or not _receive(results_queue, results, errors, remaining_s):
            return


def _silently_dead(
    procs: list[mp.process.BaseProcess],
    results: dict[int, Any],
    errors: dict[int, tuple[str, str]],
) -> list[int]:
    """Ranks that exited without reporting anything (os._exit, a signal, a crash)."""
    return [
        rank
        for rank, proc in enumerate(procs)
        if rank not in results and rank not in errors and proc.exitcode is not None
    ]


def _death_message(procs: list[mp.process.BaseProcess], rank: int, log_dir: str) -> str:
    return (
        f"launch: rank {rank} of {len(procs)} died without reporting a result "
        f"({_describe_exitcode(procs[rank].exitcode)})." + log_tail(log_dir, rank)
    )


def _describe_exitcode(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}, exit code {exitcode}"
    return f"exit code {exitcode}"


def _join_all(procs: list[mp.process.BaseProcess], wait_s: float) -> None:
    """Wait up to ``wait_s`` seconds in all for the started children to exit."""
    end_s = time.monotonic() + wait_s
    for proc in procs:
        if proc.pid is not None:
            proc.join(timeout=max(0.0, end_s - time.monotonic()))


def _stop_all(procs: list[mp.process.BaseProcess]) -> None:
    """Terminate the children that are alive, wait a short grace, then kill the rest."""
    started = [proc for proc in procs if proc.pid is not None]
    for proc in started:
        if proc.is_alive():
            proc.terminate()
    _join_all(started, _TERMINATE_GRACE_S)
    for proc in started:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=_TERMINATE_GRACE_S)
