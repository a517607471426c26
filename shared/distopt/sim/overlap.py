"""A timeline of one backward pass with gradient buckets all-reduced as they fill, as DDP does.

The backward pass visits the layers last to first, so the last layer's gradients are ready
first. DDP (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", Section 3.2) groups gradients into *buckets* in that order and launches the
all-reduce of a bucket as soon as all of its gradients are ready, while the backward pass
continues on earlier layers. The network carries one all-reduce at a time, in launch order.

* A bucket is filled with layers, last to first, and closed as soon as it holds at least
  ``bucket_bytes`` (the last bucket takes whatever is left). ``bucket_bytes=math.inf`` is
  the naive scheme: one all-reduce of all gradients after the backward pass.
* Each bucket's all-reduce takes ``comm.allreduce_time`` (the alpha-beta model).
* With ``overlap=False`` no all-reduce starts before the backward pass has ended.

Times are in seconds from the start of the backward pass; the step is done (the optimizer
can run) when the last all-reduce ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distopt.costs import comm


@dataclass(frozen=True)
class Interval:
    """Something that occupies the compute or the network from ``start_s`` to ``end_s``."""

    label: str  # e.g. "layer 3" or "bucket 0"
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    """The result of :func:`simulate_backward`."""

    backward: list[Interval]  # one per layer, in backward order (last layer first)
    allreduce: list[Interval]  # one per bucket, in launch order
    buckets: list[list[int]]  # layer indices (forward numbering) of each bucket
    end_s: float  # when the last all-reduce ends (or the backward, if later)


def assign_buckets(layer_grad_bytes: Sequence[float], bucket_bytes: float) -> list[list[int]]:
    """DDP-style buckets: layers taken last to first, a bucket closes once >= bucket_bytes.

    Returns lists of layer indices (forward numbering), in the order the buckets fill.
    """
    if len(layer_grad_bytes) == 0:
        raise ValueError("need at least one layer")
    if not bucket_bytes > 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes!r}")
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0.0
    for layer in reversed(range(len(layer_grad_bytes))):
        current.append(layer)
        filled += layer_grad_bytes[layer]
        if filled >= bucket_bytes:
            buckets.append(current)
            current, filled = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def simulate_backward(
    layer_backward_s: Sequence[float],
    layer_grad_bytes: Sequence[float],
    *,
    bucket_bytes: float,
    world_size: int,
    bandwidth: float,
    latency: float = 0.0,
    overlap: bool = True,
    algorithm: str = "ring",
) -> Timeline:
    """Timeline of the backward pass and the bucketed gradient all-reduces of one step.

    layer_backward_s -- backward compute time of each layer, in forward order (seconds)
    layer_grad_bytes -- gradient bytes of each layer, in forward order
    bucket_bytes     -- bucket capacity in bytes (``math.inf``: a single bucket)
    world_size, bandwidth, latency, algorithm -- passed to ``comm.allreduce_time``
    overlap          -- whether an all-reduce may start while the backward pass still runs
    """
    if len(layer_backward_s) != len(layer_grad_bytes):
        raise ValueError("layer_backward_s and layer_grad_bytes must have the same length")
    backward: list[Interval] = []
    ready_s = [0.0] * len(layer_backward_s)  # when each layer's gradient is complete
    clock_s = 0.0
    for layer in reversed(range(len(layer_backward_s))):
        start_s, clock_s = clock_s, clock_s + layer_backward_s[layer]
        backward.append(Interval(f"layer {layer}", start_s, clock_s))
        ready_s[layer] = clock_s
    backward_end_s = clock_s

    buckets = assign_buckets(layer_grad_bytes, bucket_bytes)
    allreduce: list[Interval] = []
    network_free_s = 0.0
    for index, bucket in enumerate(buckets):
        ready = max(ready_s[layer] for layer in bucket)
        if not overlap:
            ready = backward_end_s
        size = sum(layer_grad_bytes[layer] for layer in bucket)
        duration = comm.allreduce_time(
            size, world_size, bandwidth=bandwidth, latency=latency, algorithm=algorithm
        )
        start_s = max(ready, network_free_s)
        network_free_s = start_s + duration
        allreduce.append(Interval(f"bucket {index}", start_s, network_free_s))
    return Timeline(backward, allreduce, buckets, max(backward_end_s, network_free_s))


def naive_backward(
    layer_backward_s: Sequence[float],
    layer_grad_bytes: Sequence[float],
    *,
    world_size: int,
    bandwidth: float,
    latency: float = 0.0,
    algorithm: str = "ring",
) -> Timeline:
    """The naive scheme: the whole backward pass, then one all-reduce of all the gradients."""
    return simulate_backward(
        layer_backward_s,
        layer_grad_bytes,
        bucket_bytes=math.inf,
        world_size=world_size,
        bandwidth=bandwidth,
        latency=latency,
        algorithm=algorithm,
    )


def transformer_tensors(
    hidden: int,
    blocks: int,
    *,
    tokens_per_gpu: int,
    flops_per_s: float,
    per_tensor_s: float,
    bytes_per_grad: int = 4,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-tensor backward seconds and gradient bytes of a stack of GPT-like blocks.

    Each block holds six parameter tensors, in forward order: a layer norm (2h), the fused
    query-key-value projection (3h² + 3h), the attention's output projection (h² + h), a
    second layer norm (2h), and the MLP's two linear layers (4h² + 4h and 4h² + h). A
    tensor's backward costs 4 FLOPs per parameter and token (input and weight gradients,
    2 FLOPs each) at ``flops_per_s``, plus ``per_tensor_s`` of fixed overhead.
    Returns ``(backward_s, grad_bytes)``, arrays of ``6 * blocks`` entries in forward order.
    """
    h = hidden
    block = [2 * h, 3 * h**2 + 3 * h, h**2 + h, 2 * h, 4 * h**2 + 4 * h, 4 * h**2 + h]
    params = np.array(block * blocks, dtype=float)
    backward_s = 4 * params * tokens_per_gpu / flops_per_s + per_tensor_s
    return backward_s, bytes_per_grad * params
