"""Tests of distopt.costs.tensor_layer: a tensor-parallel layer's compute against its traffic."""

import math

import pytest

from autograder.references.model_parallel import best_degree  # exercise 2's, the grader's
from distopt.costs import comm
from distopt.costs.tensor_layer import fastest_degree, layer_efficiency, layer_seconds
from distopt.units import GB, gbit_per_s

H100 = dict(flops_per_s=400e12, intra_bandwidth=450 * GB, inter_bandwidth=gbit_per_s(400),
            gpus_per_server=8)  # fmt: skip


def test_layer_seconds_hand_worked():
    # 1000 tokens, hidden 100, 4 GPUs at 1e12 FLOP/s on 1e9 B/s links, 16-bit values
    parts = layer_seconds(1000, 100, 4, flops_per_s=1e12, bandwidth=1e9)
    assert math.isclose(parts["compute"], 72 * 1000 * 100**2 / 4 / 1e12)
    assert math.isclose(parts["comm"], 4 * 2 * 3 / 4 * 1000 * 100 * 2 / 1e9)
    assert layer_seconds(1000, 100, 1, flops_per_s=1e12, bandwidth=1e9)["comm"] == 0


def test_compute_over_comm_is_the_closed_form():
    # 4.5 h beta / ((t - 1) F) with 16-bit values, whatever the number of tokens
    for tokens in (1, 4096, 10**6):
        parts = layer_seconds(tokens, 8192, 8, flops_per_s=400e12, bandwidth=450 * GB)
        ratio = parts["compute"] / parts["comm"]
        assert math.isclose(ratio, 4.5 * 8192 * 450 * GB / (7 * 400e12))


def test_traffic_is_four_ring_all_reduces():
    parts = layer_seconds(300, 64, 3, flops_per_s=1e12, bandwidth=1.0, bytes_per_value=4)
    assert math.isclose(parts["comm"], 4 * comm.ring_allreduce_bytes_sent(300 * 64 * 4, 3))


def test_fastest_degree_fills_the_server_and_stops_at_its_edge():
    t, seconds = fastest_degree(4096, 8192, 64, max_degree=64, **H100)
    assert t == 8
    parts = layer_seconds(4096, 8192, 8, flops_per_s=400e12, bandwidth=H100["intra_bandwidth"])
    assert math.isclose(seconds, parts["compute"] + parts["comm"])
    # a slow server link and a small layer: communication costs more than it saves
    t, _ = fastest_degree(2048, 512, 8, max_degree=8, **{**H100, "intra_bandwidth": 8 * GB})
    assert t == 1


def test_efficiency_is_compute_over_the_layer_time():
    parts = layer_seconds(1000, 100, 4, flops_per_s=1e12, bandwidth=1e9)
    got = layer_efficiency(1000, 100, 4, flops_per_s=1e12, bandwidth=1e9)
    assert math.isclose(got, parts["compute"] / (parts["compute"] + parts["comm"]))
    assert layer_efficiency(1000, 100, 1, flops_per_s=1e12, bandwidth=1e9) == 1.0


def test_best_degree_is_the_smallest_that_fits():
    # 100 GB of state, 30 GB per GPU: t = 4 of the divisors of 64 (t = 2 leaves 50 GB)
    t, efficiency = best_degree(
        4096, 8192, 64, state_bytes=100 * GB, memory_bytes=30 * GB, max_degree=64, **H100
    )
    assert t == 4
    assert math.isclose(
        efficiency,
        layer_efficiency(4096, 8192, 4, flops_per_s=400e12, bandwidth=H100["intra_bandwidth"]),
    )
    # a state that fits one GPU stays on one, where the latency objective would take 8
    assert best_degree(
        4096, 1024, 8, state_bytes=GB, memory_bytes=80 * GB, max_degree=64, **H100
    ) == (1, 1.0)
    assert fastest_degree(4096, 1024, 8, max_degree=64, **H100)[0] == 8


def test_best_degree_crosses_servers_only_when_it_must():
    t, efficiency = best_degree(
        4096, 32768, 256, state_bytes=1000 * GB, memory_bytes=80 * GB, max_degree=64, **H100
    )
    assert t == 16
    assert math.isclose(
        efficiency,
        layer_efficiency(4096, 32768, 16, flops_per_s=400e12, bandwidth=H100["inter_bandwidth"]),
    )


def test_best_degree_none_when_nothing_fits():
    assert best_degree(
        4096, 8192, 64, state_bytes=1e15, memory_bytes=80 * GB, max_degree=64, **H100
    ) == (None, 0.0)


def test_only_divisors_of_the_heads():
    t, _ = fastest_degree(4096, 8192, 12, max_degree=8, **H100)
    assert t == 6
    # 5 x 20 GB needed: 5 does not divide 12 heads, so 6
    t, _ = best_degree(
        4096, 8192, 12, state_bytes=100 * GB, memory_bytes=20 * GB, max_degree=8, **H100
    )
    assert t == 6
    with pytest.raises(ValueError):
        best_degree(4096, 8192, 12, state_bytes=1, memory_bytes=1, max_degree=0, **H100)
