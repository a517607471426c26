"""Tests of distopt.ranks.ddp_ranks: real DDP runs (gloo, CPU) against single-process training."""

from __future__ import annotations

import numpy as np
import pytest

from distopt import launch
from distopt.problems.mlp import build_mlp
from distopt.ranks.ddp_ranks import (
    DDPConfig,
    time_all_reduce_by_group_size,
    train_ddp,
    train_ddp_and_time_all_reduce,
    train_single_process,
)

CONFIG = DDPConfig(num_steps=4)
# float32 training: DDP sums the shards' gradients in another order than one process does.
TOLERANCE = 1e-6
SIZES = [4, 4096, 65536]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"world_size={n}")
def per_rank(request: pytest.FixtureRequest) -> list[dict]:
    """One launch per world size, shared by the tests of this module (spawning is slow)."""
    return launch(train_ddp_and_time_all_reduce, request.param, CONFIG, SIZES, 2)


def test_ddp_matches_single_process_training(per_rank):
    reference = train_single_process(CONFIG)
    for report in per_rank:
        assert len(report["weights"]) == len(reference)
        for got, expected in zip(report["weights"], reference, strict=True):
            assert got.shape == expected.shape
            assert np.abs(got - expected).max() < TOLERANCE


def test_ranks_agree_and_training_moved_the_weights(per_rank):
    for report in per_rank[1:]:
        for a, b in zip(report["weights"], per_rank[0]["weights"], strict=True):
            np.testing.assert_array_equal(a, b)
    untrained = build_mlp(CONFIG.layer_sizes, seed=CONFIG.seed).parameters()
    assert any(
        np.abs(a - b.detach().numpy()).max() > 1e-3
        for a, b in zip(per_rank[0]["weights"], untrained, strict=True)
    )


def test_buckets_start_with_the_last_layer(per_rank):
    buckets = per_rank[0]["buckets"]
    assert len(buckets) == 2, buckets  # the small bucket_cap_mb splits this MLP in two
    assert buckets[0][0] == "4.bias"
    assert sorted(name for bucket in buckets for name in bucket) == sorted(
        ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    )


def test_all_reduce_timing_report(per_rank):
    for report in per_rank:
        times = report["all_reduce_s"]
        assert len(times) == len(SIZES)
        assert all(isinstance(t, float) and 0 < t < 10 for t in times)


def test_group_timings_cover_exactly_the_groups_a_rank_belongs_to():
    per_rank = launch(time_all_reduce_by_group_size, 3, [4096, 65536], (1, 2, 3), 2)
    assert [sorted(timings) for timings in per_rank] == [[1, 2, 3], [2, 3], [3]]
    for timings in per_rank:
        assert all(len(times) == 2 and all(0 < t < 10 for t in times) for times in timings.values())


def test_a_group_larger_than_the_launch_is_refused():
    with pytest.raises(ValueError, match="group_sizes must lie in 1..2"):
        time_all_reduce_by_group_size(0, 2, [4096], (2, 3))


def test_uneven_global_batch_is_refused():
    # Refused before any collective, so no process group is needed to see it.
    with pytest.raises(ValueError, match="divide"):
        train_ddp(0, 3, DDPConfig(global_batch=64))
