"""An emulated network link: collectives finish when the alpha-beta model says they would.

On this machine the ranks are processes on the same few cores, and loopback gloo neither
costs what a cluster's network costs nor runs beside the computation: overlap hides nothing
measurable. Inside a rank, :func:`emulated_link` gives the rank a link of a stated latency
and bandwidth::

    from distopt.engine import link

    with link.emulated_link(10e-6, 10e9, time_scale=100) as wire:
        dist.all_reduce(grad)                              # returns when the model says
        work = dist.all_reduce(bucket, async_op=True)      # returns at once
        ...                                                # compute goes on meanwhile
        work.wait()                                        # sleeps until the modelled end
    wire.transfers[0].start_s, wire.transfers[0].end_s     # time.perf_counter(), wall seconds

The API, for rank code:

* ``emulated_link(latency_s, bandwidth_bytes_per_s, *, time_scale=1.0, algorithm="ring")``
  is a context manager yielding a :class:`Link`. ``latency_s`` (alpha) and
  ``bandwidth_bytes_per_s`` (beta, each rank's link) describe the stated network; every
  modelled duration is multiplied by ``time_scale`` to give wall seconds (``time_scale=100``:
  a 30 us all-reduce lasts 3 ms here, long against this machine's own cost of a small gloo
  call, so the real op is normally done before the modelled end).
* ``LinkConfig(latency_s, bandwidth_bytes_per_s, time_scale=1.0, algorithm="ring")`` holds
  the same settings, for passing to ranks; ``config.open()`` is ``emulated_link(...)`` with
  them.
* ``linked(fn, latency_s, bandwidth_bytes_per_s, time_scale=...)`` wraps rank code that knows
  nothing of the link, as :class:`distopt.engine.record.traced` does:
  ``launch(linked(fn, 10e-6, 10e9, time_scale=100), 2, *args)`` gives each rank's
  ``(fn's value, Link)``.
* :class:`Link` holds the :class:`Transfer` of every call, in issue order: ``name``,
  ``message_bytes`` (the buffer M the model prices), ``world_size``, ``async_op``,
  ``issued_s``, ``start_s``, ``end_s`` (wall, ``time.perf_counter()``), ``model_s`` (the
  unscaled modelled duration), ``done_s`` (when the real op was seen finished) and
  ``waited_s`` (when the rank had the result back: a blocking call's return, a Work's wait()).
  :meth:`Link.late` lists the transfers whose real op outlasted the model: the emulation
  was not faithful there (raise ``time_scale``).
* :func:`duration_s` is the model alone: seconds of a collective on the stated network.
* Reading a run's timeline step by step (each step's all-reduces, how much of them the
  backward pass hid, how long the last one ran after it) is section 01's exercise 10: the
  package holds no reader of its own (issue 53).
* :func:`profiler` is ``torch.profiler.profile`` set to record every thread: while it runs,
  the link draws each transfer as a ``record_function`` range (``link: all_reduce 4,096 B``)
  on a thread of its own, from its modelled start to its end, so a trace has a communication
  lane beside the compute.

How a call is timed. The rank's link is a serial FIFO resource: a call issued at wall time
``t`` starts at ``max(t, end of the previous transfer)`` and ends ``time_scale`` times the
modelled duration later. The real op runs at once (so the values are the real sums), and

* a blocking call returns when the real op is done *and* the modelled end has passed; it
  sleeps for the difference, so the link occupies no core;
* an ``async_op=True`` call returns at once a ``dist.Work`` whose ``wait()`` waits for the
  real op, then sleeps until the modelled end; ``is_completed()`` is false until then; its
  ``get_future()`` completes at the modelled end too (a timer thread sets it), so DDP comm
  hooks that call ``dist.all_reduce(..., async_op=True).get_future()`` see the link:
  ``ddp.register_comm_hook(None, default_hooks.allreduce_hook)`` routes DDP's buckets through
  it (DDP's own C++ reducer, without a hook, calls gloo directly and is not seen).

The model (Thakur, Rabenseifner & Gropp 2005; :mod:`distopt.costs.comm`), for a buffer of M
bytes over N ranks of the call's group: all-reduce ``comm.allreduce_time`` (ring: 2(N-1)
alpha + 2(N-1)/N M/beta); all-gather, reduce-scatter, all-to-all, gather and scatter (N-1)
alpha + (N-1)/N M/beta; broadcast and reduce, pipelined along a chain, (N-1) alpha + M/beta;
a barrier 2(N-1) alpha; send and receive alpha + M/beta. The bytes term is nccl-tests' bus
factor (``comm.bus_bandwidth``) times M/beta, so the bus bandwidth measured on the link
tends to beta for large messages at every N (the latency terms lower it for small ones).
M is the full buffer one rank holds: the all-reduced tensor, the gathered output, the
reduce-scatter's input.

What is seen: calls looked up as ``dist.<name>`` (or ``distributed_c10d.<name>``) while the
block is open, as in :mod:`distopt.engine.record`. The two compose in either nesting order:
each wraps whatever the module holds when it opens, and each passes a call made from inside
another of its own calls straight through (torch's ``send`` calls ``isend``: one transfer).
Close them in the reverse order of opening (``with`` blocks do).

Limits: the link is per rank and assumes that the ranks issue a collective at about the
same time (data-parallel ranks do); skew between ranks shows only through the real op,
which then waits for the late rank. The modelled times (``start_s``, ``end_s``) follow from
the issue times alone, so a timeline read from them does not depend on this machine's
speed; the wall time a call takes is the later of its modelled end and its real op's end
(see :meth:`Link.late`). Collectives of ``torch.distributed._functional_collectives`` (used
by DTensor) are not seen.
"""

from __future__ import annotations

import contextlib
import heapq
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from distopt.costs import comm
from distopt.engine import record

__all__ = [
    "Link",
    "LinkConfig",
    "Transfer",
    "duration_s",
    "emulated_link",
    "linked",
    "profiler",
]

# name -> how the buffer M the model prices is found: (argument, multiply by N?).
_BUFFER: dict[str, tuple[str | None, bool]] = {
    "all_reduce": ("tensor", False),
    "broadcast": ("tensor", False),
    "reduce": ("tensor", False),
    "all_gather": ("tensor", True),  # the gathered result: N inputs
    "all_gather_into_tensor": ("output_tensor", False),
    "all_gather_single": ("output_tensor", False),  # torch 2.13's name for the one above
    "reduce_scatter": ("input_list", False),
    "reduce_scatter_tensor": ("input", False),
    "reduce_scatter_single": ("input", False),  # torch 2.13's name for the one above
    "all_to_all": ("input_tensor_list", False),
    "all_to_all_single": ("input", False),
    "gather": ("tensor", True),
    "scatter": ("tensor", True),
    "send": ("tensor", False),
    "recv": ("tensor", False),
    "isend": ("tensor", False),
    "irecv": ("tensor", False),
    "barrier": (None, False),
}
_SHARE = ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor")
_SHARE += ("all_gather_single", "reduce_scatter_single")
_SHARE += ("all_to_all", "all_to_all_single", "gather", "scatter")
_POINT_TO_POINT = ("send", "recv", "isend", "irecv")


def duration_s(
    name: str,
    message_bytes: float,
    world_size: int,
    *,
    latency_s: float,
    bandwidth_bytes_per_s: float,
    algorithm: str = "ring",
) -> float:
    """Modelled seconds of one call ``dist.<name>`` on a buffer of ``message_bytes`` (M).

    world_size -- N, ranks in the call's group (peers for send/recv: the formula ignores it)
    latency_s, bandwidth_bytes_per_s -- alpha and beta of each rank's link
    algorithm  -- of the all-reduce (``comm.ALLREDUCE_ALGORITHMS``); the others are rings
    See the module doc for each formula; a group of one rank costs nothing.
    """
    if name not in _BUFFER:
        raise ValueError(f"no model for dist.{name}; known: {sorted(_BUFFER)}")
    if bandwidth_bytes_per_s <= 0 or latency_s < 0:
        raise ValueError("need bandwidth_bytes_per_s > 0 and latency_s >= 0")
    n = world_size
    if name in _POINT_TO_POINT:
        return latency_s + message_bytes / bandwidth_bytes_per_s
    if n <= 1:
        return 0.0
    if name == "all_reduce":
        return comm.allreduce_time(
            message_bytes,
            n,
            bandwidth=bandwidth_bytes_per_s,
            latency=latency_s,
            algorithm=algorithm,
        )
    if name == "barrier":
        return 2 * (n - 1) * latency_s
    if name in _SHARE:
        return (n - 1) * latency_s + comm.allgather_bytes_sent(message_bytes, n) / (
            bandwidth_bytes_per_s
        )
    return (n - 1) * latency_s + message_bytes / bandwidth_bytes_per_s  # broadcast, reduce


@dataclass
class Transfer:
    """One call on the emulated link. Times are wall seconds, ``time.perf_counter()``."""

    name: str  # the torch.distributed function: "all_reduce", "all_gather_into_tensor", ...
    message_bytes: int  # the buffer M the model prices (see the module doc)
    world_size: int  # ranks in the call's group
    async_op: bool  # returned a Work at once (async_op=True, isend, irecv)
    issued_s: float  # when the rank made the call
    start_s: float  # max(issued_s, the previous transfer's end_s): the link is FIFO
    end_s: float  # start_s + time_scale * model_s: when the call completes
    model_s: float  # the modelled duration on the stated network, unscaled
    # When the real op finished: a blocking call's on return, an async one's when its future
    # completed (or, for a work without a future, when wait() returned). None until then.
    done_s: float | None = None
    # When the rank had the result back: a blocking call's return, an async one's first
    # wait() return (None if it never waited). A wait before the compute around it ended
    # held that compute back (a backward pass that waits in a hook overlaps nothing).
    waited_s: float | None = None
    # Set once the profiler lane has closed this transfer's range (None: no lane drew it),
    # so that a call returns only after its range is in the trace.
    drawn: threading.Event | None = field(default=None, repr=False, compare=False)

    def finish(self) -> None:
        """Sleep until the modelled end (and until the lane's range is closed)."""
        _sleep_until(self.end_s)
        if self.drawn is not None:
            self.drawn.wait(timeout=1.0)


@dataclass
class Link:
    """The stated network and the transfers made on it, in issue order."""

    latency_s: float  # alpha, seconds per message
    bandwidth_bytes_per_s: float  # beta, each rank's link
    time_scale: float  # wall seconds per modelled second
    algorithm: str = "ring"  # of the all-reduce
    transfers: list[Transfer] = field(default_factory=list)

    def of(self, name: str | None = None) -> list[Transfer]:
        """The transfers (of ``dist.<name>`` only, if given), in issue order."""
        return [
            t
            for t in self.transfers
            if name is None or record.same_call(t.name) == record.same_call(name)
        ]

    def busy_s(self, name: str | None = None) -> float:
        """Wall seconds the link was busy (with ``name`` only, if given)."""
        return sum(t.end_s - t.start_s for t in self.of(name))

    def late(self, slack_s: float = 0.0) -> list[Transfer]:
        """Transfers whose real op was seen finishing more than ``slack_s`` after the
        modelled end: there the wall time is this machine's, not the model's."""
        return [t for t in self.transfers if t.done_s is not None and t.done_s > t.end_s + slack_s]

    def duration_s(self, name: str, message_bytes: float, world_size: int) -> float:
        """Wall seconds this link gives one call (the model times ``time_scale``)."""
        return self.time_scale * duration_s(
            name,
            message_bytes,
            world_size,
            latency_s=self.latency_s,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            algorithm=self.algorithm,
        )


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _sleep_until(when_s: float) -> None:
    delay = when_s - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


class _LinkWork(dist.Work):
    """The Work of an async call on the link: done when the real op and the model are."""

    def __init__(self, real: Any, transfer: Transfer) -> None:
        super().__init__()
        self._real = real
        self._transfer = transfer

    def wait(self, timeout: Any = None) -> bool:
        if timeout is None:
            self._real.wait()
        else:
            self._real.wait(timeout)
        if self._transfer.done_s is None:
            self._transfer.done_s = time.perf_counter()
        self._transfer.finish()
        if self._transfer.waited_s is None:
            self._transfer.waited_s = time.perf_counter()
        return True

    def is_completed(self) -> bool:
        return self._real.is_completed() and time.perf_counter() >= self._transfer.end_s

    def is_success(self) -> bool:
        return self._real.is_success()

    def exception(self) -> Any:
        return self._real.exception()

    def source_rank(self) -> int:
        return self._real.source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._real.result()

    def get_future(self) -> torch.futures.Future:
        """A future that completes with the real one's value at the modelled end."""
        delayed: torch.futures.Future = torch.futures.Future()
        transfer = self._transfer

        def settle(real_future: torch.futures.Future) -> None:
            if transfer.done_s is None:
                transfer.done_s = time.perf_counter()
            try:
                value = real_future.value()
            except Exception as error:  # noqa: BLE001  (handed on to whoever waits)
                delayed.set_exception(error)
                return
            timer = threading.Timer(
                max(0.0, transfer.end_s - time.perf_counter()), delayed.set_result, (value,)
            )
            timer.daemon = True
            timer.start()

        self._real.get_future().add_done_callback(settle)
        return delayed


class _Lane:
    """A thread that holds a ``record_function`` range over each transfer's modelled
    interval, while a profiler runs: the trace's communication lane."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, float, str, threading.Event]] = []
        self._ready = threading.Condition()
        self._stopped = False
        self._count = 0
        self._thread = threading.Thread(target=self._run, name="emulated link", daemon=True)
        self._thread.start()

    def add(self, transfer: Transfer) -> None:
        label = f"link: {transfer.name} {transfer.message_bytes:,} B"
        transfer.drawn = threading.Event()
        with self._ready:
            self._count += 1
            entry = (transfer.start_s, self._count, transfer.end_s, label, transfer.drawn)
            heapq.heappush(self._heap, entry)
            self._ready.notify()

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._stopped:
                    self._ready.wait()
                if not self._heap:
                    return
                start_s, _, end_s, label, drawn = heapq.heappop(self._heap)
            _sleep_until(start_s)
            with torch.profiler.record_function(label):
                _sleep_until(end_s)
            drawn.set()


def _profiling() -> bool:
    """Is a profiler running? (``torch.autograd._profiler_enabled()`` answers for this
    thread only, and says no under ``profile_all_threads``.)"""
    flag = getattr(torch.autograd.profiler, "_is_profiler_enabled", False)
    return bool(flag) or torch.autograd._profiler_enabled()


class _State:
    """What the wrappers of one open link share."""

    def __init__(self, wire: Link) -> None:
        self.wire = wire
        self.lock = threading.Lock()  # hooks may call from autograd's threads
        self.free_s = 0.0  # when the link is free again
        self.inside = threading.local()  # per thread: is a linked call running?
        self.lane: _Lane | None = None

    def schedule(self, name: str, message_bytes: int, world_size: int, async_op: bool) -> Transfer:
        wall_s = self.wire.duration_s(name, message_bytes, world_size)
        model_s = wall_s / self.wire.time_scale if self.wire.time_scale else 0.0
        with self.lock:
            issued = time.perf_counter()
            start = max(issued, self.free_s)
            self.free_s = start + wall_s
            transfer = Transfer(
                name, message_bytes, world_size, async_op, issued, start, self.free_s, model_s
            )
            self.wire.transfers.append(transfer)
            if _profiling():
                if self.lane is None:
                    self.lane = _Lane()
                self.lane.add(transfer)
        return transfer


def _group_size(values: dict[str, Any]) -> int:
    group = values.get("group")
    return dist.get_world_size(group) if group is not None else dist.get_world_size()


def _note_when_done(real: Any, transfer: Transfer) -> None:
    """Set ``transfer.done_s`` when the real async op completes (gloo's thread runs this)."""

    def note(_: torch.futures.Future) -> None:
        if transfer.done_s is None:
            transfer.done_s = time.perf_counter()

    try:
        real.get_future().add_done_callback(note)
    except RuntimeError:  # a work without a future: wait() will note it, later
        pass


def _linking(name: str, original: Callable, state: _State) -> Callable:
    signature = inspect.signature(original)
    argument, times_n = _BUFFER[name]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(state.inside, "call", False):
            return original(*args, **kwargs)  # made by another linked call: priced there
        values = signature.bind(*args, **kwargs).arguments
        world_size = _group_size(values)
        message_bytes = _nbytes(values.get(argument)) if argument else 0
        if times_n:
            message_bytes *= world_size
        async_op = name in ("isend", "irecv") or bool(values.get("async_op", False))
        transfer = state.schedule(name, message_bytes, world_size, async_op)
        state.inside.call = True
        try:
            result = original(*args, **kwargs)
        finally:
            state.inside.call = False
        if isinstance(result, dist.Work) and async_op:
            _note_when_done(result, transfer)
            return _LinkWork(result, transfer)
        if isinstance(result, dist.Work):  # returned by a blocking call (a batch's work)
            result.wait()
        transfer.done_s = time.perf_counter()
        transfer.finish()
        transfer.waited_s = time.perf_counter()
        return result

    wrapper.__wrapped__ = original
    wrapper.__name__ = original.__name__
    return wrapper


@contextlib.contextmanager
def emulated_link(
    latency_s: float,
    bandwidth_bytes_per_s: float,
    *,
    time_scale: float = 1.0,
    algorithm: str = "ring",
) -> Iterator[Link]:
    """Give this rank's ``dist.<collective>`` calls the timing of a stated link until the
    block ends (see the module doc); yields the :class:`Link` that logs them.

    latency_s             -- alpha, seconds per message (e.g. 10e-6)
    bandwidth_bytes_per_s -- beta, bytes per second of each rank's link (e.g. 10e9)
    time_scale            -- wall seconds per modelled second (> 0)
    algorithm             -- the all-reduce's, one of ``comm.ALLREDUCE_ALGORITHMS``
    Everything is put back when the block ends, even after an exception.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
    duration_s(
        "all_reduce",
        0,
        2,
        latency_s=latency_s,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        algorithm=algorithm,
    )
    wire = Link(latency_s, bandwidth_bytes_per_s, time_scale, algorithm)
    state = _State(wire)
    saved: list[tuple[Any, str, Callable]] = []
    try:
        for name in _BUFFER:
            if hasattr(dist.distributed_c10d, name):  # the *_single names: torch >= 2.13
                record.wrap_collective(name, lambda f, n=name: _linking(n, f, state), saved)
        yield wire
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)
        if state.lane is not None:
            state.lane.stop()
        for transfer in wire.transfers:
            transfer.drawn = None  # an Event: the Link must pickle (a rank returns it)


@dataclass(frozen=True)
class LinkConfig:
    """The settings of :func:`emulated_link`, to hand to ranks as one argument."""

    latency_s: float  # alpha, seconds per message
    bandwidth_bytes_per_s: float  # beta, bytes per second of each rank's link
    time_scale: float = 1.0  # wall seconds per modelled second
    algorithm: str = "ring"  # of the all-reduce

    def open(self) -> contextlib.AbstractContextManager[Link]:
        """``emulated_link`` with these settings."""
        return emulated_link(
            self.latency_s,
            self.bandwidth_bytes_per_s,
            time_scale=self.time_scale,
            algorithm=self.algorithm,
        )

    def duration_s(self, name: str, message_bytes: float, world_size: int) -> float:
        """Modelled seconds of one call on this network (unscaled)."""
        return duration_s(
            name,
            message_bytes,
            world_size,
            latency_s=self.latency_s,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            algorithm=self.algorithm,
        )


class linked:  # noqa: N801  (used like a function: launch(linked(fn, ...), ...))
    """``fn`` run under :func:`emulated_link`: returns ``(fn's value, its Link)``.

    ``launch(linked(rank_code, 10e-6, 10e9, time_scale=100), 2, problem)`` runs unchanged
    rank code on the stated network.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        latency_s: float,
        bandwidth_bytes_per_s: float,
        *,
        time_scale: float = 1.0,
        algorithm: str = "ring",
    ) -> None:
        self.fn = fn
        self.config = dict(
            latency_s=latency_s,
            bandwidth_bytes_per_s=bandwidth_bytes_per_s,
            time_scale=time_scale,
            algorithm=algorithm,
        )

    def __call__(self, rank: int, world_size: int, *args: Any) -> tuple[Any, Link]:
        with emulated_link(**self.config) as wire:
            value = self.fn(rank, world_size, *args)
        return value, wire


def profiler(**kwargs: Any) -> torch.profiler.profile:
    """``torch.profiler.profile`` on the CPU that records every thread, so that the link's
    ranges (drawn on a thread of their own) and autograd's land in the trace; ``kwargs`` go
    to ``torch.profiler.profile``. A profiler without ``profile_all_threads`` records only
    the thread that started it: the link's lane would be missing."""
    from torch._C._profiler import _ExperimentalConfig

    kwargs.setdefault("activities", [torch.profiler.ProfilerActivity.CPU])
    kwargs.setdefault("experimental_config", _ExperimentalConfig(profile_all_threads=True))
    return torch.profiler.profile(**kwargs)
