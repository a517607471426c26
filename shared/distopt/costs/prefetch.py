"""When FSDP's prefetching hides the all-gathers of a fully sharded (ZeRO-3) forward pass.

Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
which describes FSDP's forward and backward prefetching; costed with the ring collectives
of :mod:`distopt.costs.comm`.

Before layer i runs, its full weights are all-gathered from the N shards: each rank sends
(N-1)/N of the layer's bytes (a ring all-gather, :func:`distopt.costs.comm.allgather_bytes_sent`).
Without prefetching the gather starts when the layer is needed, so every gather waits in
full. With prefetching (FSDP's default, one layer ahead) layer i's gather is issued when
layer i-1 starts computing, and runs while it computes: it costs nothing if it is no longer
than that compute, and only the excess otherwise. The first gather of a step has nothing
before it to hide behind.

A layer of p parameters that multiplies T tokens does about 2 p T FLOPs in the forward pass
(one multiply and one add per weight and token), so with equal layers the gather hides when

    (N-1)/N * p * weight_bytes / bandwidth  <=  2 p T / flops_per_s,

that is when T >= (N-1)/N * weight_bytes * flops_per_s / (2 bandwidth), whatever the layer's
size (:func:`tokens_to_hide_gather`). The backward pass does twice the compute (4 p T) and
sends twice the bytes (the next gather plus this layer's gradient reduce-scatter), so with
gradients as wide as the weights it hides at the same token count.

:func:`fully_sharded_step_seconds` times a whole step, forward and backward, on two streams
(compute and link) that each do one thing at a time: the forward-only exposure above is its
first half, and in the backward pass the gradients' reduce-scatters queue on the same link as
the prefetched gathers, so a slow link falls further behind layer by layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distopt.costs import comm

__all__ = [
    "LayerOverlap",
    "fully_sharded_step_seconds",
    "prefetch_overlap",
    "tokens_to_hide_gather",
]

# Forward FLOPs per parameter and token of a matrix multiply: one multiply, one add.
FORWARD_FLOPS_PER_PARAM_TOKEN = 2
# The backward pass computes the gradients of the inputs and of the weights: twice the forward.
BACKWARD_TO_FORWARD_FLOPS = 2


@dataclass(frozen=True)
class LayerOverlap:
    """One layer of a fully sharded forward pass: its gather against the compute before it."""

    layer: int  # index in the forward order
    gather_s: float  # seconds of the all-gather of the layer's full weights
    compute_s: float  # seconds of the layer's forward compute
    exposed_s: float  # seconds of the gather that no compute hides (compute waits)


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def prefetch_overlap(
    layer_num_params: Sequence[float],
    tokens: float,
    world_size: int,
    *,
    flops_per_s: float,
    bandwidth: float,
    weight_bytes: float = 2,
    prefetch: bool = True,
) -> list[LayerOverlap]:
    """Per-layer gather and compute seconds of one fully sharded forward pass, in order.

    ``tokens`` is the number of tokens the device's micro-batch holds (sequence length times
    micro-batch), ``flops_per_s`` the FLOP rate it sustains, ``bandwidth`` its link speed in
    bytes per second. Layer i's forward takes 2 p_i T / ``flops_per_s`` seconds (right for
    matrix multiplies; an embedding lookup computes almost nothing) and its gather
    (N-1)/N p_i ``weight_bytes`` / ``bandwidth``. Without ``prefetch`` every gather is
    exposed; with it, layer i > 0 exposes max(0, gather_i - compute_{i-1}) and layer 0 all of
    its gather (exact for gathers issued one layer ahead on a link of their own).
    """
    if not layer_num_params:
        raise ValueError("layer_num_params must list at least one layer")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    _check_positive(tokens=tokens, flops_per_s=flops_per_s, bandwidth=bandwidth)
    if any(p < 0 for p in layer_num_params):
        raise ValueError(f"layer_num_params must be >= 0, got {list(layer_num_params)!r}")
    rows: list[LayerOverlap] = []
    previous_compute = 0.0  # nothing computes before the first layer
    for i, params in enumerate(layer_num_params):
        gather = comm.allgather_bytes_sent(params * weight_bytes, world_size) / bandwidth
        compute = FORWARD_FLOPS_PER_PARAM_TOKEN * params * tokens / flops_per_s
        exposed = max(0.0, gather - previous_compute) if prefetch else gather
        rows.append(LayerOverlap(i, gather, compute, exposed))
        previous_compute = compute
    return rows


def tokens_to_hide_gather(
    world_size: int, *, flops_per_s: float, bandwidth: float, weight_bytes: float = 2
) -> float:
    """Fewest tokens per micro-batch at which a prefetched gather hides behind an equal layer.

    (N-1)/N * ``weight_bytes`` * ``flops_per_s`` / (2 ``bandwidth``): the gather of a layer
    takes no longer than the forward of the (equal) layer before it. Zero for one device.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    _check_positive(flops_per_s=flops_per_s, bandwidth=bandwidth)
    share = comm.allgather_bytes_sent(weight_bytes, world_size)  # (N-1)/N bytes per parameter
    return share * flops_per_s / (FORWARD_FLOPS_PER_PARAM_TOKEN * bandwidth)


def fully_sharded_step_seconds(
    layer_num_params: Sequence[float],
    tokens: float,
    world_size: int,
    *,
    flops_per_s: float,
    bandwidth: float,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    prefetch: bool = True,
) -> float:
    """Seconds of one fully sharded (ZeRO-3 / FSDP) step, forward and backward, one micro-batch.

    The step runs 2L computations: the forward of layers 0..L-1 (2 p_i T / ``flops_per_s``
    seconds each), then their backward in reverse order (twice as long). Each computation
    needs its layer's weights all-gathered first, (N-1)/N p_i ``weight_bytes`` /
    ``bandwidth`` seconds, in the backward pass again; after each backward computation the
    layer's gradient is reduce-scattered, (N-1)/N p_i ``grad_bytes`` / ``bandwidth``
    seconds. The compute stream and the link each do one thing at a time, the link its
    transfers in the order they are issued. The first gather is issued at time 0; each
    further gather when the computation before it ends, or with ``prefetch`` (FSDP's
    forward and backward prefetch) when it starts; a reduce-scatter when its backward ends,
    after the gather prefetched during it. The step ends with its last computation or
    transfer. Without prefetch nothing overlaps but a reduce-scatter with nothing (it is
    issued with the next gather, before it), so the step is the sum of every part.
    """
    if not layer_num_params:
        raise ValueError("layer_num_params must list at least one layer")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    _check_positive(tokens=tokens, flops_per_s=flops_per_s, bandwidth=bandwidth)
    if any(p < 0 for p in layer_num_params):
        raise ValueError(f"layer_num_params must be >= 0, got {list(layer_num_params)!r}")

    def transfer_s(params: float, width: float) -> float:
        return comm.allgather_bytes_sent(params * width, world_size) / bandwidth

    forward = [FORWARD_FLOPS_PER_PARAM_TOKEN * p * tokens / flops_per_s for p in layer_num_params]
    order = list(range(len(layer_num_params)))
    # (layer, compute seconds, backward?) in the order the compute stream runs them
    blocks = [(i, forward[i], False) for i in order] + [
        (i, BACKWARD_TO_FORWARD_FLOPS * forward[i], True) for i in reversed(order)
    ]
    gathers = [transfer_s(layer_num_params[i], weight_bytes) for i, _, _ in blocks]
    link_free = gathers[0]  # when the link has done everything issued so far
    gathered = gathers[0]  # when the next computation's weights are in place
    compute_free = 0.0
    for k, (layer, compute, backward) in enumerate(blocks):
        start = max(compute_free, gathered)
        last = k + 1 == len(blocks)
        if prefetch and not last:
            link_free = max(link_free, start) + gathers[k + 1]
            gathered = link_free
        compute_free = start + compute
        if backward:
            link_free = max(link_free, compute_free) + transfer_s(
                layer_num_params[layer], grad_bytes
            )
        if not prefetch and not last:
            link_free = max(link_free, compute_free) + gathers[k + 1]
            gathered = link_free
    return max(compute_free, link_free)
