"""Tests of distopt.costs.buckets: the closed form against the step-by-step simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distopt.costs import buckets, comm
from distopt.sim import overlap


def _simulated(backward_s, grad_bytes, num_buckets, net):
    layers_s = [backward_s / num_buckets] * num_buckets
    layers_bytes = [grad_bytes / num_buckets] * num_buckets
    timeline = overlap.simulate_backward(
        layers_s, layers_bytes, bucket_bytes=grad_bytes / num_buckets, **net
    )
    assert len(timeline.buckets) == num_buckets
    return timeline.end_s - sum(layers_s)


def test_closed_form_equals_the_simulated_timeline():
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(1, 60))
        backward_s = float(10 ** rng.uniform(-3, 0))
        grad_bytes = float(10 ** rng.uniform(5, 10))
        net = dict(
            world_size=int(rng.choice([1, 2, 8, 64, 1024])),
            bandwidth=float(10 ** rng.uniform(9, 11)),
            latency=float(10 ** rng.uniform(-6, -3)),
        )
        got = buckets.exposed_allreduce_s(backward_s, grad_bytes, num_buckets=k, **net)
        assert math.isclose(got, _simulated(backward_s, grad_bytes, k, net), rel_tol=1e-9,
                            abs_tol=1e-15)  # fmt: skip


def test_one_bucket_exposes_the_whole_allreduce_and_a_fast_network_only_the_last():
    net = dict(world_size=8, bandwidth=1e10, latency=1e-5)
    whole = comm.allreduce_time(1e9, **net)
    assert buckets.exposed_allreduce_s(0.5, 1e9, num_buckets=1, **net) == whole
    last = comm.allreduce_time(1e9 / 10, **net)
    assert math.isclose(buckets.exposed_allreduce_s(10.0, 1e9, num_buckets=10, **net), last)
    slow = buckets.exposed_allreduce_s(0.01, 1e9, num_buckets=10, **net)
    assert math.isclose(slow, 10 * last - 9 * 0.001)


def test_tokens_threshold_is_where_bucket_compute_equals_its_bandwidth_time():
    n, beta, flops = 64, 50e9, 100e12
    tokens = buckets.tokens_to_hide_allreduce(n, bandwidth=beta, flops_per_s=flops)
    params = 1e8
    compute_s = 4 * params * tokens / flops
    assert math.isclose(compute_s, comm.allreduce_time(4 * params, n, bandwidth=beta))
    assert buckets.tokens_to_hide_allreduce(1, bandwidth=beta, flops_per_s=flops) == 0


def test_refuses_nonsense():
    with pytest.raises(ValueError):
        buckets.exposed_allreduce_s(1.0, 1e6, num_buckets=0, world_size=2, bandwidth=1e9)
    with pytest.raises(ValueError):
        buckets.exposed_allreduce_s(-1.0, 1e6, num_buckets=2, world_size=2, bandwidth=1e9)


def test_algorithm_reaches_the_bucket_and_the_tokens_law():
    net = dict(world_size=64, bandwidth=50e9, latency=1e-5)
    for algorithm in ("ring", "rabenseifner", "double_binary_tree"):
        got = buckets.exposed_allreduce_s(0.1, 1.2e9, num_buckets=500, algorithm=algorithm, **net)
        simulated = _simulated(0.1, 1.2e9, 500, dict(net, algorithm=algorithm))
        assert math.isclose(got, simulated, rel_tol=1e-9), algorithm
    ring = buckets.exposed_allreduce_s(0.1, 1.2e9, num_buckets=500, **net)
    rab = buckets.exposed_allreduce_s(0.1, 1.2e9, num_buckets=500, algorithm="rabenseifner", **net)
    assert rab < ring / 3  # 2.4 MB buckets: the ring's 126 latencies against 12


def test_tokens_threshold_with_latency_is_where_a_bucket_is_hidden_exactly():
    n, beta, alpha, flops, bucket = 64, 50e9, 1e-5, 100e12, 25 * 2**20
    params = 3e8
    for algorithm in ("ring", "rabenseifner"):
        tokens = buckets.tokens_to_hide_allreduce(
            n, bandwidth=beta, flops_per_s=flops, latency=alpha, bucket_bytes=bucket,
            algorithm=algorithm,
        )  # fmt: skip
        fill_s = 4 * params * tokens / flops / (4 * params / bucket)  # one bucket's compute
        c = comm.allreduce_time(bucket, n, bandwidth=beta, latency=alpha, algorithm=algorithm)
        assert math.isclose(fill_s, c), algorithm
        bandwidth_only = buckets.tokens_to_hide_allreduce(n, bandwidth=beta, flops_per_s=flops)
        a, _ = comm.allreduce_cost_terms(n, algorithm)
        assert math.isclose(tokens - bandwidth_only, a * alpha * flops / bucket)
