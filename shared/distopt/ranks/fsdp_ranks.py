"""Fully sharded data parallelism (ZeRO-3) on real ranks: the bench of section 02's exercise,
and FSDP2's own traffic and gathered memory measured on the same model.

ZeRO stage 3 (Rajbhandari et al. 2020, Section 5.3; FSDP in PyTorch) keeps 1/N of every
layer's parameters on each rank and gathers a layer's full weights only while the layer
computes: an all-gather before its forward, another before its backward, and a
reduce-scatter of its weight gradient after it. Two things are measured here:

* :class:`FsdpBench`, the bench a student's rank code runs on (section 02, exercise 9). It
  wraps a :class:`~distopt.problems.shards.ShardedProblem` and hands rank r only its own
  shard of each layer's starting weights (:meth:`FsdpBench.start_shard`), and the buffers
  the full weights are gathered into (:meth:`FsdpBench.full_buffer`), which it counts while
  their storage lives, copies included: :func:`full_weight_meter` keeps the largest number
  of full-weight bytes alive at once, the quantity ZeRO-3 keeps down to one layer, in
  closures the rank code is not handed. :func:`run_on_bench` runs rank
  code on the bench with every collective recorded (:mod:`distopt.engine.record`).
* :func:`measure_fsdp2`: the same model trained by ``torch.distributed.fsdp.fully_shard``,
  with ``reshard_after_forward`` True and False: every collective it makes with the bytes
  handed over, ``CommDebugMode``'s count of them, and the bytes of full weights it holds at
  once (its unsharded parameters, and those plus the all-gather buffers in flight).

The layout of a layer on the bench is the paper's: the ``nn.Linear``'s weight (out, in),
row-major, then its bias (out,), flattened into one vector of ``out * in + out`` numbers,
padded with zeros to ``N * S`` with ``S = ceil(numel / N)``; rank r holds numbers
``[r S, (r + 1) S)``. The package holds no by-hand ZeRO-3: that is the exercise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn

from distopt.engine import record
from distopt.engine.record import Recording
from distopt.problems.own_data import ForeignShardError, refuse_other_rank
from distopt.problems.shards import RankShard, ShardedProblem, _build_model, flat

__all__ = [
    "BenchRun",
    "FsdpBench",
    "Meter",
    "MeterReport",
    "full_weight_meter",
    "measure_fsdp2",
    "run_on_bench",
]

# What a rank that asked for another rank's shard should do instead.
_OWN_SHARD_ONLY = (
    "A rank holds only its own 1/N of each layer: bench.start_shard(rank, layer) answers for "
    "your rank; the other ranks' numbers reach you through dist.all_gather_single."
)


class MeterReport(NamedTuple):
    """What a rank's full-weight meter saw (:func:`full_weight_meter`)."""

    peak_bytes: int  # most full-weight bytes alive at once: each layer alive counted once
    peak_layers: tuple[int, ...]  # the layers alive at that peak
    handed_out: int  # buffers the bench handed out
    copies: int  # copies of full weights the rank made (clone, copy_, to, cat, ...)


class Meter(NamedTuple):
    """The closures of one rank's meter: its state lives in them, not in any object the
    rank code is handed (the bench calls ``hand_out`` only)."""

    hand_out: Callable[[torch.Tensor, int], None]  # a buffer the bench gives out, its layer
    layer_of: Callable[[torch.Tensor], int | None]  # the layer whose storage it is, if any
    note_copy: Callable[[torch.Tensor, int], None]  # a new storage holding a layer's weights
    report: Callable[[], MeterReport]


def full_weight_meter(layer_bytes: tuple[int, ...]) -> Meter:
    """A meter of the full weights alive in this process, by **storage** lifetime.

    A buffer (and every copy of one, :func:`_counting_copies`) counts from when it is handed
    out (made) until its storage is freed: while any tensor uses that storage (a view, a
    ``.detach()`` or ``.data`` alias, a tensor saved for backward, a numpy array made from
    it), whatever happened to the Python object first handed out. A layer alive through
    several storages counts once, ``layer_bytes[layer]`` (its gathered buffer's bytes): the
    peak is the largest sum over the layers alive at once, taken whenever one more storage
    starts to count, the only moments the sum can grow.
    """
    alive: dict[int, tuple[int, int]] = {}  # token -> (layer, storage data_ptr)
    state = {"peak": 0, "layers": (), "handed": 0, "copies": 0, "next": 0}

    def track(tensor: torch.Tensor, layer: int) -> None:
        storage = tensor.untyped_storage()
        token = state["next"]
        state["next"] += 1
        alive[token] = (layer, storage.data_ptr())
        # A storage's Python object lives exactly as long as the storage (torch keeps it).
        weakref.finalize(storage, alive.pop, token, None)
        layers = sorted({held for held, _ in alive.values()})
        total = sum(layer_bytes[held] for held in layers)
        if total > state["peak"]:
            state["peak"], state["layers"] = total, tuple(layers)

    def hand_out(tensor: torch.Tensor, layer: int) -> None:
        state["handed"] += 1
        track(tensor, layer)

    def layer_of(tensor: torch.Tensor) -> int | None:
        if tensor.numel() == 0:
            return None
        pointer = tensor.untyped_storage().data_ptr()
        return next((layer for layer, p in list(alive.values()) if p == pointer), None)

    def note_copy(tensor: torch.Tensor, layer: int) -> None:
        state["copies"] += 1
        track(tensor, layer)

    def report() -> MeterReport:
        return MeterReport(state["peak"], state["layers"], state["handed"], state["copies"])

    return Meter(hand_out, layer_of, note_copy, report)


class FsdpBench:
    """What every rank of the ZeRO-3 exercise gets: its shards, its data, counted buffers.

    ``problem`` gives the data and the training (``problem.batch(step, rank)``,
    ``problem.loss_sum``, ``problem.global_batch``, ``problem.steps``, ``problem.lr``); the
    model is the problem's MLP (Linear layers with ReLUs between them), float64. A rank never
    gets the bench whole: ``distopt.launch`` ships it :meth:`own_part` only, its rows and its
    shard of each layer's starting weights (``start_shard``), no whole model, no seed.

    The bench holds no meter: :func:`run_on_bench` gives each rank's copy one
    (:func:`full_weight_meter`), whose state lives in closures; the bench only tells it of
    each buffer it hands out. Without one (outside :func:`run_on_bench`), buffers are
    handed out uncounted.
    """

    # distopt.launch never ships it whole: rank r gets own_part(r) only
    ships_by_parts = True

    def __init__(
        self,
        problem: ShardedProblem | RankShard,
        start_shards: tuple[int, tuple[torch.Tensor, ...]] | None = None,
    ) -> None:
        self.problem = problem
        # In a rank's part (own_part): (its rank, its shard of each layer's starting weights).
        self._start_shards = start_shards
        self._hand_out: Callable[[torch.Tensor, int], None] | None = None

    def __getstate__(self) -> dict:
        # a copy travels without this process's meter
        return {"problem": self.problem, "start_shards": self._start_shards}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["problem"], state.get("start_shards"))

    def own_part(self, rank: int) -> FsdpBench:
        """What rank ``rank`` gets, built here (outside the ranks): a bench on its own part of
        the problem (:meth:`ShardedProblem.own_part`) with its shard of every layer's starting
        weights; no seed, no whole model and nothing of another rank (:func:`run_on_bench` ships
        it)."""
        shards = tuple(self.start_shard(rank, layer) for layer in range(self.num_layers))
        # no whole model either, not even rank 0's: a rank starts from its shards
        part = dataclasses.replace(self.problem.own_part(rank), start=())
        return FsdpBench(part, (rank, shards))

    @property
    def world_size(self) -> int:
        return self.problem.world_size

    @property
    def layer_shapes(self) -> tuple[tuple[int, int], ...]:
        """(out_features, in_features) of each Linear layer, input to output."""
        sizes = self.problem.layer_sizes
        return tuple((sizes[i + 1], sizes[i]) for i in range(len(sizes) - 1))

    @property
    def num_layers(self) -> int:
        return len(self.layer_shapes)

    def layer_numel(self, layer: int) -> int:
        """Parameters of one layer: its weight's out * in and its bias's out."""
        out_features, in_features = self.layer_shapes[layer]
        return out_features * in_features + out_features

    def shard_numel(self, layer: int) -> int:
        """S = ceil(numel / N): the numbers of one layer each rank holds (padding included)."""
        return math.ceil(self.layer_numel(layer) / self.world_size)

    def start_shard(self, rank: int, layer: int) -> torch.Tensor:
        """Rank ``rank``'s shard of layer ``layer``'s starting weights (rank 0's model), S
        float64 numbers; inside a rank, its own only."""
        if self._start_shards is not None:  # a rank's part: its own shards, nothing else
            own, shards = self._start_shards
            if rank != own:
                raise ForeignShardError(
                    f"rank {own} asked for rank {rank}'s shard of layer {layer}: a rank holds "
                    f"only its own data. {_OWN_SHARD_ONLY}"
                )
            return shards[layer].clone()
        refuse_other_rank(rank, f"shard of layer {layer}", _OWN_SHARD_ONLY, self.problem._home_pid)
        start = _build_model(self.problem, 0)  # rank 0's model: the starting weights
        padded = self.padded(layer, self.layer_vectors(start)[layer])
        size = self.shard_numel(layer)
        return padded[rank * size : (rank + 1) * size].clone()

    def full_buffer(self, layer: int) -> torch.Tensor:
        """A zero float64 vector of N * S numbers to gather layer ``layer`` into; the bench
        counts it (and every view of it) as full weights while it is alive."""
        buffer = torch.zeros(self.world_size * self.shard_numel(layer), dtype=torch.float64)
        if self._hand_out is not None:
            self._hand_out(buffer, layer)
        return buffer

    # The layout, for the bench itself and for the checks outside the ranks.

    def layer_vectors(self, model_or_weights: nn.Module | list) -> list[torch.Tensor]:
        """Each layer's weight and bias flattened into one float64 vector (unpadded)."""
        tensors = (
            list(model_or_weights.parameters())
            if isinstance(model_or_weights, nn.Module)
            else list(model_or_weights)
        )
        return [flat(tensors[2 * i : 2 * i + 2]).detach() for i in range(self.num_layers)]

    def padded(self, layer: int, vector: torch.Tensor) -> torch.Tensor:
        """A layer's flat vector padded with zeros to N * S numbers."""
        out = torch.zeros(self.world_size * self.shard_numel(layer), dtype=torch.float64)
        out[: self.layer_numel(layer)] = vector.reshape(-1)
        return out

    def padded_param_bytes(self) -> int:
        """Bytes of all layers' gathered buffers together: the float64 parameters, padded."""
        return 8 * self.world_size * sum(self.shard_numel(i) for i in range(self.num_layers))

    def largest_layer_bytes(self) -> int:
        """Bytes of the largest layer's gathered buffer."""
        return 8 * self.world_size * max(self.shard_numel(i) for i in range(self.num_layers))

    def layer_buffer_bytes(self) -> tuple[int, ...]:
        """Bytes of each layer's gathered buffer (N * S float64 numbers)."""
        return tuple(8 * self.world_size * self.shard_numel(i) for i in range(self.num_layers))


@dataclass
class BenchRun:
    """One rank's run on an :class:`FsdpBench`: what it returned, what it sent, what it held."""

    value: Any  # what the rank code returned
    log: Recording  # its collectives, with what they carried
    peak_full_bytes: int  # most bytes of full weights alive at once (each layer once)
    peak_layers: tuple[int, ...]  # the layers whose full weights were alive at that peak
    buffers: int  # full buffers the bench handed out
    gathers_into_buffers: int  # all-gathers whose output was a buffer of the bench
    gathers_elsewhere: int  # all-gathers into a tensor the bench did not hand out
    copies: int = 0  # copies of full weights the rank code made (each counted as its layer)


class _OnBench:
    """``fn`` run on the bench under the recorder; returns a :class:`BenchRun`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, rank: int, world_size: int, bench: FsdpBench, *args: Any) -> BenchRun:
        meter = full_weight_meter(bench.layer_buffer_bytes())
        bench._hand_out = meter.hand_out
        with (
            _gather_outputs(meter) as outputs,
            record.communication(payloads=True) as log,
            _counting_copies(meter),
        ):
            value = self.fn(rank, world_size, bench, *args)
        seen = meter.report()
        return BenchRun(
            value, log, seen.peak_bytes, seen.peak_layers, seen.handed_out, *outputs, seen.copies
        )


# Operators that compute with a layer's weights rather than copy them: their outputs are
# activations and gradients, never counted as the layer's weights.
_COMPUTE_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv", "dot", "vdot"}
)
# Operators that take a tensor for its shape only: nothing of its contents is in the output.
_SHAPE_ONLY_OPS = frozenset(
    {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
     "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided",
     "empty_strided"}
)  # fmt: skip
# Operators whose output holds whole inputs side by side: a copy if any input is counted.
_JOINING_OPS = frozenset({"cat", "stack", "hstack", "vstack", "concat", "concatenate"})


@contextlib.contextmanager
def _counting_copies(meter: Meter) -> Iterator[None]:
    """While open, every new storage an operator fills from a counted one (full weights, or
    a copy of them) counts as that layer's full weights too: ``clone``, ``copy_``, ``to``,
    ``contiguous``, elementwise arithmetic of the same shape, ``cat`` and ``stack``. Matrix
    products (the layer's own compute) do not. Seen by a ``TorchDispatchMode``, so every
    route through torch's operators counts, autograd's backward included."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class CountingCopies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__.rstrip("_")
            if name in _COMPUTE_OPS or name in _SHAPE_ONLY_OPS:
                return out
            inputs = [t for t in tree_flatten((args, kwargs or {}))[0] if torch.is_tensor(t)]
            counted = [(t, meter.layer_of(t)) for t in inputs]
            counted = [(t, layer) for t, layer in counted if layer is not None]
            if not counted:
                return out
            for result in tree_flatten(out)[0]:
                if not torch.is_tensor(result) or meter.layer_of(result) is not None:
                    continue  # not a tensor, or a view of a counted storage: already counted
                for source, layer in counted:
                    if name in _JOINING_OPS or result.shape == source.shape:
                        meter.note_copy(result, layer)
                        break
            return out

    with CountingCopies():
        yield


@contextlib.contextmanager
def _gather_outputs(meter: Meter) -> Iterator[list[int]]:
    """Count the all-gathers whose output is one of the meter's buffers, and the others:
    ``[into buffers, elsewhere]``, filled as the calls are made.

    Each all-gather writes into a scratch tensor that is then copied into the output:
    gloo's worker thread holds the tensor it wrote into for a moment after the call has
    returned, which would keep a buffer the rank code has already dropped alive, by timing.
    """
    counts = [0, 0]
    # torch 2.13's all_gather_single, where the deprecated all_gather_into_tensor ends too
    # (it calls this module's all_gather_single); before 2.13, the old name itself.
    name = "all_gather_single" if hasattr(c10d, "all_gather_single") else "all_gather_into_tensor"
    original = getattr(c10d, name)

    def counted(output_tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        counts[0 if meter.layer_of(output_tensor) is not None else 1] += 1
        scratch = torch.empty_like(output_tensor)
        work = original(scratch, *args, **kwargs)
        if work is not None:  # async_op=True: done before the copy; wait() again is free
            work.wait()
        output_tensor.copy_(scratch)
        return work

    # record.communication binds the arguments to the signature of what it wraps:
    # inspect.signature follows __wrapped__ to the original's.
    counted.__name__ = name
    counted.__wrapped__ = original  # type: ignore[attr-defined]
    patched = [m for m in (dist, c10d) if getattr(m, name, None) is original]
    for module in patched:
        setattr(module, name, counted)
    try:
        yield counts
    finally:
        for module in patched:
            setattr(module, name, original)


def run_on_bench(
    fn: Callable[..., Any], bench: FsdpBench, *args: Any, timeout: float = 60
) -> list[BenchRun]:
    """``fn(rank, world_size, bench.own_part(rank), *args)`` on the bench's ranks (each its
    own part, built here), each recorded (with payloads) and metered: one :class:`BenchRun`
    per rank, rank 0's first."""
    from distopt.engine.launcher import launch  # the launcher's ranks import this module

    # launch ships each rank its own part only (its rows, its start shards; no seed)
    return launch(_OnBench(fn), bench.world_size, bench, *args, timeout=timeout)


# --- FSDP2 measured -----------------------------------------------------------------------


@dataclass
class _Fsdp2Sampler:
    """What a TorchDispatchMode sees of FSDP2 (filled by :func:`_sampling`)."""

    calls: list[tuple[str, int]] = field(default_factory=list)  # (collective, bytes handed)
    unsharded: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    largest: dict[tuple[int, str], int] = field(default_factory=dict)  # most bytes of each
    in_flight: list[weakref.ref] = field(default_factory=list)  # all-gather outputs
    peak_param_bytes: int = 0  # unsharded parameters' storage, most at once
    peak_gathered_bytes: int = 0  # the same plus all-gather outputs still alive


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@contextlib.contextmanager
def _sampling(sampler: _Fsdp2Sampler) -> Iterator[None]:
    """After every operator: the bytes of full weights alive (see :func:`measure_fsdp2`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    c10d_ops = torch.ops.c10d
    gathers = {c10d_ops._allgather_base_.default: "all_gather"}
    reductions = {
        c10d_ops._reduce_scatter_base_.default: "reduce_scatter",
        c10d_ops.allreduce_.default: "all_reduce",
    }

    def sample() -> None:
        storages = {}
        for key, tensor in sampler.unsharded.items():
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            sampler.largest[key] = max(sampler.largest.get(key, 0), storage.nbytes())
        params = sum(storages.values())
        buffers = sum(_nbytes(r()) for r in sampler.in_flight if r() is not None)
        sampler.peak_param_bytes = max(sampler.peak_param_bytes, params)
        sampler.peak_gathered_bytes = max(sampler.peak_gathered_bytes, params + buffers)

    class Sampling(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if func in gathers:  # (output, input, group, async_op, timeout)
                sampler.calls.append((gathers[func], _nbytes(args[1])))
                sampler.in_flight.append(weakref.ref(args[0]))
                # Gathered into a scratch tensor, waited for and copied: gloo's worker thread
                # holds the tensor it wrote into for a moment after the work completes,
                # which would keep FSDP2's buffer alive longer than FSDP2 does, by timing.
                scratch = torch.empty_like(args[0])
                _, work = func(scratch, *args[1:], **(kwargs or {}))
                work.wait()
                args[0].copy_(scratch)
                sample()
                return args[0], work
            if func in reductions:
                handed = args[1] if func is c10d_ops._reduce_scatter_base_.default else args[0]
                size = (
                    sum(_nbytes(t) for t in handed) if isinstance(handed, list) else _nbytes(handed)
                )
                sampler.calls.append((reductions[func], size))
            out = func(*args, **(kwargs or {}))
            sample()
            return out

    with Sampling():
        yield


def measure_fsdp2(rank: int, world_size: int, problem: ShardedProblem) -> dict[bool, dict]:
    """FSDP2 on the bench's model: ``problem.steps`` SGD steps, with ``reshard_after_forward``
    True and then False; run it through ``distopt.launch``.

    Every rank starts from rank 0's model (broadcast from rank 0), applies ``fully_shard`` to
    each Linear and then to the whole MLP (the root, which owns no parameter), and trains on
    its own shard of each global batch. FSDP2 averages the reduce-scattered gradients over
    the ranks, so each rank's loss is its share of the global mean times N.

    While it trains, a ``TorchDispatchMode`` sees every operator. It logs each collective
    (c10d's all-gather, reduce-scatter and all-reduce) with the bytes this rank hands over,
    and after every operator adds up the full weights alive: the storage of the layers'
    unsharded parameters (FSDP2 frees it by resizing it to zero when it reshards) and the
    all-gather outputs still referenced (FSDP2 copies each out into the parameters; a
    prefetched one waits until its layer runs). ``CommDebugMode`` counts the same
    collectives independently.

    Returns ``{reshard_after_forward: report}`` for True and False; each report::

        {
            "calls": [(name, bytes), ...],     # every collective of the run, in order
            "comm_debug_counts": {name: int},  # CommDebugMode's counts of c10d ops
            "peak_param_bytes": int,           # unsharded parameters alive at once, at most
            "peak_gathered_bytes": int,        # ... plus all-gather buffers alive
            "layer_param_bytes": [int, ...],   # each layer's unsharded storage (padded rows)
            "weights": [tensor, ...],          # the full parameters after the run
        }
    """
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized() or dist.get_world_size() != world_size:
        raise RuntimeError("measure_fsdp2(rank, world_size, problem) runs under distopt.launch")
    mesh = init_device_mesh("cpu", (world_size,))
    return {
        reshard: _fsdp2_run(rank, world_size, problem, mesh, reshard) for reshard in (True, False)
    }


def _fsdp2_run(
    rank: int, world_size: int, problem: ShardedProblem, mesh: Any, reshard: bool
) -> dict[str, Any]:
    """One FSDP2 training run of :func:`measure_fsdp2`, measured: its report."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    # rank 0's model on every rank (FSDP2 shards it): each rank holds only its own starting
    # weights (launch ships it its part), so rank 0's reach the others by a broadcast
    model = problem.new_model(rank)
    with torch.no_grad():
        for param in model.parameters():
            dist.broadcast(param, src=0)
    layers = [m for m in model if isinstance(m, nn.Linear)]
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    sampler = _Fsdp2Sampler()

    def capture(module: nn.Module, _args: Any) -> None:
        # Registered after FSDP2's own pre-forward hook: the layer is unsharded now, and its
        # parameters are the unsharded tensors (a DTensor shard otherwise).
        for name, param in module.named_parameters(recurse=False):
            if not isinstance(param, DTensor):
                sampler.unsharded[(id(module), name)] = param

    for layer in layers:
        layer.register_forward_pre_hook(capture)
    optimizer = torch.optim.SGD(model.parameters(), lr=problem.lr)
    comm_debug_counts: dict[str, int] = {}
    for step in range(problem.steps):
        # A fresh CommDebugMode each step: its module tracker loses its place in a second
        # forward pass under the same context (torch 2.13).
        with CommDebugMode() as comm_debug, _sampling(sampler):
            x, y = problem.batch(step, rank)
            optimizer.zero_grad()
            loss = problem.loss_sum(model, x, y) * world_size / problem.global_batch
            loss.backward()
            optimizer.step()
        for op, count in comm_debug.get_comm_counts().items():
            name = str(op).rsplit(".", 1)[-1]
            comm_debug_counts[name] = comm_debug_counts.get(name, 0) + int(count)
    layer_bytes = [
        sum(b for (key, _), b in sampler.largest.items() if key == id(layer)) for layer in layers
    ]
    # full_tensor() all-gathers: after the measured steps, on every rank, in order.
    weights = [
        (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for p in model.parameters()
    ]
    return {
        "calls": sampler.calls,
        "comm_debug_counts": comm_debug_counts,
        "peak_param_bytes": sampler.peak_param_bytes,
        "peak_gathered_bytes": sampler.peak_gathered_bytes,
        "layer_param_bytes": layer_bytes,
        "weights": weights,
    }
