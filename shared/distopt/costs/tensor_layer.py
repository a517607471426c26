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

Choosing t is a question of throughput, not of one layer's latency: with G GPUs, G / t groups
work side by side, so the tokens per second per GPU are tokens / (t x layer time), the ideal
F / (72 h^2) times the *efficiency* compute / (compute + comm). The compute shrinks as 1/t and
the traffic does not, so the efficiency falls with every step of t: tensor parallelism is a
memory tool, kept as small as lets the model's state fit, and inside the fast intra-server
domain (Narayanan et al. 2021, Section 3, takeaways 1 and 2). Choosing t by that rule is
section 03's exercise 2 (its answer is not in this package); :func:`fastest_degree` is the
latency objective it replaces.
"""

from __future__ import annotations

from distopt.costs import comm

__all__ = [
    "ALL_REDUCES_PER_LAYER",
    "FLOPS_PER_TOKEN",
    "fastest_degree",
    "layer_efficiency",
    "layer_seconds",
]

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


def layer_efficiency(
    tokens: int,
    hidden: int,
    tensor: int,
    *,
    flops_per_s: float,
    bandwidth: float,
    bytes_per_value: int = 2,
) -> float:
    """compute / (compute + comm) of :func:`layer_seconds`: a GPU's throughput in a group of
    ``tensor``, as a fraction of what it reaches alone without communication."""
    parts = layer_seconds(
        tokens, hidden, tensor, flops_per_s=flops_per_s, bandwidth=bandwidth,
        bytes_per_value=bytes_per_value,
    )  # fmt: skip
    return parts["compute"] / (parts["compute"] + parts["comm"])


def _degrees(heads: int, max_degree: int) -> list[int]:
    if max_degree < 1:
        raise ValueError(f"max_degree must be at least 1, got {max_degree}")
    return [t for t in range(1, max_degree + 1) if heads % t == 0]


def fastest_degree(
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
    """The degree with the shortest layer time, and that time: one layer's latency, as if GPUs
    were free. Shown beside the throughput rule (section 03's exercise 2) as the objective
    *not* to use; ties go to the smaller t."""
    best: tuple[int, float] | None = None
    for t in _degrees(heads, max_degree):
        link = intra_bandwidth if t <= gpus_per_server else inter_bandwidth
        parts = layer_seconds(
            tokens, hidden, t, flops_per_s=flops_per_s, bandwidth=link,
            bytes_per_value=bytes_per_value,
        )  # fmt: skip
        seconds = parts["compute"] + parts["comm"]
        if best is None or seconds < best[1]:
            best = (t, seconds)
    assert best is not None  # t = 1 always divides heads
    return best
