"""Tests of distopt.costs.planner: the enumeration, the memory filter and the ranking."""

import math

import pytest

from distopt.costs import memory
from distopt.costs.planner import (
    ClusterSpec,
    Layout,
    ModelSpec,
    data_parallel_seconds,
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
    # The lesson's choice for a 1B model on 64 GPUs: sharded data parallelism only. With
    # micro-batches of 4 (2 per step) everything hides; ZeRO-2 ties on time but re-sends the
    # gradients per micro-batch, so ZeRO-1 (which already shards the optimizer state) wins.
    best = ranked[0][0]
    assert (best.tensor, best.pipeline, best.data, best.zero_stage) == (1, 1, 64, 1)


def test_only_the_last_micro_batch_hides_the_all_reduce():
    """Plain DP, micro-batch 1: 8 micro-batches, 2/3 of one of them hides the all-reduce."""
    plain = Layout(1, 1, 64, 0, 1, False)
    parts = step_time_breakdown(ONE_B, CLUSTER, plain, 512)
    allreduce = 2 * 63 / 64 * 2 * ONE_B.num_params / gbit_per_s(400)  # ~0.104 s
    assert parts["data"] == pytest.approx(allreduce - 2 / 3 * parts["compute"] / 8)
    assert parts["data"] == pytest.approx(0.07, abs=0.005)
    # the same batch in one micro-batch per GPU would hide it whole
    assert data_parallel_seconds(ONE_B, CLUSTER, plain, 64, parts["compute"]) == 0


def test_zero2_loses_to_zero1_with_many_micro_batches():
    times = {
        stage: sum(
            step_time_breakdown(ONE_B, CLUSTER, Layout(1, 1, 64, stage, 1, False), 512).values()
        )
        for stage in (1, 2)
    }
    assert times[2] > times[1] + 0.1  # 8 reduce-scatters instead of 1


def test_zero3_regathers_the_weights_for_every_micro_batch():
    """GPT-3 on tensor 8 x FSDP 8: ~0.9 TB per GPU per step, ~18 s at 400 Gb/s."""
    layout = Layout(8, 1, 8, 3, 1, False)
    parts = step_time_breakdown(GPT3, CLUSTER, layout, 64)
    traffic_s = 3 * 8 * 7 / 8 * 2 * GPT3.num_params / 8 / gbit_per_s(400)
    assert traffic_s == pytest.approx(18.3, abs=0.2)
    assert parts["data"] > 0.6 * traffic_s  # one micro-batch's compute hides little of it
    ranked = plan(GPT3, CLUSTER, 64)
    best = ranked[0][0]
    assert (best.tensor, best.pipeline) == (8, 8)  # ZeRO-3 no longer wins


def test_no_zero_2_or_3_with_a_pipeline():
    found = list(layouts(GPT3, CLUSTER, 64))
    assert {lay.zero_stage for lay in found if lay.pipeline == 1} == {0, 1, 2, 3}
    assert {lay.zero_stage for lay in found if lay.pipeline > 1} == {0, 1}


def test_gpt3_needs_model_parallelism():
    ranked = plan(GPT3, CLUSTER, 64, zero_stages=(0, 1))
    assert all(layout.tensor * layout.pipeline > 1 for layout, _, _ in ranked)
    best = ranked[0][0]
    assert best.tensor > 1 and best.pipeline > 1


def test_unknown_zero_stage_raises():
    with pytest.raises(ValueError, match="zero_stage"):
        plan(ONE_B, CLUSTER, 512, zero_stages=(5,))


def test_tensor_in_server_keeps_tensor_groups_inside_a_server():
    four = ClusterSpec(64, 4, 80 * GB, 450 * GB, gbit_per_s(400), 400e12)
    kept = list(layouts(GPT3, four, 64, tensor_in_server=True))
    assert kept and all(4 % layout.tensor == 0 for layout in kept)
    every = list(layouts(GPT3, four, 64))
    assert set(kept) == {layout for layout in every if 4 % layout.tensor == 0}
    ranked = plan(GPT3, four, 64, zero_stages=(0, 1), tensor_in_server=True)
    assert [row[0] for row in ranked] == [
        row[0] for row in plan(GPT3, four, 64, zero_stages=(0, 1)) if 4 % row[0].tensor == 0
    ]
