"""Tests of distopt.costs.planner: the enumeration, the memory filter and the ranking."""

import math

import pytest

from distopt.costs import memory
from distopt.costs.planner import (
    ClusterSpec,
    Layout,
    ModelSpec,
    layouts,
    memory_per_gpu,
    plan,
    step_time_breakdown,
)
from distopt.units import GB, gbit_per_s

CLUSTER = ClusterSpec(64, 8, 80 * GB, 450 * GB, gbit_per_s(400), 400e12)
ONE_B = ModelSpec(layers=24, hidden=2048, heads=16, vocab=50304, seq_len=2048)
GPT3 = ModelSpec(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048)


def test_layouts_cover_the_cluster():
    found = list(layouts(ONE_B, CLUSTER, 512))
    assert found
    for layout in found:
        assert layout.tensor * layout.pipeline * layout.data == 64
        assert 16 % layout.tensor == 0 and 24 % layout.pipeline == 0
        assert 512 % (layout.data * layout.micro_batch) == 0


def test_single_gpu_memory_is_state_plus_activations():
    layout = Layout(1, 1, 1, 0, 1, False)
    parts = memory_per_gpu(ONE_B, layout, 1)
    assert math.isclose(parts["state"], 16 * ONE_B.num_params)
    per_layer = memory.activation_bytes_per_layer(2048, 1, 2048, 16)
    assert math.isclose(parts["activations"], 24 * per_layer)


def test_single_gpu_time_is_compute_only():
    one = ClusterSpec(1, 8, 80 * GB, 450 * GB, gbit_per_s(400), 400e12)
    parts = step_time_breakdown(ONE_B, one, Layout(1, 1, 1, 0, 1, False), 8)
    assert parts["bubble"] == parts["tensor"] == parts["pipeline"] == parts["data"] == 0


def test_plan_is_sorted_and_fits():
    ranked = plan(ONE_B, CLUSTER, 512)
    times = [seconds for _, _, seconds in ranked]
    assert times == sorted(times)
    assert all(peak <= CLUSTER.memory_bytes for _, peak, _ in ranked)
    # The lesson's choice for a 1B model on 64 GPUs: sharded data parallelism only.
    best = ranked[0][0]
    assert (best.tensor, best.pipeline, best.data) == (1, 1, 64)


def test_gpt3_needs_model_parallelism():
    ranked = plan(GPT3, CLUSTER, 64, zero_stages=(0, 1))
    assert all(layout.tensor * layout.pipeline > 1 for layout, _, _ in ranked)
    best = ranked[0][0]
    assert best.tensor > 1 and best.pipeline > 1


def test_unknown_zero_stage_raises():
    with pytest.raises(ValueError, match="zero_stage"):
        plan(ONE_B, CLUSTER, 512, zero_stages=(5,))
