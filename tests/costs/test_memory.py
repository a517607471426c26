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
