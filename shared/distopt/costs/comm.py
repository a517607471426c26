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
) -> float:
    """Seconds for an all-reduce of ``message_bytes`` over ``world_size`` ranks.

    ``bandwidth`` is each rank's link speed in bytes/s and ``latency`` the per-message cost
    in seconds.

    * ``"ring"``: 2(N-1) messages of M/N bytes: 2(N-1) alpha + 2(N-1)/N M/beta. Bandwidth
      optimal, latency grows with N.
    * ``"recursive_doubling"``: ceil(log2 N) rounds, each exchanging the full message:
      log2(N) (alpha + M/beta). Latency optimal, sends log2(N) times the message.
    * ``"rabenseifner"``: a reduce-scatter by recursive halving (round k swaps half of what
      is left with a partner, M/2 + M/4 + ...), then an all-gather by recursive doubling:
      2 ceil(log2 N) alpha + 2(N-1)/N M/beta, the ring's bandwidth with logarithmic latency
      (Thakur, Rabenseifner & Gropp 2005; for N a power of two, the extra step otherwise
      needed is not counted). The model gives every pair of ranks its own link of speed
      beta; on a real network the far-apart partners of the halving share links, which is
      one reason libraries keep rings.
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
    if algorithm == "recursive_doubling":
        return math.ceil(math.log2(n)) * (latency + message_bytes / bandwidth)
    if algorithm == "rabenseifner":
        rounds = math.ceil(math.log2(n))
        return 2 * rounds * latency + ring_allreduce_bytes_sent(message_bytes, n) / bandwidth
    if algorithm in ("tree", "parameter_server"):
        messages, _ = allreduce_cost_terms(n, algorithm)
        return messages * (latency + message_bytes / bandwidth)
    raise ValueError(f"algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {algorithm!r}")


def bus_bandwidth(alg_bandwidth: float, world_size: int, collective: str = "all_reduce") -> float:
    """The nccl-tests bus bandwidth for a measured algorithm bandwidth (bytes/s).

    busbw = algbw x factor, with factor 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
    reduce_scatter and all_to_all, and 1 for broadcast and reduce.
    """
    if collective not in _BUS_FACTORS:
        raise ValueError(f"collective must be one of {tuple(_BUS_FACTORS)}, got {collective!r}")
    _check(0, world_size)
    return alg_bandwidth * _BUS_FACTORS[collective](world_size)


def sharded_step_bytes_sent(
    num_params: float,
    *,
    zero_stage: int,
    world_size: int,
    weight_bytes: float = 2,
    grad_bytes: float = 2,
    micro_batches: int = 1,
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

    Rajbhandari et al. 2020, Section 7 (one micro-batch per step).
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be one of (0, 1, 2, 3), got {zero_stage!r}")
    if int(micro_batches) != micro_batches or micro_batches < 1:
        raise ValueError(f"micro_batches must be a whole number >= 1, got {micro_batches!r}")
    gather = allgather_bytes_sent(num_params * weight_bytes, world_size)
    scatter = reduce_scatter_bytes_sent(num_params * grad_bytes, world_size)
    if zero_stage == 0:
        return ring_allreduce_bytes_sent(num_params * grad_bytes, world_size)
    if zero_stage == 1:
        return scatter + gather
    if zero_stage == 2:
        return micro_batches * scatter + gather
    return micro_batches * (2 * gather + scatter)


def allreduce_cost_terms(world_size: int, algorithm: str = "ring") -> tuple[float, float]:
    """The coefficients (a, b) of ``time = a * latency + b * message_bytes / bandwidth``.

    ``a`` counts the messages on the critical path, ``b`` the multiples of the buffer that
    cross one link one after the other; see :func:`allreduce_time` for each algorithm.
    """
    _check(0, world_size)
    n = world_size
    if n == 1:
        return 0.0, 0.0
    if algorithm == "ring":
        return 2.0 * (n - 1), 2 * (n - 1) / n
    rounds = math.ceil(math.log2(n))
    if algorithm == "recursive_doubling":
        return float(rounds), float(rounds)
    if algorithm == "rabenseifner":
        return 2.0 * rounds, 2 * (n - 1) / n
    if algorithm == "tree":
        return 2.0 * rounds, 2.0 * rounds
    if algorithm == "parameter_server":
        return 2.0 * (n - 1), 2.0 * (n - 1)
    raise ValueError(f"algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {algorithm!r}")


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
