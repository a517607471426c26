"""Tests of distopt.ranks.sharded_norms_ranks: LAMB's per-layer norms and global-norm clipping on
sharded parameters, from an all-reduce of squared norms, equal the single-process ones."""

from __future__ import annotations

import math

import pytest
import torch

from distopt import launch
from distopt.ranks import sharded_norms_ranks

NUM_LAYERS = 6  # the MLP 16-64-64-8: three weight matrices and three biases
BYTES_PER_FLOAT64 = 8


def test_shard_bounds_cover_the_vector_in_order():
    for num_params, world_size in [(10, 3), (5768, 2), (3, 4), (7, 7)]:
        bounds = [
            sharded_norms_ranks.shard_bounds(num_params, world_size, r) for r in range(world_size)
        ]
        assert bounds[0][0] == 0 and bounds[-1][1] == num_params
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        sizes = [stop - start for start, stop in bounds]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        sharded_norms_ranks.shard_bounds(10, 2, 2)


def test_partial_sums_of_squares_add_up_to_the_layer_norms():
    sizes = [5, 1, 7, 3]
    flat = torch.randn(sum(sizes), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    whole = sharded_norms_ranks.layer_squared_norms(flat, 0, sizes)
    expected = torch.stack([chunk.pow(2).sum() for chunk in flat.split(sizes)])
    assert torch.allclose(whole, expected, rtol=1e-14)
    for world_size in (2, 3, 5):
        total = torch.zeros(len(sizes), dtype=torch.float64)
        for rank in range(world_size):
            start, stop = sharded_norms_ranks.shard_bounds(flat.numel(), world_size, rank)
            total += sharded_norms_ranks.layer_squared_norms(flat[start:stop], start, sizes)
        assert torch.allclose(total, expected, rtol=1e-14)


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_step_equals_the_single_process_one(world_size):
    reference = sharded_norms_ranks.reference_lamb_step()
    per_rank = launch(sharded_norms_ranks.sharded_lamb_step, world_size)
    assert per_rank[0]["start"] == 0 and per_rank[-1]["stop"] == len(reference["new_weights"])
    for report in per_rank:
        for key in ("layer_w_norms", "layer_u_norms", "layer_g_norms", "trust_ratios"):
            assert report[key] == pytest.approx(reference[key], rel=1e-12, abs=1e-15), key
        assert report["global_grad_norm"] == pytest.approx(reference["global_grad_norm"], rel=1e-12)
        start, stop = report["start"], report["stop"]
        for key in ("new_weights", "clipped_grad"):
            assert report[key] == pytest.approx(reference[key][start:stop], rel=1e-12, abs=1e-15)
        # Two all-reduces: the gradient's per-layer sums, then those of the weights and of u.
        assert report["allreduce_calls"] == 2
        assert report["allreduce_bytes"] == 3 * NUM_LAYERS * BYTES_PER_FLOAT64
    assert reference["clip_scale"] < 1  # the example does clip
    assert math.isclose(
        reference["global_grad_norm"], math.sqrt(sum(n * n for n in reference["layer_g_norms"]))
    )
