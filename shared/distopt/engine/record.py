"""Record the communication a rank makes: every collective and point-to-point call.

Inside a rank (a function run by ``distopt.launch``)::

    from distopt.engine import record

    with record.communication() as log:
        ... your rank code: dist.all_reduce(...), dist.isend(...), ...
    log.count("all_reduce"), log.payload_bytes("all_reduce"), log.calls[0].time_s

Each call is logged with its name, the bytes of the tensors this rank hands to it, the
reduction, the peer (destination or source, for point-to-point and rooted calls), whether
it was asynchronous, when it was made and, for an all-to-all, the bytes it sends to each
rank, once: ``dist.send`` is logged as a send, not also as the ``isend`` torch makes inside
it; each backward pass's start and end are logged too, so that communication overlapped
with it can be told apart. Tests use it to check that rank code makes the collectives the
section's cost model counts (one all-reduce per bucket; 2(N-1)/N times the gradient bytes on
a ring); students print it next to the formulas.

What is recorded: calls looked up in ``torch.distributed`` while the context is open
(``dist.all_reduce(...)``, and the Python parts of torch that call them; torch 2.13's
``all_gather_single`` and ``reduce_scatter_single`` count as ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` in :meth:`Recording.of`), and every backward pass
(``.backward()``, ``torch.autograd.backward`` or ``torch.autograd.grad``). Every other route
to the process group is seen below the Python API, as the c10d operator it runs (a function
bound to another name before the block, ``from torch.distributed import all_reduce``; the
process group's methods; ``torch.ops.c10d``; functional collectives; the C++ reducer of
``DistributedDataParallel``): the block then fails with :class:`UnseenCommunication`, which
names them. Call collectives as ``dist.<name>``.

Where the environment names a file in ``DISTOPT_MESSAGE_LOG`` (the autograder does, for the
similarity report: :mod:`autograder.similarity`), each block, as it ends, also appends one
line of JSON to it: this rank, the wall-clock times the block began and ended, and each call's
name, bytes and peer. Nothing is written otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

__all__ = [
    "LOG_ENV",
    "POINT_TO_POINT",
    "RECEIVES",
    "SENDS",
    "Call",
    "Recording",
    "SAME_CALL",
    "UnseenCommunication",
    "communication",
    "same_call",
    "run_traced",
    "traced",
]

# name -> (which arguments carry this rank's payload, which argument is the peer).
# The payload is what this rank hands over: the input of a reduction or a send, the tensor
# a receive or broadcast fills, the input of a gather or scatter.
_RECORDED: dict[str, tuple[tuple[str, ...], str | None]] = {
    "all_reduce": (("tensor",), None),
    "broadcast": (("tensor",), "src"),
    "reduce": (("tensor",), "dst"),
    "all_gather": (("tensor",), None),
    "all_gather_into_tensor": (("input_tensor",), None),
    "all_gather_single": (("input_tensor",), None),
    "reduce_scatter": (("input_list",), None),
    "reduce_scatter_tensor": (("input",), None),
    "reduce_scatter_single": (("input",), None),
    "all_to_all": (("input_tensor_list",), None),
    "all_to_all_single": (("input",), None),
    "gather": (("tensor",), "dst"),
    "scatter": (("scatter_list",), "src"),
    "send": (("tensor",), "dst"),
    "recv": (("tensor",), "src"),
    "isend": (("tensor",), "dst"),
    "irecv": (("tensor",), "src"),
    "barrier": ((), None),
}


# torch 2.13's names for the calls torch 2.x called all_gather_into_tensor and
# reduce_scatter_tensor (which it now deprecates): a check asking for one sees either.
SAME_CALL = {
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
}
# Those of the calls above this torch has (the new names came with torch 2.13).
_RECORDED = {name: how for name, how in _RECORDED.items() if hasattr(c10d, name)}


def same_call(name: str) -> str:
    """The name a check uses for the call ``name`` (see :data:`SAME_CALL`)."""
    return SAME_CALL.get(name, name)


# The environment variable naming the file each block's calls are appended to (module doc).
LOG_ENV = "DISTOPT_MESSAGE_LOG"

# The point-to-point calls, by direction.
SENDS, RECEIVES = ("send", "isend"), ("recv", "irecv")
POINT_TO_POINT = SENDS + RECEIVES


@dataclass(frozen=True)
class Call:
    """One communication call of this rank."""

    name: str  # the torch.distributed function: "all_reduce", "isend", ...
    payload_bytes: int  # bytes of the tensors this rank handed to it
    op: str | None  # the reduction ("SUM", "AVG", ...) where there is one
    peer: int | None  # destination or source rank, for point-to-point and rooted calls
    async_op: bool  # True for isend/irecv and calls with async_op=True
    time_s: float  # time.perf_counter() when the call was made
    # Copies of the tensors this rank handed over, taken as the call was made (with
    # ``communication(payloads=True)`` only): what a send or a reduction's input carried.
    payload: tuple[torch.Tensor, ...] = field(default=(), repr=False, compare=False)
    # An all-to-all's bytes to each rank of the group, in rank order (its split sizes times
    # the bytes of a row): this rank's own part stays local. Empty for other calls.
    peer_bytes: tuple[int, ...] = field(default=(), compare=False)


@dataclass
class Recording:
    """The calls made while the context was open, in order."""

    calls: list[Call] = field(default_factory=list)
    # (start, end) of each backward pass (``torch.autograd.backward`` or
    # ``torch.autograd.grad``), time.perf_counter()
    backward: list[tuple[float, float]] = field(default_factory=list)
    # The c10d operators this rank ran outside every recorded call (see :func:`_below_the_api`):
    # communication by a route the recorder does not see, "c10d.allreduce_", ...; and
    # UNCOUNTED_BACKWARD for each backward pass run by a route that is not counted above.
    unseen: list[str] = field(default_factory=list)

    def count(self, name: str | None = None) -> int:
        """Number of calls (of ``name`` only, if given)."""
        return len(self.of(name))

    def payload_bytes(self, name: str | None = None) -> int:
        """Bytes handed to the calls (of ``name`` only, if given)."""
        return sum(call.payload_bytes for call in self.of(name))

    def of(self, name: str | None) -> list[Call]:
        """The calls of ``name`` (torch 2.13's new names and the old count as one call, see
        :data:`SAME_CALL`), or all of them."""
        if name is None:
            return list(self.calls)
        return [call for call in self.calls if same_call(call.name) == same_call(name)]

    def names(self) -> list[str]:
        return [call.name for call in self.calls]

    def sent(self) -> list[Call]:
        """The point-to-point messages this rank sent (``send`` and ``isend``), in order."""
        return [call for call in self.calls if call.name in SENDS]

    def received(self) -> list[Call]:
        """The point-to-point messages this rank received (``recv`` and ``irecv``), in order."""
        return [call for call in self.calls if call.name in RECEIVES]

    def collectives(self) -> list[Call]:
        """Every call that is not point to point (barrier included)."""
        return [call for call in self.calls if call.name not in POINT_TO_POINT]

    def during_backward(self, name: str | None = None) -> list[Call]:
        """The calls made while a backward pass was running: communication overlapped with
        computing gradients (what DDP's buckets are for)."""
        return [c for c in self.of(name) if any(a <= c.time_s <= b for a, b in self.backward)]

    def summary(self) -> str:
        """One line per kind of call: how many, how many bytes handed over."""
        kinds = dict.fromkeys(self.names())
        lines = [f"{k}: {self.count(k)} call(s), {self.payload_bytes(k):,} bytes" for k in kinds]
        return "\n".join(lines) or "no communication recorded"


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.detach().clone()]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _peer_bytes(name: str, values: dict[str, Any]) -> tuple[int, ...]:
    """The bytes an all-to-all hands to each rank of its group (see :attr:`Call.peer_bytes`)."""
    if name == "all_to_all":
        return tuple(_nbytes(t) for t in values.get("input_tensor_list") or ())
    if name != "all_to_all_single" or not isinstance(values.get("input"), torch.Tensor):
        return ()
    tensor = values["input"]
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = _nbytes(tensor) // rows if rows else 0
    splits = values.get("input_split_sizes")
    if not splits:  # None or empty: equal parts, one per rank of the group
        size = dist.get_world_size(values.get("group"))
        splits = [rows // size] * size
    return tuple(int(s) * row_bytes for s in splits)


def _op_name(op: Any) -> str | None:
    return None if op is None else str(getattr(op, "name", op)).rsplit(".", 1)[-1]


def _peer(values: dict[str, Any], peer_arg: str | None) -> int | None:
    """The peer's global rank: ``dst``/``src``, or ``group_dst``/``group_src`` (a rank within
    ``group``, as ``batch_isend_irecv`` passes it) mapped to the global rank."""
    if peer_arg is None:
        return None
    if values.get(peer_arg) is not None:
        return values[peer_arg]
    group_peer = values.get(f"group_{peer_arg}")
    if group_peer is None:
        return None
    group = values.get("group")
    return group_peer if group is None else dist.get_global_rank(group, group_peer)


def _recording(
    name: str, original: Callable, log: Recording, inside: threading.local, payloads: bool
) -> Callable:
    import inspect

    signature = inspect.signature(original)
    payload_args, peer_arg = _RECORDED[name]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(inside, "call", False):
            # Made by another recorded call (torch's send calls isend, recv calls irecv):
            # the message is the outer call's, logged once.
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        log.calls.append(
            Call(
                name=name,
                payload_bytes=sum(_nbytes(values.get(a)) for a in payload_args),
                op=_op_name(values.get("op")) if "op" in values else None,
                peer=_peer(values, peer_arg),
                async_op=name in ("isend", "irecv") or bool(values.get("async_op", False)),
                time_s=time.perf_counter(),
                payload=tuple(t for a in payload_args for t in _tensors(values.get(a)))
                if payloads
                else (),
                peer_bytes=_peer_bytes(name, values),
            )
        )
        inside.call = True
        _below.depth = getattr(_below, "depth", 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            inside.call = False
            _below.depth -= 1

    wrapper.__wrapped__ = original
    wrapper.__name__ = original.__name__
    return wrapper


# Per thread: how many recorded calls are running (their c10d operators are seen, see
# :class:`_BelowTheApi`).
_below = threading.local()
# Per thread: how many counted backward passes are running (:func:`_timing_backward`).
_counted_backward = threading.local()
# What :attr:`Recording.unseen` holds for a backward pass no counted route started.
UNCOUNTED_BACKWARD = "a backward pass not counted"
# The namespaces of torch's communication operators: the process group's and the
# functional collectives'.
_C10D_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd"})
# Operators there that move nothing: waiting for a result, wrapping one for autograd.
_NOT_MESSAGES = frozenset({"wait_tensor", "_wrap_tensor_autograd", "check_for_nan"})
# torch's own calls below the API that are not the rank's messages: DistributedDataParallel's
# set-up (rank 0's weights broadcast, every rank's parameter shapes compared) and what it
# does before a forward pass (rank 0's buffers broadcast, the bucket order agreed once).
# (file, functions) whose frame on the stack marks an operator as theirs; the reducer's
# gradient all-reduces, made in the backward pass, are not among them.
_TORCH_OWN = (
    (
        os.path.join("torch", "nn", "parallel", "distributed.py"),
        frozenset({"__init__", "_pre_forward", "_sync_buffers"}),
    ),
)


def _torch_own() -> bool:
    """Whether the operator being dispatched is one of torch's own (see :data:`_TORCH_OWN`)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        for filename, functions in _TORCH_OWN:
            if code.co_name in functions and code.co_filename.endswith(filename):
                return True
        frame = frame.f_back
    return False


def _below_the_api(log: Recording) -> Any:
    """A ``TorchDispatchMode`` that logs in ``log.unseen`` every c10d operator this thread
    runs outside a recorded call.

    Every route to the process group ends in a c10d operator that passes torch's
    dispatcher: ``dist.all_reduce`` and ``dist.group.WORLD.allreduce``, ``_get_default_group()``'s
    methods, ``torch.ops.c10d.allreduce_`` and ``_functional_collectives.all_reduce``
    (``_c10d_functional.all_reduce``) alike. Those made inside a recorded ``dist.<name>``
    call are that call's, and DDP's set-up is torch's own (:data:`_TORCH_OWN`); any other
    is a message the recorder did not log. The mode sees the
    thread that opened the block (:mod:`distopt.engine.guard` refuses the answer threads of
    its own inside a rank).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    graph_tasks: set[int] = set()  # the backward passes already logged as not counted

    class _BelowTheApi(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            # An operator of a backward pass (the autograd engine runs a CPU graph in the
            # calling thread, so every pass is seen here) that no counted call started:
            # torch.autograd.backward.__wrapped__, the engine's run_backward, ...
            task = torch._C._current_graph_task_id()
            if task != -1 and getattr(_counted_backward, "depth", 0) == 0:
                if task not in graph_tasks:
                    graph_tasks.add(task)
                    log.unseen.append(UNCOUNTED_BACKWARD)
            if (
                func.namespace in _C10D_NAMESPACES
                and getattr(_below, "depth", 0) == 0
                and func._opname not in _NOT_MESSAGES
                and not _torch_own()
            ):
                log.unseen.append(f"{func.namespace}.{func._opname}")
            return func(*args, **(kwargs or {}))

    return _BelowTheApi()


class UnseenCommunication(AssertionError):
    """Rank code communicated by a route the recorder does not log."""


def _unseen_message(log: Recording) -> str:
    counts = {name: log.unseen.count(name) for name in dict.fromkeys(log.unseen)}
    backward = counts.pop(UNCOUNTED_BACKWARD, 0)
    said = []
    if backward:
        said.append(
            f"this rank ran {backward} backward pass(es) by a route the recorder does not "
            "count (torch.autograd.backward.__wrapped__, the autograd engine's run_backward, "
            "...). Start every backward pass with loss.backward(), torch.autograd.backward or "
            "torch.autograd.grad, so that the checks see it."
        )
    if counts:
        listed = ", ".join(f"{name} x{n}" for name, n in counts.items())
        said.append(
            f"this rank ran {sum(counts.values())} communication operator(s) that no recorded "
            f"torch.distributed call made ({listed}): the process group's own methods "
            "(dist.group.WORLD.allreduce, _get_default_group()), torch.ops.c10d, "
            "_functional_collectives or DistributedDataParallel's reducer. Call the "
            "collectives as dist.<name>(...) (dist.all_reduce, dist.isend, ...) so that every "
            "message is seen and checked."
        )
    return " ".join(said)


def _timing_backward(original: Callable, log: Recording) -> Callable:
    def backward(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        _counted_backward.depth = getattr(_counted_backward, "depth", 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            _counted_backward.depth -= 1
            log.backward.append((start, time.perf_counter()))

    backward.__wrapped__ = original
    return backward


class traced:  # noqa: N801  (used like a function: launch(traced(fn), ...))
    """``fn`` run under :func:`communication`: returns ``(fn's value, its Recording)``.

    For tests and demos: ``launch(traced(rank_code), 2, problem)`` gives each rank's result
    and what it sent, without changing the rank code; ``payloads=True`` keeps a copy of what
    each call carried (:attr:`Call.payload`).
    """

    def __init__(self, fn: Callable[..., Any], *, payloads: bool = False) -> None:
        self.fn = fn
        self.payloads = payloads

    def __call__(self, rank: int, world_size: int, *args: Any) -> tuple[Any, Recording]:
        with communication(payloads=self.payloads) as log:
            value = self.fn(rank, world_size, *args)
        return value, log


def wrap_collective(
    name: str, make_wrapper: Callable[[Callable], Callable], saved: list[tuple[Any, str, Callable]]
) -> None:
    """Put ``make_wrapper(original)`` in the place of ``torch.distributed``'s ``name`` (in
    ``dist`` and in ``distributed_c10d``, wherever the current one is the original), and add
    ``(module, name, original)`` to ``saved`` for each, so the caller can put them back in
    reverse order. Wrappers stack: the recorder and the emulated link each wrap what they find.
    """
    original = getattr(c10d, name)
    wrapper = make_wrapper(original)
    for module in (dist, c10d):
        if getattr(module, name, None) is original:
            saved.append((module, name, original))
            setattr(module, name, wrapper)


def run_traced(
    fn: Callable[..., Any], bench: Any, *args: Any, timeout: float = 60, payloads: bool = False
) -> list[tuple[Any, Recording]]:
    """``fn(rank, world_size, bench, *args)`` on ``bench.world_size`` ranks, each under
    :func:`communication`: its (value, recording), rank 0's first.

    A bench that ships by parts (``ships_by_parts``) reaches each rank as its own part
    (:func:`distopt.engine.launcher.launch` cuts it), and ``fn`` receives that part as
    ``bench``.
    """
    from distopt.engine.launcher import launch  # the launcher's ranks import this module

    return launch(traced(fn, payloads=payloads), bench.world_size, bench, *args, timeout=timeout)


@contextmanager
def communication(*, payloads: bool = False, unseen_allowed: bool = False) -> Iterator[Recording]:
    """Record this rank's communication calls until the block ends (see the module doc).

    ``payloads=True`` also keeps a copy of every tensor handed over (:attr:`Call.payload`),
    for tests that check what a message carried, not only its size.

    Communication below the Python API is watched too: a c10d operator that no recorded call
    made (the process group's methods, ``torch.ops.c10d``, functional collectives, DDP's
    reducer without a hook that calls ``dist.all_reduce``) is logged in
    :attr:`Recording.unseen`, and the block then ends with :class:`UnseenCommunication`
    (unless ``unseen_allowed=True``, for a demo that records alongside such code).

    Both ``torch.distributed.<name>`` and ``torch.distributed.distributed_c10d.<name>`` are
    wrapped, so the calls are seen whichever way the code reaches them; everything is put
    back when the block ends, even after an exception.
    """
    log = Recording()
    began = time.time()
    saved: list[tuple[Any, str, Callable]] = []
    # A backward pass by either route: Tensor.backward calls torch.autograd.backward.
    for name in ("backward", "grad"):
        original = getattr(torch.autograd, name)
        saved.append((torch.autograd, name, original))
        setattr(torch.autograd, name, _timing_backward(original, log))
    inside = threading.local()  # per thread: is a recorded call running (see _recording)?
    below = _below_the_api(log)
    try:
        for name in _RECORDED:
            wrap_collective(name, lambda f, n=name: _recording(n, f, log, inside, payloads), saved)
        with below:
            yield log
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)
        if os.environ.get(LOG_ENV):
            _append_to_log(os.environ[LOG_ENV], log, began)
    if log.unseen and not unseen_allowed:
        raise UnseenCommunication(_unseen_message(log))


def _append_to_log(path: str, log: Recording, began: float) -> None:
    """One line of JSON for ``log`` at the end of ``path`` (see the module doc): one write of
    a file opened to append, so that ranks writing at once do not interleave. A file that
    cannot be written is skipped: the log is evidence for a person, never a reason to fail."""
    line = {
        "pid": os.getpid(),
        "rank": dist.get_rank() if dist.is_initialized() else None,
        "world_size": dist.get_world_size() if dist.is_initialized() else None,
        "began": began,
        "ended": time.time(),
        "calls": [[c.name, c.payload_bytes, c.peer] for c in log.calls],
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass
