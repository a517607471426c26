"""Memory accounting for data-parallel training, with and without ZeRO/FSDP sharding.

Everything is in bytes and per device. Three kinds of memory are modelled:

* training state: weights, gradients and optimizer state, which ZeRO shards over the
  data-parallel ranks (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
  Trillion Parameter Models", Figure 1);
* activations of a transformer layer, after Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", Table 2;
* the memory over time of a fully sharded (ZeRO-3/FSDP) step, which gathers each layer's
  weights just before use and frees them right after.

:func:`peak_training_bytes` adds them up for a transformer at the start of its backward
pass, with the float32 logits and, under ZeRO-3, the gathered layer in use.
:mod:`distopt.costs.layout_memory` does the same for one GPU of a tensor x pipeline x data
parallel layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE_MODES = ("none", "selective", "full")


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
    it over the t ranks as well (2sbh/t).
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
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tensor_parallel
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / t if sequence_parallel else 2 * sbh
    # The attention scores, softmax output and its dropout mask: 5as/h per sbh element.
    attention_scores = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    if sequence_parallel:
        return sbh * (34 / t + attention_scores)
    return sbh * (10 + 24 / t + attention_scores)


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
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> dict[str, float]:
    """Bytes per device at the start of the backward pass of a transformer, by part.

    * ``state``: :func:`training_state_bytes`;
    * ``activations``: ``num_layers - 1`` layers holding what ``recompute`` keeps, and the
      layer being processed with all of its activations (:func:`activation_bytes_per_layer`,
      no tensor parallelism);
    * ``logits``: :func:`logits_bytes` (float32, ``vocab`` defaults to 32,000, Llama's);
    * ``gathered``: under ZeRO-3 only, the full weights and gradient of the layer in use,
      12 h^2 parameters (a transformer layer's attention and MLP matrices), as
      :func:`distopt.costs.planner.memory_per_gpu` counts it.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers!r}")
    state = training_state_bytes(
        num_params,
        zero_stage=zero_stage,
        world_size=world_size,
        weight_bytes=weight_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes=optimizer_bytes,
    )
    stored = activation_bytes_per_layer(seq_len, micro_batch, hidden, heads, recompute=recompute)
    working = activation_bytes_per_layer(seq_len, micro_batch, hidden, heads)
    gathered = 12 * hidden**2 * (weight_bytes + grad_bytes) if zero_stage == 3 else 0.0
    return {
        "state": state,
        "activations": (num_layers - 1) * stored + working,
        "logits": logits_bytes(seq_len, micro_batch, vocab),
        "gathered": gathered,
    }


def peak_training_bytes(*args: Any, **kwargs: Any) -> float:
    """Peak bytes per device of a training step: the sum of :func:`peak_training_breakdown`,
    which takes the same arguments."""
    return sum(peak_training_breakdown(*args, **kwargs).values())


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
