"""A tensor-parallel transformer layer: compute that shrinks with t, traffic that does not.

Megatron-LM (Shoeybi et al. 2019) splits each layer's matrix products over ``tensor`` = t GPUs
and pays, per layer and training step, four all-reduces of the (tokens x hidden) activation:
*f* and *g* of attention and of the MLP, two in the forward pass and two in the backward.
With Megatron sequence parallelism (Korthikanti et al. 2022) each all-reduce becomes a
reduce-scatter and an all-gather of the same bytes, so the time below holds for both.

Compute: about 72 tokens h^2 FLOPs per layer and step (24 tokens h^2 for the forward's matrix
products, twice that backward; Narayanan et al. 2021, eq. 3 without recomputation), split t
ways. Communication: each all-reduce sends 2(t-1)/t of the activation per GPU (a ring,
:func:`distopt.costs.comm.ring_allreduce_bytes_sent`) over the link of a group of t GPUs: the
fast intra-server link while the group fits in a server, the inter-server link beyond. The
all-reduces sit on the critical path (the next product needs their result), so the layer's
time is the sum of the two.
"""

from __future__ import annotations

from distopt.costs import comm

__all__ = ["ALL_REDUCES_PER_LAYER", "FLOPS_PER_TOKEN", "best_degree", "layer_seconds"]

ALL_REDUCES_PER_LAYER = 4  # f and g of attention and of the MLP, forward and backward
FLOPS_PER_TOKEN = 72  # times hidden^2: a layer's training-step FLOPs per token


def layer_seconds(
    tokens: int,
    hidden: int,
    tensor: int,
    *,
    flops_per_s: float,
    bandwidth: float,
    bytes_per_value: int = 2,
) -> dict[str, float]:
    """Seconds per layer and training step on each of ``tensor`` GPUs: compute and comm.

    ``bandwidth`` is the per-GPU link speed (bytes/s) of the tensor-parallel group.
    """
    if tensor < 1 or flops_per_s <= 0 or bandwidth <= 0:
        raise ValueError("tensor, flops_per_s and bandwidth must be positive")
    compute = FLOPS_PER_TOKEN * tokens * hidden**2 / (tensor * flops_per_s)
    activation = tokens * hidden * bytes_per_value
    sent = ALL_REDUCES_PER_LAYER * comm.ring_allreduce_bytes_sent(activation, tensor)
    return {"compute": compute, "comm": sent / bandwidth}


def best_degree(
    tokens: int,
    hidden: int,
    heads: int,
    *,
    flops_per_s: float,
    intra_bandwidth: float,
    inter_bandwidth: float,
    gpus_per_server: int,
    max_degree: int,
    bytes_per_value: int = 2,
) -> tuple[int, float]:
    """The tensor-parallel degree with the shortest layer time, and that time in seconds.

    Candidates: every t that divides ``heads`` (attention is split by heads) up to
    ``max_degree``; a group of t GPUs uses ``intra_bandwidth`` if t <= ``gpus_per_server``,
    ``inter_bandwidth`` otherwise. Ties go to the smaller t (it sends less).
    """
    best: tuple[int, float] | None = None
    for t in range(1, max_degree + 1):
        if heads % t:
            continue
        link = intra_bandwidth if t <= gpus_per_server else inter_bandwidth
        parts = layer_seconds(
            tokens, hidden, t, flops_per_s=flops_per_s, bandwidth=link,
            bytes_per_value=bytes_per_value,
        )  # fmt: skip
        seconds = parts["compute"] + parts["comm"]
        if best is None or seconds < best[1]:
            best = (t, seconds)
    if best is None:
        raise ValueError(f"max_degree must be at least 1, got {max_degree}")
    return best
