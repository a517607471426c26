"""Choosing a 3D-parallel layout: enumerate, keep what fits in memory, rank by step time.

A layout splits ``num_gpus`` GPUs into tensor x pipeline x data parallel groups
(t x p x d = num_gpus), picks a ZeRO stage for the data-parallel dimension, a micro-batch
size and whether to recompute activations. Tensor-parallel ranks are placed together in a
server first, then pipeline stages, then data-parallel replicas (Narayanan et al. 2021,
Section 3.3: keep the most communication-hungry dimension on the fastest links).

The memory model uses :mod:`distopt.costs.memory` (training state, Korthikanti et al. 2022
activations); the time model uses :mod:`distopt.costs.transformer` (FLOPs),
:mod:`distopt.costs.bubbles` and :mod:`distopt.costs.comm` (ring collectives). Tensor and
pipeline traffic is not overlapped with compute (pessimistic, but it ranks layouts by what
they communicate); data-parallel traffic hides behind the compute of one micro-batch where
the schedule allows it (:func:`data_parallel_seconds`).

With m micro-batches per step, only the last micro-batch's backward is left to hide the
gradient all-reduce, and ZeRO-2/3 communicate for every micro-batch
(:func:`distopt.costs.comm.sharded_step_bytes_sent`). ZeRO stages 2 and 3 are not combined
with pipeline parallelism: DeepSpeed refuses it, since a pipeline runs many micro-batches
per step and each would re-send (stage 2) or re-gather (stage 3) its stage's gradients and
weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from distopt.costs import bubbles, comm, memory, transformer

__all__ = [
    "ClusterSpec",
    "Layout",
    "ModelSpec",
    "data_parallel_seconds",
    "layouts",
    "memory_per_gpu",
    "plan",
    "step_time_breakdown",
]

MICRO_BATCHES = (1, 2, 4, 8)  # micro-batch sizes (sequences) the planner tries
BYTES_PER_VALUE = 2  # 16-bit activations and 16-bit weights/gradients on the wire


@dataclass(frozen=True)
class ModelSpec:
    """A GPT-style transformer."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int  # tokens per sequence

    @property
    def num_params(self) -> float:
        return transformer.param_count(self.layers, self.hidden, self.vocab, self.seq_len)


@dataclass(frozen=True)
class ClusterSpec:
    """Identical servers of identical GPUs."""

    num_gpus: int
    gpus_per_server: int
    memory_bytes: float  # per GPU
    intra_bandwidth: float  # bytes/s per GPU inside a server (NVLink class)
    inter_bandwidth: float  # bytes/s per GPU between servers (InfiniBand class)
    flops_per_s: float  # sustained 16-bit FLOP/s per GPU


@dataclass(frozen=True)
class Layout:
    """One way to run the model on the cluster."""

    tensor: int  # tensor-parallel degree t
    pipeline: int  # pipeline stages p
    data: int  # data-parallel replicas d
    zero_stage: int  # ZeRO stage over the d replicas
    micro_batch: int  # sequences per micro-batch
    recompute: bool  # full activation recomputation

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches per pipeline per step: global_batch / (d x micro_batch)."""
        return global_batch // (self.data * self.micro_batch)


def layouts(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch: int,
    *,
    zero_stages: tuple[int, ...] = memory.ZERO_STAGES,
    tensor_in_server: bool = False,
) -> Iterator[Layout]:
    """Every layout with t | heads, p | layers, t p d = num_gpus and d b | global_batch, and
    ZeRO stage 2 or 3 only without pipeline parallelism (p = 1). With ``tensor_in_server``,
    also t | gpus_per_server: every tensor-parallel group inside one server."""
    n = cluster.num_gpus
    divisors = [k for k in range(1, n + 1) if n % k == 0]
    for t, p in itertools.product(divisors, divisors):
        if n % (t * p) or model.heads % t or model.layers % p:
            continue
        if tensor_in_server and cluster.gpus_per_server % t:
            continue
        d = n // (t * p)
        for stage, b, recompute in itertools.product(zero_stages, MICRO_BATCHES, (False, True)):
            if global_batch % (d * b) == 0 and (stage < 2 or p == 1):
                yield Layout(t, p, d, stage, b, recompute)


def memory_per_gpu(model: ModelSpec, layout: Layout, global_batch: int) -> dict[str, float]:
    """Peak bytes on the busiest GPU (the first pipeline stage), by part.

    * ``state``: 16 bytes per parameter of the GPU's 1/(t p) of the model, ZeRO-sharded
      over d (``memory.training_state_bytes``);
    * ``gathered``: under ZeRO-3, one layer's full weights and gradients (1/t of them) in use;
    * ``activations``: ``memory.activation_bytes_per_layer`` (sequence parallel when t > 1)
      for the stage's layers/p layers, times the micro-batches in flight on the first stage
      under 1F1B, min(p, m); with recomputation, plus one layer's full working set.
    """
    t, p, d = layout.tensor, layout.pipeline, layout.data
    s, h, a = model.seq_len, model.hidden, model.heads
    params = model.num_params / (t * p)
    state = memory.training_state_bytes(params, zero_stage=layout.zero_stage, world_size=d)
    layer_params = 12 * h**2 / t
    gathered = layer_params * 4 if layout.zero_stage == 3 else 0.0

    def per_layer(recompute: str) -> float:
        return memory.activation_bytes_per_layer(
            s,
            layout.micro_batch,
            h,
            a,
            tensor_parallel=t,
            sequence_parallel=t > 1,
            recompute=recompute,
        )

    in_flight = min(p, layout.micro_batches(global_batch))
    stored = per_layer("full" if layout.recompute else "none") * model.layers / p * in_flight
    working = per_layer("none") if layout.recompute else 0.0
    return {"state": state, "gathered": gathered, "activations": stored + working}


def _bandwidth(cluster: ClusterSpec, group_span: int) -> float:
    """Link speed of a group whose members lie within ``group_span`` consecutive GPUs."""
    if group_span <= cluster.gpus_per_server:
        return cluster.intra_bandwidth
    return cluster.inter_bandwidth


def _data_seconds(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, global_batch: int
) -> float:
    """Seconds of data-parallel traffic per step, overlap not counted."""
    t, p, d = layout.tensor, layout.pipeline, layout.data
    sent = comm.sharded_step_bytes_sent(
        model.num_params / (t * p),
        zero_stage=layout.zero_stage,
        world_size=d,
        micro_batches=layout.micro_batches(global_batch),
    )
    return sent / _bandwidth(cluster, t * p * d)


def data_parallel_seconds(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, global_batch: int, compute: float
) -> float:
    """Seconds of data-parallel communication per step left exposed by the compute.

    With ``gather`` and ``scatter`` the seconds of one all-gather of the GPU's 16-bit weights
    and one reduce-scatter of its 16-bit gradients over the d replicas, and ``forward`` and
    ``backward`` one micro-batch's share of ``compute`` (1/3 and 2/3 of compute / m):

    * stage 0: the all-reduce (``2 * scatter``) hides behind the last micro-batch's backward;
    * stage 1: the reduce-scatter behind the last backward, the gather of the updated weights
      behind the next step's first forward;
    * stage 2: a reduce-scatter behind *every* micro-batch's backward (m of them), one gather;
    * stage 3: for every micro-batch, the forward's gather behind its forward and the
      backward's gather and reduce-scatter behind its backward (prefetching, optimistic).
    """
    t, p, d = layout.tensor, layout.pipeline, layout.data
    m = layout.micro_batches(global_batch)
    link = _bandwidth(cluster, t * p * d)
    shard_bytes = model.num_params / (t * p) * BYTES_PER_VALUE
    gather = comm.allgather_bytes_sent(shard_bytes, d) / link
    scatter = comm.reduce_scatter_bytes_sent(shard_bytes, d) / link
    forward, backward = compute / (3 * m), 2 * compute / (3 * m)

    def exposed(seconds: float, hidden_by: float) -> float:
        return max(0.0, seconds - hidden_by)

    if layout.zero_stage == 0:
        return exposed(2 * scatter, backward)
    if layout.zero_stage == 1:
        return exposed(scatter, backward) + exposed(gather, forward)
    if layout.zero_stage == 2:
        return m * exposed(scatter, backward) + exposed(gather, forward)
    return m * (exposed(gather, forward) + exposed(gather + scatter, backward))


def step_time_breakdown(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, global_batch: int
) -> dict[str, float]:
    """Seconds per training step, by part (no overlap of communication and compute).

    * ``compute``: ``transformer.training_flops`` of the global batch / (num_gpus x FLOP/s);
    * ``bubble``: compute x ``bubbles.bubble_overhead(p, m)`` (1F1B);
    * ``tensor``: per layer of a stage and per micro-batch, 4 ring all-reduces (6 with
      recomputation) of b s h 16-bit values over t GPUs, at the intra-server speed if t
      GPUs fit in a server;
    * ``pipeline``: per micro-batch, an activation and its gradient (b s h values each) sent
      to the neighbour stage, at the speed of links spanning t p GPUs;
    * ``data``: :func:`data_parallel_seconds`: the ZeRO stage's collectives of the GPU's
      1/(t p) of the parameters over the d replicas, at the speed of links spanning t p d
      GPUs, less what one micro-batch's compute hides (as DDP's gradient buckets do, section
      01).
    """
    t, p = layout.tensor, layout.pipeline
    m = layout.micro_batches(global_batch)
    b, s, h = layout.micro_batch, model.seq_len, model.hidden
    flops = transformer.training_flops(
        global_batch, s, model.layers, h, model.vocab, recompute=layout.recompute
    )
    compute = flops / (cluster.num_gpus * cluster.flops_per_s)
    bubble = compute * bubbles.bubble_overhead(p, m)
    message = b * s * h * BYTES_PER_VALUE
    all_reduces = (6 if layout.recompute else 4) * model.layers // p * m
    tensor = all_reduces * comm.allreduce_time(message, t, bandwidth=_bandwidth(cluster, t))
    pipe = 2 * m * message / _bandwidth(cluster, t * p) if p > 1 else 0.0
    data = data_parallel_seconds(model, cluster, layout, global_batch, compute)
    return {"compute": compute, "bubble": bubble, "tensor": tensor, "pipeline": pipe, "data": data}


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch: int,
    *,
    zero_stages: tuple[int, ...] = memory.ZERO_STAGES,
    tensor_in_server: bool = False,
) -> list[tuple[Layout, float, float]]:
    """Layouts that fit in memory as (layout, peak bytes, step seconds), fastest first.

    ``tensor_in_server`` keeps only tensor-parallel groups inside one server (:func:`layouts`).

    Ties in time are broken by less data-parallel traffic (even when hidden, it competes
    with other traffic), then by lower memory, then by the layout's fields, so that the
    order is deterministic.
    """
    ranked = []
    options = layouts(
        model, cluster, global_batch, zero_stages=zero_stages, tensor_in_server=tensor_in_server
    )
    for layout in options:
        peak = sum(memory_per_gpu(model, layout, global_batch).values())
        if peak > cluster.memory_bytes:
            continue
        seconds = sum(step_time_breakdown(model, cluster, layout, global_batch).values())
        traffic = _data_seconds(model, cluster, layout, global_batch)
        ranked.append((round(seconds, 9), round(traffic, 9), peak, layout))
    ranked.sort(key=lambda row: (*row[:3], tuple(vars(row[3]).values())))
    return [(layout, peak, seconds) for seconds, _, peak, layout in ranked]
