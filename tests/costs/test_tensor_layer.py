"""Tests of distopt.costs.tensor_layer: a tensor-parallel layer's compute against its traffic."""

import math

import pytest

from distopt.costs import comm
from distopt.costs.tensor_layer import best_degree, layer_seconds
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


def test_best_degree_fills_the_server_and_stops_at_its_edge():
    t, seconds = best_degree(4096, 8192, 64, max_degree=64, **H100)
    assert t == 8
    link = H100["intra_bandwidth"]
    parts = layer_seconds(4096, 8192, 8, flops_per_s=400e12, bandwidth=link)
    assert math.isclose(seconds, parts["compute"] + parts["comm"])


def test_a_huge_layer_pays_for_crossing_servers():
    t, _ = best_degree(4096, 65536, 64, max_degree=64, **{**H100, "inter_bandwidth": 100 * GB})
    assert t > 8


def test_a_slow_server_link_keeps_tensor_parallelism_off():
    # PCIe-class links and a small layer: communication costs more than the compute it saves
    t, seconds = best_degree(2048, 512, 8, max_degree=8, **{**H100, "intra_bandwidth": 8 * GB})
    assert t == 1
    assert math.isclose(seconds, 72 * 2048 * 512**2 / 400e12)


def test_only_divisors_of_the_heads():
    t, _ = best_degree(4096, 8192, 12, max_degree=8, **H100)
    assert t == 6
    with pytest.raises(ValueError):
        best_degree(4096, 8192, 12, max_degree=0, **H100)
