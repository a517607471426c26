"""Tests of distopt.ranks.sharding_ranks: measured per-rank state of real ZeRO-1 and FSDP2 runs."""

from __future__ import annotations

import math

import pytest

from distopt import launch
from distopt.problems.mlp import build_mlp
from distopt.ranks.sharding_ranks import DEFAULT_LAYER_SIZES, measure_sharded_state

BYTES_PER_FLOAT32 = 4
# Adam keeps two moments (exp_avg, exp_avg_sq) per parameter.
ADAM_MOMENTS_PER_PARAM = 2


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"world_size={n}")
def per_rank(request: pytest.FixtureRequest) -> list[dict]:
    """One real launch per world size, shared by the tests of this module (it is slow)."""
    return launch(measure_sharded_state, request.param)


def _full_model_bytes() -> int:
    return BYTES_PER_FLOAT32 * sum(p.numel() for p in build_mlp(DEFAULT_LAYER_SIZES).parameters())


def _shard_bounds_bytes(world_size: int) -> tuple[int, int]:
    """Fewest and most parameter bytes a rank can hold when each tensor is split on dim 0.

    A tensor of d0 rows is cut into chunks of ceil(d0 / world_size) rows, so the last ranks
    may hold fewer rows (or none): that padding is the slack allowed around full / world_size.
    """
    most_bytes = 0
    padding_bytes = 0
    for param in build_mlp(DEFAULT_LAYER_SIZES).parameters():
        rows = param.shape[0]
        row_bytes = BYTES_PER_FLOAT32 * param.numel() // rows
        chunk_rows = math.ceil(rows / world_size)
        most_bytes += chunk_rows * row_bytes
        padding_bytes += (chunk_rows * world_size - rows) * row_bytes
    return _full_model_bytes() // world_size - padding_bytes, most_bytes


def test_report_format(per_rank: list[dict]) -> None:
    world_size = len(per_rank)
    num_params = sum(p.numel() for p in build_mlp(DEFAULT_LAYER_SIZES).parameters())
    assert num_params == 528_138  # Linear 256-512-512-256-10 with biases
    for rank, report in enumerate(per_rank):
        assert report["rank"] == rank and report["world_size"] == world_size
        assert report["num_params"] == num_params
        for method in ("zero1", "fsdp2"):
            assert set(report[method]) == {"param_bytes", "grad_bytes", "optimizer_bytes"}
            assert all(type(value) is int for value in report[method].values())
        assert set(report["zero1_comm"]) == {
            "allreduce_bytes",
            "allreduce_calls",
            "broadcast_bytes",
            "broadcast_calls",
            "broadcast_src_bytes",
        }
        assert all(type(value) is int for value in report["zero1_comm"].values())
        assert type(report["max_abs_diff_zero1"]) is float
        assert type(report["max_abs_diff_fsdp2"]) is float


def test_both_methods_match_single_process_adam(per_rank: list[dict]) -> None:
    for report in per_rank:
        assert report["max_abs_diff_zero1"] < 1e-5
        assert report["max_abs_diff_fsdp2"] < 1e-5


def test_fsdp2_shards_params_grads_and_optimizer_state(per_rank: list[dict]) -> None:
    world_size = len(per_rank)
    full_bytes = _full_model_bytes()
    fewest_bytes, most_bytes = _shard_bounds_bytes(world_size)
    for kind, full_kind_bytes in (
        ("param_bytes", full_bytes),
        ("grad_bytes", full_bytes),
        ("optimizer_bytes", ADAM_MOMENTS_PER_PARAM * full_bytes),
    ):
        held = [report["fsdp2"][kind] for report in per_rank]
        assert sum(held) >= full_kind_bytes, kind
        scale = full_kind_bytes // full_bytes  # 2 for the two Adam moments
        for rank_bytes in held:
            assert scale * fewest_bytes <= rank_bytes <= scale * most_bytes, (kind, held)
    for report in per_rank:
        # Each rank's gradient shard and Adam moments line up with its parameter shard.
        fsdp2 = report["fsdp2"]
        assert fsdp2["grad_bytes"] == fsdp2["param_bytes"]
        assert fsdp2["optimizer_bytes"] == ADAM_MOMENTS_PER_PARAM * fsdp2["param_bytes"]


def test_zero1_shards_only_the_optimizer_state(per_rank: list[dict]) -> None:
    full_bytes = _full_model_bytes()
    num_params = per_rank[0]["num_params"]
    for report in per_rank:
        assert report["zero1"]["param_bytes"] == full_bytes
        assert report["zero1"]["grad_bytes"] == full_bytes
    optimizer_bytes = [report["zero1"]["optimizer_bytes"] for report in per_rank]
    # Every parameter's moments live on exactly one rank...
    assert sum(optimizer_bytes) == ADAM_MOMENTS_PER_PARAM * BYTES_PER_FLOAT32 * num_params
    # ...and no rank holds them all (ZeRO partitions whole tensors, so not evenly).
    assert max(optimizer_bytes) < sum(optimizer_bytes)
    assert min(optimizer_bytes) > 0


def test_zero1_all_reduces_the_gradients_then_broadcasts_the_parameters(
    per_rank: list[dict],
) -> None:
    # DDP all-reduces every gradient (float32, as big as the model), then
    # ZeroRedundancyOptimizer broadcasts every parameter from the rank that updated it:
    # the paper's reduce-scatter + all-gather would hand over the same bytes in two halves.
    full_bytes = _full_model_bytes()
    num_tensors = len(list(build_mlp(DEFAULT_LAYER_SIZES).parameters()))
    for report in per_rank:
        comm = report["zero1_comm"]
        assert comm["allreduce_bytes"] == full_bytes
        assert comm["allreduce_calls"] >= 1  # DDP's gradient buckets
        assert comm["broadcast_bytes"] == full_bytes
        assert comm["broadcast_calls"] == num_tensors  # one broadcast per parameter tensor
        # A rank is the source of exactly the tensors whose Adam moments it holds.
        assert (
            ADAM_MOMENTS_PER_PARAM * comm["broadcast_src_bytes"]
            == (report["zero1"]["optimizer_bytes"])
        )
    assert sum(r["zero1_comm"]["broadcast_src_bytes"] for r in per_rank) == full_bytes
