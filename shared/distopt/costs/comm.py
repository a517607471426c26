"""Cost models of collective communication (the alpha-beta model).

A message of M bytes sent over a link costs ``latency + M / bandwidth`` seconds
(Hockney's alpha-beta model; Thakur, Rabenseifner and Gropp 2005, "Optimization of
Collective Communication Operations in MPICH"). Sizes are in bytes, bandwidths in bytes per
second and times in seconds. ``message_bytes`` is always the size of the full buffer one
rank holds (for all-gather, the gathered result).

Section 01 adds the naive all-reduce algorithms beside the ring and a least-squares fit of
alpha and beta to measured times (:func:`fit_alpha_beta`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ALLREDUCE_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "tree", "parameter_server")
# What libraries run beside those five (section 01's table, last two rows): NCCL's pipelined
# double binary tree and the two-level all-reduce of a cluster of servers.
LIBRARY_ALLREDUCE_ALGORITHMS = ("double_binary_tree", "hierarchical")

# nccl-tests "bus bandwidth": the algorithm bandwidth (message size / time) times the fraction
# of the message that crosses each rank's link, so that busbw is comparable to the link speed.
# https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
}


def _check(message_bytes: float, world_size: int) -> None:
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")


def ring_allreduce_bytes_sent(message_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce: 2(N-1)/N times the message.

    A reduce-scatter (N-1 steps of M/N bytes) followed by an all-gather (N-1 more).
    """
    _check(message_bytes, world_size)
    return 2 * (world_size - 1) / world_size * message_bytes


def allgather_bytes_sent(message_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-gather (or reduce-scatter): (N-1)/N times M."""
    _check(message_bytes, world_size)
    return (world_size - 1) / world_size * message_bytes


reduce_scatter_bytes_sent = allgather_bytes_sent


def allreduce_time(
    message_bytes: float,
    world_size: int,
    *,
    bandwidth: float,
    latency: float = 0.0,
    algorithm: str = "ring",
    gpus_per_server: int = 8,
) -> float:
    """Seconds for an all-reduce of ``message_bytes`` over ``world_size`` ranks.

    ``bandwidth`` is each rank's link speed in bytes/s and ``latency`` the per-message cost
    in seconds.

    * ``"ring"``: 2(N-1) messages of M/N bytes: 2(N-1) alpha + 2(N-1)/N M/beta. Bandwidth
      optimal, latency grows with N.
    * ``"recursive_doubling"``: log2(N) rounds, each exchanging the full message:
      log2(N) (alpha + M/beta). Latency optimal, sends log2(N) times the message.
    * ``"rabenseifner"``: a reduce-scatter by recursive halving (round k swaps half of what
      is left with a partner, M/2 + M/4 + ...), then an all-gather by recursive doubling:
      2 log2(N) alpha + 2(N-1)/N M/beta, the ring's bandwidth with logarithmic latency
      (Thakur, Rabenseifner & Gropp 2005). The model gives every pair of ranks its own link
      of speed beta; on a real network the far-apart partners of the halving share links,
      which is one reason libraries keep rings.

      Both need N a power of two. Otherwise (MPICH's reduction to the nearest power of two,
      N' = 2**floor(log2 N)): the N - N' extra ranks first send their whole buffer to a
      partner, which adds it to its own; the N' partners run the algorithm; then each extra
      rank receives the whole result from its partner. Two more messages of M bytes on the
      critical path: 2 (alpha + M/beta) on top of the formula for N' ranks
      (:func:`allreduce_cost_terms`).
    * ``"double_binary_tree"`` (NCCL's tree, Sanders, Speck & Traeff 2009): two binary trees
      in which every rank is a leaf in one and an inner node in the other, each reducing
      half of the buffer up and broadcasting it down, in pipelined chunks: a tree's
      2 ceil(log2 N) latencies and about two buffers through each rank's link,
      2 ceil(log2 N) alpha + 2 M/beta (the pipeline's fill, one chunk per level, is left
      out).
    * ``"hierarchical"``: N = S servers of ``gpus_per_server`` = G GPUs. A ring
      reduce-scatter inside each server, then each GPU all-reduces its 1/G of the buffer
      with the GPUs of the same index on the other servers (a ring of S, all G rings at
      once), then a ring all-gather inside the server: 2(G-1) + 2(S-1) latencies and the
      ring's 2(N-1)/N buffers when every link has the same alpha and beta. With a fast link
      inside the server and a slow one between servers, see
      :func:`hierarchical_allreduce_time`. N <= G is one server: the ring.
    * ``"tree"``: a binomial-tree reduce to one rank, then a binomial-tree broadcast, whole
      messages, not pipelined: 2 ceil(log2 N) (alpha + M/beta).
    * ``"parameter_server"``: one rank is the server; it receives the N-1 other messages one
      after the other, sums, and sends N-1 copies back: 2(N-1) (alpha + M/beta).

    :func:`allreduce_cost_terms` gives the two coefficients of each formula.
    """
    _check(message_bytes, world_size)
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
    if latency < 0:
        raise ValueError(f"latency must be >= 0 s, got {latency!r}")
    n = world_size
    if n == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) * latency + ring_allreduce_bytes_sent(message_bytes, n) / bandwidth
    if algorithm == "hierarchical":
        return hierarchical_allreduce_time(
            message_bytes,
            *_servers(n, gpus_per_server),
            intra_bandwidth=bandwidth,
            inter_bandwidth=bandwidth,
            intra_latency=latency,
            inter_latency=latency,
        )
    messages, buffers = allreduce_cost_terms(n, algorithm)
    return messages * latency + buffers * message_bytes / bandwidth


def _servers(world_size: int, gpus_per_server: int) -> tuple[int, int]:
    """(servers, GPUs per server) of a hierarchical all-reduce over ``world_size`` GPUs."""
    if not isinstance(gpus_per_server, int) or gpus_per_server < 1:
        raise ValueError(f"gpus_per_server must be a positive int, got {gpus_per_server!r}")
    if world_size <= gpus_per_server:
        return 1, world_size
    if world_size % gpus_per_server:
        raise ValueError(
            f"a hierarchical all-reduce needs whole servers: world_size {world_size} is not "
            f"a multiple of gpus_per_server {gpus_per_server}"
        )
    return world_size // gpus_per_server, gpus_per_server


def hierarchical_allreduce_time(
    message_bytes: float,
    servers: int,
    gpus_per_server: int,
    *,
    intra_bandwidth: float,
    inter_bandwidth: float,
    intra_latency: float = 0.0,
    inter_latency: float = 0.0,
) -> float:
    """Seconds for the two-level all-reduce of ``servers`` x ``gpus_per_server`` GPUs.

    1. reduce-scatter inside each server (a ring of G over the fast link): each GPU holds the
       server's sum of 1/G of the buffer;
    2. all-reduce of that 1/G across the servers (a ring of S over the slow link; the G GPUs
       of a server each use their own network port, so the G rings run at once);
    3. all-gather inside each server.

    Time: 2(G-1) alpha_in + 2(G-1)/G M/beta_in + 2(S-1) alpha_out + 2(S-1)/S (M/G)/beta_out.
    Across servers each GPU sends 1/G of what a flat ring over all N = S G GPUs would push
    through the same slow link (NCCL builds its rings and trees this way, inside the server
    first).
    """
    _check(message_bytes, servers)
    _check(message_bytes, gpus_per_server)
    for name, value in (("intra_bandwidth", intra_bandwidth), ("inter_bandwidth", inter_bandwidth)):
        if value <= 0:
            raise ValueError(f"{name} must be > 0 bytes/s, got {value!r}")
    g = gpus_per_server
    inside = (
        2 * (g - 1) * intra_latency + ring_allreduce_bytes_sent(message_bytes, g) / intra_bandwidth
    )
    across = allreduce_time(
        message_bytes / g, servers, bandwidth=inter_bandwidth, latency=inter_latency
    )
    return inside + across


def bus_bandwidth(alg_bandwidth: float, world_size: int, collective: str = "all_reduce") -> float:
    """The nccl-tests bus bandwidth for a measured algorithm bandwidth (bytes/s).

    busbw = algbw x factor, with factor 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
    reduce_scatter and all_to_all, and 1 for broadcast and reduce.
    """
    if collective not in _BUS_FACTORS:
        raise ValueError(f"collective must be one of {tuple(_BUS_FACTORS)}, got {collective!r}")
    _check(0, world_size)
    return alg_bandwidth * _BUS_FACTORS[collective](world_size)


def sharded_step_traffic(
    num_params: float,
    *,
    zero_stage: int,
    world_size: int,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    micro_batches: int = 1,
    accumulate_unsharded: bool = False,
    reshard_after_forward: bool = True,
    shard_size: int | None = None,
    offload: bool = False,
) -> dict[str, float]:
    """Bytes one rank moves per training step under ZeRO stage 0-3, by where they go.

    Returns ``{"shard": ..., "replicate": ..., "pcie": ...}``: bytes sent to the other ranks
    of its shard group (all ``world_size`` ranks unless ``shard_size`` is given), bytes sent
    to its replicas (HSDP only), and bytes copied between the GPU and host memory (``offload``
    only, both directions added). :func:`sharded_step_bytes_sent` is the first two added.
    The options, each off by default:

    * ``accumulate_unsharded`` (stages 2 and 3): the micro-batches' gradients are added up in a
      full, unsharded gradient buffer (``num_params * grad_bytes`` more memory; FSDP2's
      ``set_requires_gradient_sync(False)`` on all but the last micro-batch), so the gradient
      is reduce-scattered once per step instead of once per micro-batch;
    * ``reshard_after_forward=False`` (stage 3): a layer gathered in the forward pass stays
      whole until its backward (up to the whole model's weights more memory; FSDP2's option
      of that name), so each micro-batch gathers once instead of twice;
    * ``shard_size`` (stages 1-3, HSDP): shard inside groups of ``shard_size`` ranks (a server)
      and replicate across the ``world_size // shard_size`` groups: the gathers and
      reduce-scatters stay in the group (``"shard"``); after each reduce-scatter the group's
      1/``shard_size`` of the gradient is ring all-reduced across the replicas
      (``"replicate"``);
    * ``offload`` (stages 1-3, ZeRO-Offload): the optimizer state and the gradient shards
      live in host memory and the optimizer steps on the CPU: each reduce-scattered gradient
      shard goes to the host, and the updated ``weight_bytes`` shard comes back once per step.
      The network traffic is unchanged.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be one of (0, 1, 2, 3), got {zero_stage!r}")
    if int(micro_batches) != micro_batches or micro_batches < 1:
        raise ValueError(f"micro_batches must be a whole number >= 1, got {micro_batches!r}")
    group = world_size if shard_size is None else shard_size
    if group < 1 or world_size % group:
        raise ValueError(f"shard_size must divide world_size {world_size}, got {shard_size!r}")
    if zero_stage == 0 and (group != world_size or offload):
        raise ValueError("stage 0 shards nothing: no shard_size or offload")
    replicas = world_size // group
    weights, grads = num_params * weight_bytes, num_params * grad_bytes
    if zero_stage == 0:
        return {"shard": ring_allreduce_bytes_sent(grads, world_size), "replicate": 0.0,
                "pcie": 0.0}  # fmt: skip
    # Gradient syncs per step: stages 0-1 (and 2-3 accumulating in full) once, else per
    # micro-batch; weight gathers: stages 1-2 once per step, stage 3 per micro-batch.
    syncs = micro_batches if zero_stage >= 2 and not accumulate_unsharded else 1
    if zero_stage < 3:
        gathers = 1
    else:
        gathers = micro_batches * (2 if reshard_after_forward else 1)
    shard = gathers * allgather_bytes_sent(weights, group) + syncs * reduce_scatter_bytes_sent(
        grads, group
    )
    replicate = syncs * ring_allreduce_bytes_sent(grads / group, replicas)
    pcie = syncs * grads / group + weights / group if offload else 0.0
    return {"shard": shard, "replicate": replicate, "pcie": pcie}


def sharded_step_bytes_sent(
    num_params: float,
    *,
    zero_stage: int,
    world_size: int,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    micro_batches: int = 1,
    accumulate_unsharded: bool = False,
    reshard_after_forward: bool = True,
    shard_size: int | None = None,
) -> float:
    """Bytes each rank sends per training step, for data parallelism with ZeRO stage 0-3,
    when each step accumulates the gradients of ``micro_batches`` micro-batches.

    * stage 0: one ring all-reduce of the accumulated gradients;
    * stage 1: reduce-scatter the accumulated gradients, each rank updates its shard, then
      all-gather the updated weights: the same volume as stage 0 when the byte widths match;
    * stage 2: the gradients are sharded, so they cannot accumulate in full on a rank: they
      are reduce-scattered after *every* micro-batch's backward, then the weights gathered
      once (DeepSpeed's maintainers, DeepSpeed issue #2252);
    * stage 3 (FSDP): for every micro-batch, all-gather the weights in the forward pass,
      again in the backward pass (they were freed), and reduce-scatter the gradients: with
      one micro-batch about 1.5 times stage 0, and ``micro_batches`` times that.

    ``accumulate_unsharded``, ``reshard_after_forward`` and ``shard_size`` (HSDP) trade memory
    for fewer transfers: see :func:`sharded_step_traffic`, whose ``"shard"`` and
    ``"replicate"`` bytes this adds up.

    Rajbhandari et al. 2020, Section 7 (one micro-batch per step).
    """
    traffic = sharded_step_traffic(
        num_params,
        zero_stage=zero_stage,
        world_size=world_size,
        weight_bytes=weight_bytes,
        grad_bytes=grad_bytes,
        micro_batches=micro_batches,
        accumulate_unsharded=accumulate_unsharded,
        reshard_after_forward=reshard_after_forward,
        shard_size=shard_size,
    )
    return traffic["shard"] + traffic["replicate"]


def allreduce_cost_terms(
    world_size: int, algorithm: str = "ring", *, gpus_per_server: int = 8
) -> tuple[float, float]:
    """The coefficients (a, b) of ``time = a * latency + b * message_bytes / bandwidth``.

    ``a`` counts the messages on the critical path, ``b`` the multiples of the buffer that
    cross one link one after the other; see :func:`allreduce_time` for each algorithm.
    Recursive doubling and Rabenseifner's algorithm on N ranks, N not a power of two: the
    terms of N' = 2**floor(log2 N) ranks, plus 2 and 2 (the extra ranks' buffers sent in
    before, the result sent back after).
    """
    _check(0, world_size)
    n = world_size
    if n == 1:
        return 0.0, 0.0
    if algorithm == "ring":
        return 2.0 * (n - 1), 2 * (n - 1) / n
    rounds = math.ceil(math.log2(n))
    halvings = n.bit_length() - 1  # log2 of N', the largest power of two <= N
    core = 2**halvings
    fold = 0.0 if core == n else 2.0  # extra ranks: whole buffer in, whole result out
    if algorithm == "recursive_doubling":
        return halvings + fold, halvings + fold
    if algorithm == "rabenseifner":
        return 2.0 * halvings + fold, 2 * (core - 1) / core + fold
    if algorithm == "tree":
        return 2.0 * rounds, 2.0 * rounds
    if algorithm == "parameter_server":
        return 2.0 * (n - 1), 2.0 * (n - 1)
    if algorithm == "double_binary_tree":
        return 2.0 * rounds, 2.0
    if algorithm == "hierarchical":
        servers, g = _servers(n, gpus_per_server)
        return 2.0 * (g - 1) + 2.0 * (servers - 1), 2 * (n - 1) / n
    raise ValueError(
        f"algorithm must be one of {ALLREDUCE_ALGORITHMS + LIBRARY_ALLREDUCE_ALGORITHMS}, "
        f"got {algorithm!r}"
    )


def fit_alpha_beta(
    message_bytes: Sequence[float],
    times_s: Sequence[float],
    *,
    world_size: int,
    algorithm: str = "ring",
) -> tuple[float, float]:
    """Fit the latency alpha (s) and bandwidth beta (bytes/s) of ``allreduce_time`` to times.

    The model ``t = a * alpha + b * M / beta`` is linear in (alpha, 1/beta). Measured sizes
    span several decades, so the fit minimises the squared *relative* error,
    sum_i ((model_i - t_i) / t_i)^2: ordinary least squares would let the largest messages
    decide alone and leave alpha to chance. Returns ``(alpha_s, beta_bytes_per_s)``; beta is
    ``inf`` if the fitted 1/beta is not positive (no bandwidth cost visible in the data).
    """
    sizes = np.asarray(message_bytes, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if sizes.shape != times.shape or sizes.ndim != 1 or len(sizes) < 2:
        raise ValueError("message_bytes and times_s must be 1-D and of equal length >= 2")
    if np.any(times <= 0):
        raise ValueError("times_s must be > 0")
    a, b = allreduce_cost_terms(world_size, algorithm)
    if a == 0:
        raise ValueError("a world of one rank sends nothing: there is nothing to fit")
    design = np.stack([np.full_like(sizes, a), b * sizes], axis=1) / times[:, None]
    (alpha_s, inverse_beta), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    beta = 1.0 / inverse_beta if inverse_beta > 0 else math.inf
    return float(alpha_s), float(beta)
