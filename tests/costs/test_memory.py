import math

import pytest

from distopt.costs import memory
from distopt.units import GB

PARAMS_70B = 70e9


@pytest.mark.parametrize(
    ("stage", "expected_gb"),
    [(0, 1120.0), (1, 293.125), (2, 155.3125), (3, 17.5)],
)
def test_lesson_table_at_64_gpus(stage, expected_gb):
    got = memory.training_state_bytes(PARAMS_70B, zero_stage=stage, world_size=64)
    assert got / GB == pytest.approx(expected_gb, rel=1e-12)


def test_breakdown_shards_what_each_stage_says():
    kw = dict(world_size=8, weight_bytes=2, grad_bytes=2, optimizer_bytes=12)
    n = 1000
    assert memory.training_state_breakdown(n, zero_stage=0, **kw) == {
        "weights": 2000,
        "gradients": 2000,
        "optimizer": 12000,
    }
    assert memory.training_state_breakdown(n, zero_stage=1, **kw) == {
        "weights": 2000,
        "gradients": 2000,
        "optimizer": 1500,
    }
    assert memory.training_state_breakdown(n, zero_stage=2, **kw) == {
        "weights": 2000,
        "gradients": 250,
        "optimizer": 1500,
    }
    assert memory.training_state_breakdown(n, zero_stage=3, **kw) == {
        "weights": 250,
        "gradients": 250,
        "optimizer": 1500,
    }


def test_one_rank_shards_nothing():
    for stage in memory.ZERO_STAGES:
        assert memory.training_state_bytes(123, zero_stage=stage, world_size=1) == 123 * 16


@pytest.mark.parametrize("bad", [dict(zero_stage=4), dict(world_size=0), dict(world_size=2.5)])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        memory.training_state_bytes(10, **bad)


def test_activation_table_2_rows():
    s, b, h, a, t = 2048, 4, 12288, 96, 8
    sbh = s * b * h
    act = memory.activation_bytes_per_layer
    assert act(s, b, h, a) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(s, b, h, a, tensor_parallel=t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t))
    )
    assert act(s, b, h, a, tensor_parallel=t, sequence_parallel=True) == pytest.approx(
        sbh * (34 / t + 5 * a * s / (h * t))
    )
    assert act(s, b, h, a, tensor_parallel=t, recompute="selective") == pytest.approx(
        sbh * (10 + 24 / t)
    )
    assert act(
        s, b, h, a, tensor_parallel=t, sequence_parallel=True, recompute="selective"
    ) == pytest.approx(sbh * 34 / t)
    assert act(s, b, h, a, recompute="full") == 2 * sbh
    assert act(s, b, h, a, tensor_parallel=t, sequence_parallel=True, recompute="full") == (
        2 * sbh / t
    )


def test_activation_recompute_mode_is_checked():
    with pytest.raises(ValueError, match="recompute"):
        memory.activation_bytes_per_layer(1, 1, 1, 1, recompute="some")


@pytest.mark.parametrize("world_size", [1, 2, 8])
@pytest.mark.parametrize("layers", [[10], [5, 50, 7], [100, 100, 100, 1]])
def test_fully_sharded_peak_is_a_shard_plus_one_layer(layers, world_size):
    events = memory.simulate_fully_sharded_step(layers, world_size)
    shard = sum(layers) * 16 / world_size
    assert events[0].bytes_in_use == shard
    assert events[-1].bytes_in_use == pytest.approx(shard)  # everything gathered was freed
    peak = max(e.bytes_in_use for e in events)
    assert peak == pytest.approx(shard + max(layers) * (2 + 2))


def test_prefetch_holds_two_layers():
    layers = [10, 20, 30, 40]
    events = memory.simulate_fully_sharded_step(layers, 4, prefetch=True)
    shard = sum(layers) * 16 / 4
    peak = max(e.bytes_in_use for e in events)
    # backward of layer 3 (weights + gradient) while layer 2 is already gathered
    assert peak == pytest.approx(shard + 40 * 4 + 30 * 2)
    assert events[-1].bytes_in_use == pytest.approx(shard)
    assert not math.isclose(peak, shard + 40 * 4)


def test_logits_are_float32_by_default():
    assert memory.logits_bytes(4096, 1, 32_000) == 4096 * 32_000 * 4  # 524,288,000 bytes
    assert memory.logits_bytes(10, 3, 7, bytes_per_value=2) == 420
    with pytest.raises(ValueError, match="vocab"):
        memory.logits_bytes(10, 1, 0)


def test_peak_of_a_7b_model_with_zero3_by_hand():
    # 7B parameters, 32 layers, hidden 4096, 32 heads, 4096 tokens, ZeRO-3 on 8 GPUs.
    sbh = 4096 * 4096
    parts = memory.peak_training_breakdown(
        7e9, 32, 4096, 1, 4096, 32, zero_stage=3, world_size=8, recompute="selective"
    )
    assert parts == {
        "state": 14e9,  # 16 bytes x 7e9 / 8
        "activations": 31 * 34 * sbh + 194 * sbh,  # 31 stored + 1 layer in full
        "logits": 4 * 4096 * 32_000,  # float32, the default vocabulary of 32,000
        "gathered": 12 * 4096**2 * 4,  # one layer's 16-bit weights and gradients
    }
    peak = memory.peak_training_bytes(
        7e9, 32, 4096, 1, 4096, 32, zero_stage=3, world_size=8, recompute="selective"
    )
    assert peak == 36_267_559_936


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_only_zero3_gathers_a_layer(stage):
    parts = memory.peak_training_breakdown(
        1e9, 4, 128, 2, 256, 4, zero_stage=stage, world_size=4, vocab=1000
    )
    assert parts["gathered"] == 0
    assert parts["state"] == memory.training_state_bytes(1e9, zero_stage=stage, world_size=4)
    assert parts["logits"] == 128 * 2 * 1000 * 4


def test_gathered_layer_agrees_with_the_planner():
    from distopt.costs import planner

    model = planner.ModelSpec(layers=24, hidden=2048, heads=16, vocab=50_304, seq_len=2048)
    layout = planner.Layout(
        tensor=1, pipeline=1, data=8, zero_stage=3, micro_batch=1, recompute=False
    )
    planned = planner.memory_per_gpu(model, layout, global_batch=8)
    parts = memory.peak_training_breakdown(
        model.num_params, 24, 2048, 1, 2048, 16, zero_stage=3, world_size=8, vocab=50_304
    )
    assert parts["gathered"] == planned["gathered"]
    assert parts["state"] == planned["state"]


def test_peak_refuses_zero_layers():
    with pytest.raises(ValueError, match="num_layers"):
        memory.peak_training_bytes(1e9, 0, 128, 1, 256, 4, zero_stage=0, world_size=1)
