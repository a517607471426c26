"""Tests of distopt.ranks.fsdp_ranks: the ZeRO-3 bench (its layout, its refusals, its meter
of full-weight buffers) and FSDP2's measured traffic and gathered memory."""

import pytest
import torch
import torch.distributed as dist

from distopt import launch
from distopt.problems.shards import ShardedProblem, flat
from distopt.ranks.fsdp_ranks import FsdpBench, FullWeightMeter, measure_fsdp2, run_on_bench

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_shards_of_all_ranks_are_the_padded_flat_layers():
    bench = FsdpBench(ShardedProblem(shard_sizes=(3, 3, 3), layer_sizes=(5, 7, 2)))
    assert bench.layer_shapes == ((7, 5), (2, 7))
    assert [bench.layer_numel(i) for i in range(2)] == [42, 16]
    assert [bench.shard_numel(i) for i in range(2)] == [14, 6]  # 16 -> 18: two zeros
    assert bench.padded_param_bytes() == 8 * (42 + 18)
    assert bench.largest_layer_bytes() == 8 * 42
    model = bench.problem.new_model(0)
    whole = torch.cat([torch.cat([bench.start_shard(r, i) for r in range(3)]) for i in range(2)])
    padded = torch.cat([bench.padded(i, v) for i, v in enumerate(bench.layer_vectors(model))])
    assert torch.equal(whole, padded)
    assert torch.equal(padded[42:58], flat(list(model.parameters()))[42:])
    assert torch.equal(padded[58:], torch.zeros(2, dtype=torch.float64))


def test_the_meter_counts_buffers_and_their_views_while_alive():
    meter = FullWeightMeter()
    first = torch.zeros(10, dtype=torch.float64)
    meter.track(first, 0)
    view = first[:4].view(2, 2)
    del first  # the view keeps the buffer alive
    second = torch.zeros(6, dtype=torch.float64)
    meter.track(second, 1)
    assert (meter.peak_bytes, meter.peak_layers, meter.handed_out) == (128, (0, 1), 2)
    assert meter.owns(view) and meter.owns(second) and not meter.owns(torch.zeros(3))
    del view, second
    meter.track(torch.zeros(12, dtype=torch.float64), 2)  # alone now
    assert meter.peak_bytes == 128 and not meter.alive


def _peek(rank, world_size, bench):
    return bench.start_shard((rank + 1) % world_size, 0)


def test_inside_a_rank_the_bench_hands_out_its_own_shard_only():
    with pytest.raises(Exception, match="ForeignShardError"):
        launch(_peek, 2, FsdpBench(ShardedProblem(shard_sizes=(2, 2), steps=1)))


def _gather_into(rank, world_size, bench, keep):
    """Gather layer 0 twice into bench buffers; ``keep`` the first while gathering again."""
    shard = bench.start_shard(rank, 0)
    first = bench.full_buffer(0)
    dist.all_gather_into_tensor(first, shard)
    if not keep:
        del first
    again = bench.full_buffer(0)
    dist.all_gather_into_tensor(again, shard)
    elsewhere = torch.empty_like(again)
    dist.all_gather_into_tensor(elsewhere, shard)
    return torch.equal(again, elsewhere)


@pytest.mark.parametrize("keep", [False, True])
def test_a_gathered_buffer_dropped_is_no_longer_counted(keep):
    """gloo holds a gathered tensor for a moment after the call: the bench gathers into a
    scratch tensor, so that only the rank code decides what is alive."""
    bench = FsdpBench(ShardedProblem(shard_sizes=(2, 2, 2), steps=1))
    for run in run_on_bench(_gather_into, bench, keep):
        assert run.value  # the copy into the buffer is the gathered layer
        assert run.peak_full_bytes == (2 if keep else 1) * 8 * 3 * bench.shard_numel(0)
        assert (run.buffers, run.gathers_into_buffers, run.gathers_elsewhere) == (2, 2, 1)


def test_fsdp2_gathers_twice_or_once_and_trains_like_one_process():
    problem = ShardedProblem(shard_sizes=(4, 6), steps=2)
    bench = FsdpBench(problem)
    reference = problem.reference_sgd()
    num_layers = bench.num_layers
    for rank, reports in enumerate(launch(measure_fsdp2, 2, problem)):
        for reshard, report in reports.items():
            names = [name for name, _ in report["calls"]]
            gathers = (2 if reshard else 1) * num_layers * problem.steps
            assert names.count("all_gather") == gathers, (rank, reshard, names)
            assert names.count("reduce_scatter") == num_layers * problem.steps
            assert report["comm_debug_counts"] == {
                "_allgather_base_": gathers,
                "_reduce_scatter_base_": num_layers * problem.steps,
            }
            diff = max(
                float((w - r).abs().max())
                for w, r in zip(report["weights"], reference, strict=True)
            )
            assert diff < 1e-12, (rank, reshard, diff)
            # each tensor padded to a multiple of 2 rows: Linear(6,16), (16,16), (16,3) -> 4 rows
            assert report["layer_param_bytes"] == [8 * 112, 8 * 272, 8 * (64 + 4)]
            layers = report["layer_param_bytes"]
            assert report["peak_param_bytes"] == (max(layers) if reshard else sum(layers))
            assert report["peak_gathered_bytes"] > report["peak_param_bytes"]
            # what a gather hands over: this rank's half of the layer's (padded) parameters
            gathered = [b for name, b in report["calls"] if name == "all_gather"]
            assert gathered[:num_layers] == [b // 2 for b in layers]
