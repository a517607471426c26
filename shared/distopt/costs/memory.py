"""Memory accounting for data-parallel training, with and without ZeRO/FSDP sharding.

Everything is in bytes and per device. Three kinds of memory are modelled:

* training state: weights, gradients and optimizer state, which ZeRO shards over the
  data-parallel ranks (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
  Trillion Parameter Models", Figure 1);
* activations of a transformer layer, after Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", Table 2;
* the memory over time of a fully sharded (ZeRO-3/FSDP) step, which gathers each layer's
  weights just before use and frees them right after.

:func:`gpu_memory` is the one memory model of the course: the peak bytes of one GPU for a
:class:`distopt.costs.shape.TransformerShape` under a :class:`distopt.costs.shape.Layout`
(ZeRO stage, tensor/pipeline/data/context/expert degrees, recomputation none/selective/full,
FlashAttention by default), with the float32 logits on the last pipeline stage and, under
ZeRO-3, the gathered layer in use; :data:`USABLE_FRACTION` is the share of a GPU's memory a
plan may fill. Section 02's :func:`peak_training_bytes`, section 03's planner
(:func:`distopt.costs.planner.memory_per_gpu`) and the memory explorer all call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distopt.costs.shape import RECOMPUTE_MODES, ZERO_STAGES, Layout, TransformerShape

__all__ = [
    "RECOMPUTE_MODES",
    "USABLE_FRACTION",
    "ZERO_STAGES",
    "MemoryEvent",
    "activation_bytes_per_layer",
    "busiest_stage",
    "gpu_memory",
    "gpu_memory_stage",
    "layer_activation_bytes",
    "logits_bytes",
    "peak_training_breakdown",
    "peak_training_bytes",
    "simulate_fully_sharded_step",
    "stage_activation_bytes",
    "training_state_breakdown",
    "training_state_bytes",
]


def _check_stage(zero_stage: int) -> None:
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage!r}")


def _check_world_size(world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")


def training_state_breakdown(
    num_params: float,
    *,
    zero_stage: int = 0,
    world_size: int = 1,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> dict[str, float]:
    """Bytes per device of weights, gradients and optimizer state, as a dict.

    ``optimizer_bytes`` is everything the optimizer keeps per parameter: for mixed-precision
    Adam, a float32 master copy and two float32 moments (4 + 4 + 4 = 12). Stage 1 shards the
    optimizer state over ``world_size`` ranks, stage 2 also the gradients, stage 3 (FSDP) also
    the weights; whatever is not sharded is replicated on every rank.
    """
    _check_stage(zero_stage)
    _check_world_size(world_size)
    if num_params < 0:
        raise ValueError(f"num_params must be >= 0, got {num_params!r}")

    def share(bytes_per_param: float, sharded: bool) -> float:
        total = num_params * bytes_per_param
        return total / world_size if sharded else total

    return {
        "weights": share(weight_bytes, zero_stage >= 3),
        "gradients": share(grad_bytes, zero_stage >= 2),
        "optimizer": share(optimizer_bytes, zero_stage >= 1),
    }


def training_state_bytes(
    num_params: float,
    *,
    zero_stage: int = 0,
    world_size: int = 1,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> float:
    """Bytes per device for weights, gradients and optimizer state (activations excluded).

    Defaults are mixed-precision Adam: 16-bit weights and gradients, and 12 bytes of float32
    optimizer state (master weights and two moments), 16 bytes per parameter in all.
    """
    parts = training_state_breakdown(
        num_params,
        zero_stage=zero_stage,
        world_size=world_size,
        weight_bytes=weight_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes=optimizer_bytes,
    )
    return sum(parts.values())


def activation_bytes_per_layer(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    *,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Activation bytes one transformer layer keeps for the backward pass, on one device.

    Korthikanti et al. 2022, Table 2, with s = ``seq_len``, b = ``micro_batch``,
    h = ``hidden``, a = ``heads`` and t = ``tensor_parallel`` (16-bit activations, 1-byte
    dropout masks):

    ===========================  ==============================
    no recomputation             sbh (10 + 24/t + 5as/(ht))
    ... with sequence parallel   sbh (34/t + 5as/(ht))
    selective recomputation      sbh (10 + 24/t)
    ... with sequence parallel   sbh (34/t)
    full recomputation           2sbh (only the layer input)
    ===========================  ==============================

    With t = 1 the first row is the paper's sbh (34 + 5as/h). Under full recomputation the
    stored layer input lies in the sequence-parallel region, so sequence parallelism splits
    it over the t ranks as well (2sbh/t). Naive attention, a GPT-style layer: this is
    :func:`layer_activation_bytes` with ``flash_attention=False``, which also covers
    FlashAttention, grouped-query attention and SwiGLU.
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    for name, value in (
        ("seq_len", seq_len),
        ("micro_batch", micro_batch),
        ("hidden", hidden),
        ("heads", heads),
        ("tensor_parallel", tensor_parallel),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    return _layer_bytes(
        seq_len * micro_batch * hidden,
        seq_len * heads / hidden,
        split=24,
        tensor=tensor_parallel,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        scores_kept=recompute == "none",
    )


def _layer_bytes(
    sbh: float,
    scores_per_sbh: float,
    *,
    split: float,
    tensor: int,
    sequence_parallel: bool,
    recompute: str,
    scores_kept: bool,
    working: bool = False,
) -> float:
    """sbh (10 + split/t + 5 a s/(h t)), the score term only if ``scores_kept``, everything
    over t with sequence parallelism; 2 sbh (/t) for a stored layer under full recomputation.
    ``scores_per_sbh`` is a s / h."""
    split_all = sequence_parallel and tensor > 1
    if recompute == "full" and not working:
        return 2 * sbh / tensor if split_all else 2 * sbh
    scores = 5 * scores_per_sbh / tensor if scores_kept else 0.0
    if split_all:
        return sbh * ((10 + split) / tensor + scores)
    return sbh * (10 + split / tensor + scores)


def logits_bytes(
    seq_len: int, micro_batch: int, vocab: int, *, bytes_per_value: float = 4
) -> float:
    """Bytes of the output layer's logits, s b V values, float32 by default.

    The logits are usually upcast to float32 for a stable softmax and cross-entropy, so at
    the end of the forward pass they take 4 s b V bytes, often more than a layer's
    activations when the vocabulary is large.
    """
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("vocab", vocab)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    return seq_len * micro_batch * vocab * bytes_per_value


def peak_training_breakdown(
    num_params: float,
    num_layers: int,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    *,
    zero_stage: int,
    world_size: int,
    vocab: int = 32_000,
    recompute: str = "none",
    flash_attention: bool = False,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> dict[str, float]:
    """Bytes per device at the start of the backward pass of a transformer, by part.

    Section 02's exercise 5 in the package's words: :func:`gpu_memory` of a GPT-style shape
    of ``num_params`` parameters on one GPU of a ``world_size``-way data-parallel layout,
    regrouped as

    * ``state``: :func:`training_state_bytes`;
    * ``activations``: ``num_layers - 1`` layers holding what ``recompute`` keeps, and the
      layer being processed with all of its activations; by default naive attention
      (``flash_attention=False``), whose recomputed layer holds its s^2 scores again;
    * ``logits``: :func:`logits_bytes` (float32, ``vocab`` defaults to 32,000, Llama's);
    * ``gathered``: under ZeRO-3 only, the full weights and gradient of the layer in use,
      12 h^2 parameters (a transformer layer's attention and MLP matrices).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers!r}")
    model = TransformerShape(num_layers, hidden, heads, vocab, seq_len, params=num_params)
    layout = Layout(
        data=world_size,
        zero_stage=zero_stage,
        micro_batch=micro_batch,
        recompute=recompute,
        flash_attention=flash_attention,
    )
    parts = gpu_memory(
        model,
        layout,
        weight_bytes=weight_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes=optimizer_bytes,
    )
    return {
        "state": parts["weights"] + parts["gradients"] + parts["optimizer"],
        "activations": parts["activations"],
        "logits": parts["logits"],
        "gathered": parts["gathered"],
    }


def peak_training_bytes(*args: Any, **kwargs: Any) -> float:
    """Peak bytes per device of a training step: the sum of :func:`peak_training_breakdown`,
    which takes the same arguments."""
    return sum(peak_training_breakdown(*args, **kwargs).values())


# --- one memory model for every section: a TransformerShape on one GPU of a Layout ---------

USABLE_FRACTION = 0.9
"""Share of a GPU's memory a layout may plan to fill: a rule of thumb (10 % headroom), not a
measurement. What takes the rest is not the model's: the CUDA context with the cuBLAS/cuDNN
workspaces (of the order of 0.5 to 1 GiB per process), NCCL's buffers (NCCL_BUFFSIZE, 4 MiB by
default, per channel and peer: NCCL's environment-variable documentation) and the caching
allocator's fragmentation, the reserved-but-unallocated memory that ``torch.cuda.memory_stats``
reports and PyTorch's CUDA notes discuss (``expandable_segments`` reduces it). On an H100
(:data:`distopt.units.H100_MEMORY_BYTES`) 10 % is 8.6 GB. 07's training plan asks for 10 to
20 %; a measured job should replace the rule by its own numbers."""


def layer_activation_bytes(
    shape: TransformerShape, layout: Layout, *, working: bool = False
) -> float:
    """Activation bytes of one layer on one GPU, for one micro-batch.

    Korthikanti et al. 2022 (Table 2, Section 4.1) with s = ``shape.seq_len`` / context
    degree, b = micro-batch, h = hidden, a = heads, t = tensor degree, r = kv_heads / heads
    and f = ``shape.ffn``, 16-bit values and 1-byte dropout masks, per layer:

    * not split by t: both LayerNorms' inputs (4sbh), the QKV and first MLP matrices' inputs
      (2sbh each), two dropout masks (2sbh): 10 sbh;
    * split by t: Q and K for QK^T (2sbh + 2sbh r), V (2sbh r), the output projection's input
      (2sbh): (4 + 4r) sbh; the MLP: GELU's input and the second matrix's input, 4sbf (16 sbh
      at f = 4h), or SwiGLU's gate and up outputs and the down matrix's input, 6sbf (Megatron's
      fused SwiGLU recomputes the SiLU); times top_k in a mixture of experts;
    * the attention scores, softmax output and its dropout mask, 5as^2b split by t: only with
      naive attention (``layout.flash_attention`` False), and then dropped by selective
      recomputation, except in the layer being processed (``working``), which rebuilds them
      for its backward.

    ``layout.sequence_parallel`` with t > 1 splits the 10 sbh over t as well. Under full
    recomputation a layer stores only its input, 2sbh (/t with sequence parallelism); the
    layer being processed (``working=True``) holds its full set again. With GPT's shape and
    t = 1 the sum is the paper's sbh (34 + 5as/h).
    """
    if shape.seq_len % layout.context:
        raise ValueError(f"the context degree {layout.context} must divide seq_len {shape.seq_len}")
    if shape.heads % layout.tensor:
        raise ValueError(f"the tensor degree {layout.tensor} must divide heads {shape.heads}")
    s, b, h = shape.seq_len // layout.context, layout.micro_batch, shape.hidden
    mlp_units = (6 if shape.mlp == "swiglu" else 4) * shape.ffn / h
    if shape.experts:
        mlp_units *= shape.top_k
    return _layer_bytes(
        s * b * h,
        shape.heads * s / h,
        split=4 + 4 * shape.kv_ratio + mlp_units,
        tensor=layout.tensor,
        sequence_parallel=layout.sequence_parallel,
        recompute=layout.recompute,
        scores_kept=not layout.flash_attention and (working or layout.recompute == "none"),
        working=working,
    )


def stage_activation_bytes(
    stored_per_layer: float,
    working_per_layer: float,
    *,
    num_layers: int,
    pipeline_parallel: int = 1,
    micro_batches: int = 1,
    stage: int = 0,
) -> float:
    """Activation bytes on a GPU of pipeline stage ``stage`` (0 = first) at its peak.

    Each of the p = ``pipeline_parallel`` stages runs ``num_layers / p`` layers; under 1F1B,
    stage i has min(p - i, m) of the m = ``micro_batches`` in flight, each storing
    ``stored_per_layer`` in every layer of the stage, except the layer being processed,
    which holds ``working_per_layer``. With p = 1: (L - 1) stored + 1 working.
    """
    if pipeline_parallel < 1 or num_layers % pipeline_parallel:
        raise ValueError(
            f"pipeline_parallel must be >= 1 and divide num_layers ({num_layers}), "
            f"got {pipeline_parallel!r}"
        )
    if not 0 <= stage < pipeline_parallel:
        raise ValueError(f"stage must be in [0, {pipeline_parallel}), got {stage!r}")
    if int(micro_batches) != micro_batches or micro_batches < 1:
        raise ValueError(f"micro_batches must be a whole number >= 1, got {micro_batches!r}")
    in_flight = min(pipeline_parallel - stage, micro_batches)
    layers = in_flight * num_layers // pipeline_parallel
    return (layers - 1) * stored_per_layer + working_per_layer


def gpu_memory_stage(
    shape: TransformerShape,
    layout: Layout,
    *,
    micro_batches: int = 1,
    stage: int = 0,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> dict[str, float]:
    """Peak bytes on a GPU of pipeline stage ``stage`` (0 = first), by part.

    * ``weights``, ``gradients``, ``optimizer``: :func:`training_state_breakdown` of the GPU's
      1/(t p) of the dense parameters, ZeRO-sharded over the d c GPUs that hold the same
      weights, and of 1/(t p e) of the experts' parameters, sharded over the d c / e GPUs that
      hold the same experts;
    * ``activations``: :func:`stage_activation_bytes` of :func:`layer_activation_bytes`
      (``micro_batches`` m per pipeline per step, 1F1B);
    * ``logits``: on the last stage only, float32 logits of the micro-batch's s/c tokens over
      1/t of the vocabulary (:func:`logits_bytes`; the output layer is vocabulary-parallel);
    * ``gathered``: under ZeRO-3, the layer in use with its gradient, 1/t of its matrices
      (:attr:`TransformerShape.layer_params`, the experts' 1/e).
    """
    t, p, e = layout.tensor, layout.pipeline, layout.expert
    replicas = layout.data * layout.context
    if shape.layers % p:
        raise ValueError(f"the pipeline degree {p} must divide the {shape.layers} layers")
    if replicas % e:
        raise ValueError(f"the expert degree {e} must divide data x context ({replicas})")
    widths = dict(weight_bytes=weight_bytes, grad_bytes=grad_bytes, optimizer_bytes=optimizer_bytes)
    expert_params = shape.expert_params if shape.params is None else 0.0
    parts = training_state_breakdown(
        (shape.num_params - expert_params) / (t * p),
        zero_stage=layout.zero_stage,
        world_size=replicas,
        **widths,
    )
    if expert_params:
        experts = training_state_breakdown(
            expert_params / (t * p * e),
            zero_stage=layout.zero_stage,
            world_size=replicas // e,
            **widths,
        )
        parts = {key: parts[key] + experts[key] for key in parts}
    parts["activations"] = stage_activation_bytes(
        layer_activation_bytes(shape, layout),
        layer_activation_bytes(shape, layout, working=True),
        num_layers=shape.layers,
        pipeline_parallel=p,
        micro_batches=micro_batches,
        stage=stage,
    )
    tokens = shape.seq_len // layout.context
    last = stage == p - 1
    parts["logits"] = logits_bytes(tokens, layout.micro_batch, shape.vocab) / t if last else 0.0
    layer = shape.layer_params
    if shape.experts:
        layer -= shape.experts * shape.mlp_params * (1 - 1 / e)
    gathered = layer / t * (weight_bytes + grad_bytes)
    parts["gathered"] = gathered if layout.zero_stage == 3 else 0.0
    return parts


def busiest_stage(
    shape: TransformerShape, layout: Layout, *, micro_batches: int = 1, **widths: float
) -> tuple[int, dict[str, float]]:
    """(stage, parts) of the pipeline stage whose GPU holds the most: the first (most
    micro-batches in flight) or the last (the logits); the middle ones hold less than the
    first. Ties go to the first."""
    found = [
        (stage, gpu_memory_stage(shape, layout, micro_batches=micro_batches, stage=stage, **widths))
        for stage in sorted({0, layout.pipeline - 1})
    ]
    return max(found, key=lambda item: sum(item[1].values()))


def gpu_memory(
    shape: TransformerShape,
    layout: Layout,
    *,
    micro_batches: int = 1,
    stage: int | None = None,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> dict[str, float]:
    """Peak bytes on one GPU of ``layout`` training ``shape``, by part (keys ``weights``,
    ``gradients``, ``optimizer``, ``activations``, ``logits``, ``gathered``): of pipeline stage
    ``stage``, or with None of the busiest (:func:`busiest_stage`). See
    :func:`gpu_memory_stage` for each part. Compare the sum with ``USABLE_FRACTION`` of the
    GPU's memory (:data:`distopt.units.H100_MEMORY_BYTES` for an H100)."""
    widths = dict(weight_bytes=weight_bytes, grad_bytes=grad_bytes, optimizer_bytes=optimizer_bytes)
    if stage is None:
        return busiest_stage(shape, layout, micro_batches=micro_batches, **widths)[1]
    return gpu_memory_stage(shape, layout, micro_batches=micro_batches, stage=stage, **widths)


@dataclass(frozen=True)
class MemoryEvent:
    """One step of a simulated fully sharded training step."""

    label: str  # what happened, e.g. "forward: gather layer 3"
    bytes_in_use: float  # memory held on the device right after it happened


def simulate_fully_sharded_step(
    layer_num_params: Sequence[int],
    world_size: int,
    *,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
    prefetch: bool = False,
) -> list[MemoryEvent]:
    """Memory of one device over one ZeRO-3/FSDP step (training state only, no activations).

    Each device permanently holds its 1/``world_size`` shard of every layer's weights,
    gradients and optimizer state. In the forward pass each layer's full weights are
    all-gathered just before use and freed right after; the backward pass, in reverse order,
    gathers them again, computes the layer's full gradient, reduce-scatters it into the
    gradient shard and frees both. With ``prefetch`` the next layer's gather is issued before
    the current layer is freed, so its communication overlaps compute, as FSDP does by default,
    at the price of one more layer in memory.
    """
    _check_world_size(world_size)
    if not layer_num_params:
        raise ValueError("layer_num_params must list at least one layer")
    full_weights = [p * weight_bytes for p in layer_num_params]
    full_grads = [p * grad_bytes for p in layer_num_params]
    shard = sum(layer_num_params) * (weight_bytes + grad_bytes + optimizer_bytes) / world_size

    events = [MemoryEvent("start: shards only", shard)]
    in_use = shard

    def record(label: str, delta: float) -> None:
        nonlocal in_use
        in_use += delta
        events.append(MemoryEvent(label, in_use))

    num_layers = len(layer_num_params)
    gathered: set[int] = set()

    def gather(i: int, phase: str) -> None:
        if i not in gathered:
            gathered.add(i)
            record(f"{phase}: gather layer {i}", full_weights[i])

    for i in range(num_layers):
        gather(i, "forward")
        if prefetch and i + 1 < num_layers:
            gather(i + 1, "forward")
        # The last layer's weights are kept for the backward pass, which starts with it.
        if i < num_layers - 1:
            gathered.discard(i)
            record(f"forward: free layer {i}", -full_weights[i])
    for i in reversed(range(num_layers)):
        gather(i, "backward")
        if prefetch and i > 0:
            gather(i - 1, "backward")
        record(f"backward: gradient of layer {i}", full_grads[i])
        record(f"backward: reduce-scatter and free layer {i}", -(full_grads[i] + full_weights[i]))
        gathered.discard(i)
    return events
