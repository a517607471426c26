"""How much of DDP's bucketed gradient all-reduce the backward pass hides: a closed form.

Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
Section 3.2: the backward pass fills gradient buckets last layer first and DDP all-reduces
each bucket as soon as it is full, while the backward pass goes on. The network carries one
all-reduce at a time, in bucket order (the rules of :mod:`distopt.sim.overlap`, which plays
the same schedule out step by step).

With K equal buckets, each filled by ``b = backward_s / K`` seconds of backward compute and
all-reduced (:func:`distopt.costs.comm.allreduce_time`, the ring unless ``algorithm`` says
otherwise) in ``c`` seconds, bucket i is
ready at ``i b`` and the network finishes at ``max_i (i b + (K - i + 1) c)``: the latest
bucket to start a queue that runs without a pause to the end. After the backward pass
(``K b``) that leaves

    exposed = c + (K - 1) max(0, c - b)

* ``c <= b``: every all-reduce ends before the next bucket is ready; only the last one, which
  cannot start before the backward pass ends, is exposed: ``c``.
* ``c > b``: the network is the bottleneck; it falls ``c - b`` further behind with each
  bucket, and the exposed time is all the communication minus all but one bucket's compute.

For a model of P parameters, T tokens per GPU and a backward at F FLOP/s (about 4 P T FLOPs)
with 4-byte gradients in buckets of B bytes, and an all-reduce of ``a alpha + b_N M / beta``
(:func:`distopt.costs.comm.allreduce_cost_terms`; the ring's ``b_N = 2 (N-1)/N``),
``c <= b`` needs

    T >= b_N F / beta + a alpha F / B

tokens per GPU, whatever P: the bandwidth part, ``2 (N-1)/N F / beta`` for the ring and
Rabenseifner's algorithm alike, and a latency part that grows with the latencies per
all-reduce (``2 (N-1)`` for the ring, ``2 log2 N`` for Rabenseifner's) and shrinks with the
bucket (:func:`tokens_to_hide_allreduce`).
"""

from __future__ import annotations

import math

from distopt.costs import comm

__all__ = ["exposed_allreduce_s", "tokens_to_hide_allreduce"]


def exposed_allreduce_s(
    backward_s: float,
    grad_bytes: float,
    *,
    num_buckets: int,
    world_size: int,
    bandwidth: float,
    latency: float = 0.0,
    algorithm: str = "ring",
) -> float:
    """Seconds of gradient all-reduce still running when the backward pass ends.

    backward_s  -- the whole backward pass, seconds, spread evenly over the buckets
    grad_bytes  -- all the gradients, bytes, cut into ``num_buckets`` equal buckets
    num_buckets -- K >= 1 (1: the naive scheme, one all-reduce after the backward pass)
    world_size, bandwidth (bytes/s), latency (s), algorithm -- for ``comm.allreduce_time``
    Equals ``simulate_backward(...).end_s - backward_s`` for K equal layers, one per bucket.
    """
    if not isinstance(num_buckets, int) or num_buckets < 1:
        raise ValueError(f"num_buckets must be an int >= 1, got {num_buckets!r}")
    if backward_s < 0:
        raise ValueError(f"backward_s must be >= 0, got {backward_s!r}")
    compute_s = backward_s / num_buckets  # fills one bucket
    bucket_s = comm.allreduce_time(
        grad_bytes / num_buckets,
        world_size,
        bandwidth=bandwidth,
        latency=latency,
        algorithm=algorithm,
    )
    return bucket_s + (num_buckets - 1) * max(0.0, bucket_s - compute_s)


def tokens_to_hide_allreduce(
    world_size: int,
    *,
    bandwidth: float,
    flops_per_s: float,
    grad_bytes_per_param: float = 4,
    latency: float = 0.0,
    bucket_bytes: float = math.inf,
    algorithm: str = "ring",
) -> float:
    """Tokens per GPU and step above which a bucket's all-reduce is no longer than the
    backward compute that fills it.

    Per parameter, the backward takes 4 T / F seconds and the all-reduce of a bucket of
    ``bucket_bytes`` costs ``b g / beta + a alpha g / bucket_bytes`` (g gradient bytes per
    parameter, (a, b) of ``comm.allreduce_cost_terms``), so
    T = F / 4 * (b g / beta + a alpha g / bucket_bytes). ``latency=0`` or
    ``bucket_bytes=math.inf``: the bandwidth part alone, 2 (N-1)/N g F / (4 beta) for the ring.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size!r}")
    if not bucket_bytes > 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes!r}")
    messages, buffers = comm.allreduce_cost_terms(world_size, algorithm)
    per_param_s = buffers * grad_bytes_per_param / bandwidth
    if latency:
        per_param_s += messages * latency * grad_bytes_per_param / bucket_bytes
    return flops_per_s / 4 * per_param_s
