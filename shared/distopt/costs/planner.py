"""Choosing a 4D-parallel layout: enumerate, keep what fits in memory, rank by step time.

A layout splits ``num_gpus`` GPUs into tensor x context x pipeline x data parallel groups
(t c p d = num_gpus), picks a ZeRO stage for the data-parallel dimension, a micro-batch size
and whether to recompute activations; a mixture-of-experts model also shards its experts over
e of the d data-parallel replicas (e | d and e | the model's experts: expert parallelism lives
inside the data-parallel group, as in Megatron-LM, so it is a factor of d, not of the GPU count;
searched with ``expert_degrees=``). Tensor-parallel ranks are placed together
in a server first, then context-parallel ranks, then pipeline stages, then data-parallel
replicas (Narayanan et al. 2021, Section 3.3: keep the most communication-hungry dimension on
the fastest links). "3D" is t x p x d; the fourth axis is context parallelism (Llama 3's
"4D parallelism": tensor, context, pipeline, data).

Traffic comes first, in bytes: :func:`traffic_bytes` counts what one GPU sends per step for
each kind of parallelism; :func:`step_time_breakdown` turns the bytes into seconds with the
bandwidth of the links each group spans. Tensor, context, expert and pipeline traffic is not
overlapped with compute (pessimistic, but it ranks layouts by what they communicate);
data-parallel traffic hides behind the compute of one micro-batch where the schedule allows
it (:func:`data_parallel_seconds`).

With m micro-batches per step, only the last micro-batch's backward is left to hide the
gradient all-reduce, and ZeRO-2/3 communicate for every micro-batch
(:func:`distopt.costs.comm.sharded_step_bytes_sent`). ZeRO stages 2 and 3 are not combined
with pipeline parallelism: DeepSpeed refuses it, since a pipeline runs many micro-batches
per step and each would re-send (stage 2) or re-gather (stage 3) its stage's gradients and
weights.

The memory of a layout is section 02's model (:func:`memory_per_gpu`); :func:`plan` keeps the
layouts that fit in the usable part of a GPU's memory and ranks them by step time, ties broken
by less traffic, then by less memory (:func:`rank_key`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from distopt.costs import bubbles, comm, memory
from distopt.costs.memory import USABLE_FRACTION
from distopt.costs.shape import Layout, TransformerShape

ModelSpec = TransformerShape  # the planner's name for the one shape type

__all__ = [
    "H100_PEAK_FLOPS",
    "ClusterSpec",
    "Layout",
    "ModelSpec",
    "USABLE_FRACTION",
    "check_expert_degrees",
    "data_parallel_seconds",
    "group_spans",
    "layouts",
    "memory_per_gpu",
    "mfu",
    "plan",
    "rank_key",
    "step_time_breakdown",
    "traffic_bytes",
    "training_flops",
]

MICRO_BATCHES = (1, 2, 4, 8)  # micro-batch sizes (sequences) the planner tries
BYTES_PER_VALUE = 2  # 16-bit activations and 16-bit weights/gradients on the wire
H100_PEAK_FLOPS = 989e12  # dense BF16 FLOP/s of an H100 SXM (NVIDIA's datasheet, no sparsity)


@dataclass(frozen=True)
class ClusterSpec:
    """Identical servers of identical GPUs."""

    num_gpus: int
    gpus_per_server: int
    memory_bytes: float  # per GPU
    intra_bandwidth: float  # bytes/s per GPU inside a server (NVLink class)
    inter_bandwidth: float  # bytes/s per GPU between servers (InfiniBand class)
    flops_per_s: float  # sustained 16-bit FLOP/s per GPU (what the time model assumes)
    peak_flops_per_s: float = H100_PEAK_FLOPS  # the datasheet's, which MFU is measured against


def _recomputes(layout: Layout) -> bool:
    """Full recomputation: the forward pass runs twice (its collectives too)."""
    return layout.recompute == "full"


def group_spans(layout: Layout) -> dict[str, int]:
    """Consecutive GPUs each kind of group spans, with tensor ranks placed innermost, then
    context, then pipeline, then data (expert groups: e consecutive data replicas)."""
    t, c, p, d = layout.tensor, layout.context, layout.pipeline, layout.data
    return {
        "tensor": t,
        "context": t * c,
        "pipeline": t * c * p,
        "expert": t * c * p * layout.expert,
        "data": t * c * p * d,
    }


def _bandwidth(cluster: ClusterSpec, group_span: int) -> float:
    """Link speed of a group whose members lie within ``group_span`` consecutive GPUs."""
    if group_span <= cluster.gpus_per_server:
        return cluster.intra_bandwidth
    return cluster.inter_bandwidth


def layouts(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch: int,
    *,
    zero_stages: tuple[int, ...] = memory.ZERO_STAGES,
    tensor_in_server: bool = False,
    context_degrees: tuple[int, ...] = (1,),
    expert_degrees: tuple[int, ...] = (1,),
) -> Iterator[Layout]:
    """Every distinct layout with t | heads, c | seq_len, p | layers, t c p d = num_gpus,
    e | d and d b | global_batch, and ZeRO stage 2 or 3 only without pipeline parallelism
    (p = 1).

    ZeRO stages above 0 only with a data-parallel group to shard over (d c > 1): on one replica
    they are ZeRO-0 under another name, and listing both would show the same layout twice.
    With ``tensor_in_server``, also t | gpus_per_server: every tensor-parallel group inside one
    server. ``context_degrees`` are the c to try (by default 1: the 3D planner);
    ``expert_degrees`` the e (by default 1: the experts replicated like the rest of the
    model). Each e must divide the model's experts (:func:`check_expert_degrees`); a layout
    takes an e only where it also divides d, the data-parallel replicas the experts are
    sharded over (:func:`group_spans`: e consecutive replicas).
    """
    check_expert_degrees(model, expert_degrees)
    for stage in zero_stages:
        if stage not in memory.ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {memory.ZERO_STAGES}, got {stage!r}")
    n = cluster.num_gpus
    divisors = [k for k in range(1, n + 1) if n % k == 0]
    for t, c, p in itertools.product(divisors, context_degrees, divisors):
        if n % (t * c * p) or model.heads % t or model.layers % p or model.seq_len % c:
            continue
        if tensor_in_server and cluster.gpus_per_server % t:
            continue
        d = n // (t * c * p)
        choices = itertools.product(expert_degrees, zero_stages, MICRO_BATCHES, ("none", "full"))
        for e, stage, b, recompute in choices:
            if d % e or global_batch % (d * b) or (stage >= 2 and p > 1) or (stage and d * c == 1):
                continue
            yield Layout(t, p, d, stage, b, recompute, context=c, expert=e)


def check_expert_degrees(model: ModelSpec, expert_degrees: tuple[int, ...]) -> None:
    """Refuse expert degrees no layout of ``model`` can take, before any search: an e that is
    not a whole number >= 1, an e > 1 for a dense model (no experts to shard: asking for it is
    a mistake, not a search with nothing found), an e > 1 for a model given by a stated
    parameter count (the memory model cannot tell its experts from the rest), and an e that
    does not divide the model's experts (each device must hold the same number of them). An e
    that divides no layout's d is not an error: those layouts are skipped, as a c that divides
    no sequence is."""
    if not expert_degrees:
        raise ValueError("expert_degrees must name at least one degree, e.g. (1,)")
    for e in expert_degrees:
        if isinstance(e, bool) or int(e) != e or e < 1:
            raise ValueError(f"expert degrees must be whole numbers >= 1, got {e!r}")
        if e > 1 and model.experts < 2:
            raise ValueError(
                f"expert degree {e} needs a mixture of experts; this model is dense "
                f"(experts={model.experts}): search it with expert_degrees=(1,)"
            )
        if e > 1 and model.params is not None:
            raise ValueError(
                f"expert degree {e}: a stated parameter count ({model.params:.3g}) has no "
                f"experts' share to shard; describe the model by its shape (params=None)"
            )
        if e > 1 and model.experts % e:
            raise ValueError(
                f"expert degree {e} must divide the model's {model.experts} experts "
                f"(each of the e devices holds experts / e of them)"
            )


def memory_per_gpu(model: ModelSpec, layout: Layout, global_batch: int) -> dict[str, float]:
    """Peak bytes on the busiest GPU by part: section 02's model,
    :func:`distopt.costs.memory.gpu_memory`, of the first pipeline stage (most micro-batches in
    flight) or the last (the logits), whichever holds more.

    * ``state``: weights, gradients and optimizer state of the GPU's 1/(t p) of the model,
      ZeRO-sharded over the d c GPUs that hold the same weights;
    * ``gathered``: under ZeRO-3, one layer's full weights and gradients (1/t of them) in use;
    * ``activations``: FlashAttention-size (no s^2 scores stored; Megatron sequence parallelism
      when t > 1) for s/c tokens, the stage's layers and the micro-batches in flight under
      1F1B; with full recomputation each layer keeps its input and the layer being processed
      holds its full set;
    * ``logits``: on the last stage, float32 logits of s/c tokens over 1/t of the vocabulary.
    """
    parts = memory.gpu_memory(model, layout, micro_batches=layout.micro_batches(global_batch))
    return {
        "state": parts["weights"] + parts["gradients"] + parts["optimizer"],
        "gathered": parts["gathered"],
        "activations": parts["activations"],
        "logits": parts["logits"],
    }


def _weight_shards(model: ModelSpec, layout: Layout) -> list[tuple[float, int]]:
    """(parameters on one GPU, GPUs holding the same ones) for the dense part of the model and,
    in a mixture of experts, for the experts (as :func:`distopt.costs.memory.gpu_memory`)."""
    t, p, e = layout.tensor, layout.pipeline, layout.expert
    group = layout.data * layout.context
    experts = model.expert_params if model.params is None else 0.0
    shards = [((model.num_params - experts) / (t * p), group)]
    if experts:
        shards.append((experts / (t * p * e), group // e))
    return shards


def traffic_bytes(model: ModelSpec, layout: Layout, global_batch: int) -> dict[str, float]:
    """Bytes one GPU sends per training step, by kind of parallelism.

    With m micro-batches of b sequences, L/p layers on the GPU's stage and s/c tokens of each
    sequence on the GPU (16-bit values; full recomputation runs the forward, and its
    collectives, twice):

    * ``tensor``: per layer and micro-batch, 4 all-reduces (6 with recomputation) of
      b (s/c) h values over t GPUs, each a ring's 2(t-1)/t of the message (as a reduce-scatter
      and an all-gather under sequence parallelism: the same bytes);
    * ``context``: ring attention: per layer and micro-batch, forward c-1 hops of the keys and
      values, 2 b (s/c) h (kv_heads/heads) / t values each (t ranks split the heads); the
      backward sends them round again and their gradients back, twice the forward's bytes
      (with recomputation another forward's);
    * ``expert`` (a model with ``experts`` > 1 and expert degree e > 1): per MoE layer and
      micro-batch 4 all-to-alls (dispatch and combine, forward and backward; 6 with
      recomputation), each of the top_k copies of the GPU's b s/(c t) tokens that go to one of
      the other e-1 devices, (e-1)/e of them under an even router, h values each;
    * ``pipeline`` (p > 1): per micro-batch an activation forward and its gradient back,
      b (s/c) h values each;
    * ``data``: :func:`distopt.costs.comm.sharded_step_bytes_sent` of the GPU's 1/(t p) of the
      parameters, for its ZeRO stage over the d c GPUs that hold the same weights (a mixture's
      experts: 1/(t p e) of them over d c / e GPUs, as :func:`distopt.costs.memory.gpu_memory`
      shards them).
    """
    t, c, p, e = layout.tensor, layout.context, layout.pipeline, layout.expert
    m = layout.micro_batches(global_batch)
    b, h, tokens = layout.micro_batch, model.hidden, model.seq_len // c
    passes = 4 if _recomputes(layout) else 3  # forward (again) + backward = 2 forwards
    layers = model.layers // p
    message = b * tokens * h * BYTES_PER_VALUE
    tensor = 2 * (passes - 1) * layers * m * comm.ring_allreduce_bytes_sent(message, t)
    kv_values = 2 * b * tokens * h * model.kv_ratio / t
    context = passes * layers * m * (c - 1) * kv_values * BYTES_PER_VALUE
    expert = 0.0
    if model.experts > 1 and e > 1:
        off_device = model.top_k * b * tokens / t * (e - 1) / e * h * BYTES_PER_VALUE
        expert = 2 * (passes - 1) * layers * m * off_device
    pipeline = 2 * m * message if p > 1 else 0.0
    data = sum(
        comm.sharded_step_bytes_sent(
            params, zero_stage=layout.zero_stage, world_size=group, micro_batches=m
        )
        for params, group in _weight_shards(model, layout)
    )
    return {"tensor": tensor, "context": context, "expert": expert, "pipeline": pipeline,
            "data": data}  # fmt: skip


def data_parallel_seconds(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, global_batch: int, compute: float
) -> float:
    """Seconds of data-parallel communication per step left exposed by the compute.

    With ``gather`` and ``scatter`` the seconds of one all-gather of the GPU's 16-bit weights
    and one reduce-scatter of its 16-bit gradients over the d c GPUs holding the same weights,
    and ``forward`` and ``backward`` one micro-batch's share of ``compute`` (1/3 and 2/3 of
    compute / m):

    * stage 0: the all-reduce (``2 * scatter``) hides behind the last micro-batch's backward;
    * stage 1: the reduce-scatter behind the last backward, the gather of the updated weights
      behind the next step's first forward;
    * stage 2: a reduce-scatter behind *every* micro-batch's backward (m of them), one gather;
    * stage 3: for every micro-batch, the forward's gather behind its forward and the
      backward's gather and reduce-scatter behind its backward (prefetching, optimistic).
    """
    m = layout.micro_batches(global_batch)
    link = _bandwidth(cluster, group_spans(layout)["data"])
    shards = _weight_shards(model, layout)
    gather = sum(comm.allgather_bytes_sent(n * BYTES_PER_VALUE, g) for n, g in shards) / link
    scatter = sum(comm.reduce_scatter_bytes_sent(n * BYTES_PER_VALUE, g) for n, g in shards) / link
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


def training_flops(model: ModelSpec, global_batch: int, *, recompute: bool = False) -> float:
    """FLOPs of one training step on ``global_batch`` sequences of any shape: per layer and
    token, 2 FLOPs per weight a token passes through (attention, and top_k of the experts'
    MLPs in a mixture), plus 4 s h for the attention scores; 6 s h V for the logits; the
    layers run 3 forward passes' worth (4 with recomputation). For a GPT-style shape this is
    :func:`distopt.costs.transformer.training_flops` exactly (Narayanan et al. 2021, eq. 3)."""
    b, s, h = global_batch, model.seq_len, model.hidden
    active = model.attention_params + max(model.top_k if model.experts else 1, 1) * model.mlp_params
    passes = 4 if recompute else 3
    layer_flops = passes * model.layers * (2 * b * s * active + 4 * b * s * s * h)
    return layer_flops + 6 * b * s * h * model.vocab


def step_time_breakdown(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, global_batch: int
) -> dict[str, float]:
    """Seconds per training step, by part (no overlap of communication and compute, except
    the data-parallel part's).

    * ``compute``: :func:`training_flops` of the global batch / (num_gpus x FLOP/s);
    * ``bubble``: compute x ``bubbles.bubble_overhead(p, m)`` (1F1B);
    * ``tensor``, ``context``, ``expert``, ``pipeline``: :func:`traffic_bytes` of that kind
      over the bandwidth of the links its group spans (:func:`group_spans`: intra-server if the
      group fits in a server);
    * ``data``: :func:`data_parallel_seconds`: the ZeRO stage's collectives less what one
      micro-batch's compute hides (as DDP's gradient buckets do, section 01).
    """
    m = layout.micro_batches(global_batch)
    flops = training_flops(model, global_batch, recompute=_recomputes(layout))
    compute = flops / (cluster.num_gpus * cluster.flops_per_s)
    sent, spans = traffic_bytes(model, layout, global_batch), group_spans(layout)
    parts = {"compute": compute, "bubble": compute * bubbles.bubble_overhead(layout.pipeline, m)}
    for kind in ("tensor", "context", "expert", "pipeline"):
        parts[kind] = sent[kind] / _bandwidth(cluster, spans[kind])
    parts["data"] = data_parallel_seconds(model, cluster, layout, global_batch, compute)
    return parts


def mfu(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seconds: float) -> float:
    """Model FLOPs utilization: the model's FLOPs per step (no recomputation counted) over
    what the GPUs' datasheet peak (``peak_flops_per_s``) would do in ``seconds``.

    The time model runs at ``flops_per_s`` (sustained), so no layout can exceed
    flops_per_s / peak_flops_per_s (400 / 989 = 40 % on an H100).
    """
    flops = training_flops(model, global_batch)
    return flops / (seconds * cluster.num_gpus * cluster.peak_flops_per_s)


def rank_key(seconds: float, sent_bytes: float, peak_bytes: float) -> tuple[float, float, float]:
    """What the planner sorts by: step time first; among equally fast layouts (to 1 ns), the
    one that sends fewer bytes (even hidden, traffic competes with other jobs' and slows the
    compute it overlaps), then the one that holds less memory (headroom)."""
    return round(seconds, 9), round(sent_bytes), round(peak_bytes)


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch: int,
    *,
    zero_stages: tuple[int, ...] = memory.ZERO_STAGES,
    tensor_in_server: bool = False,
    context_degrees: tuple[int, ...] = (1,),
    expert_degrees: tuple[int, ...] = (1,),
    usable_fraction: float = USABLE_FRACTION,
) -> list[tuple[Layout, float, float]]:
    """Layouts that fit as (layout, peak bytes, step seconds), best first (:func:`rank_key`).

    A layout fits if :func:`memory_per_gpu` is at most ``usable_fraction`` of the GPU's
    memory. ``tensor_in_server``, ``context_degrees`` and ``expert_degrees`` as in
    :func:`layouts`. Layouts equal in all three keys are ordered by their fields, so that the
    order is deterministic.
    """
    if not 0 < usable_fraction <= 1:
        raise ValueError(f"usable_fraction must be in (0, 1], got {usable_fraction!r}")
    ranked = []
    options = layouts(
        model, cluster, global_batch, zero_stages=zero_stages,
        tensor_in_server=tensor_in_server, context_degrees=context_degrees,
        expert_degrees=expert_degrees,
    )  # fmt: skip
    for layout in options:
        peak = sum(memory_per_gpu(model, layout, global_batch).values())
        if peak > usable_fraction * cluster.memory_bytes:
            continue
        seconds = sum(step_time_breakdown(model, cluster, layout, global_batch).values())
        sent = sum(traffic_bytes(model, layout, global_batch).values())
        ranked.append((rank_key(seconds, sent, peak), tuple(vars(layout).values()), layout,
                       peak, seconds))  # fmt: skip
    ranked.sort(key=lambda row: row[:2])
    return [(layout, peak, seconds) for *_, layout, peak, seconds in ranked]
