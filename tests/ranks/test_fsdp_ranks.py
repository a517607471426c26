"""Tests of distopt.ranks.fsdp_ranks: the ZeRO-3 bench (its layout, its refusals, its meter
of full-weight buffers) and FSDP2's measured traffic and gathered memory."""

import pytest
import torch
import torch.distributed as dist

from distopt import launch
from distopt.problems.shards import ShardedProblem, flat
from distopt.ranks.fsdp_ranks import FsdpBench, full_weight_meter, measure_fsdp2, run_on_bench

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


def test_the_meter_counts_storages_while_alive_each_layer_once():
    meter = full_weight_meter((80, 48, 96))
    first = torch.zeros(10, dtype=torch.float64)
    meter.hand_out(first, 0)
    alias = first.detach()  # another tensor object on the same storage
    del first  # the alias keeps the storage alive
    second = torch.zeros(6, dtype=torch.float64)
    meter.hand_out(second, 1)
    assert meter.report() == (128, (0, 1), 2, 0)
    assert meter.layer_of(alias[:4].view(2, 2)) == 0 and meter.layer_of(second.data) == 1
    assert meter.layer_of(torch.zeros(3)) is None
    copy = second.clone()
    meter.note_copy(copy, 1)  # the same layer again: counted once
    assert meter.report().peak_bytes == 128 and meter.report().copies == 1
    del alias, second
    meter.hand_out(torch.zeros(12, dtype=torch.float64), 2)  # the copy of layer 1 lives on
    assert meter.report()[:2] == (144, (1, 2))
    del copy
    meter.hand_out(torch.zeros(12, dtype=torch.float64), 2)
    assert meter.report()[:2] == (144, (1, 2))  # the peak stays; layer 1 is gone now


def _peek(rank, world_size, bench):
    return bench.start_shard((rank + 1) % world_size, 0)


def test_inside_a_rank_the_bench_hands_out_its_own_shard_only():
    with pytest.raises(Exception, match="ForeignShardError"):
        launch(_peek, 2, FsdpBench(ShardedProblem(shard_sizes=(2, 2), steps=1)))


def _gather_into(rank, world_size, bench, keep, name):
    """Gather layer 0, then layer 1, into bench buffers; ``keep`` layer 0's (as a
    ``.detach()`` alias, which shares its storage) while gathering layer 1. ``name``: torch
    2.13's ``all_gather_single`` or the deprecated ``all_gather_into_tensor``."""
    gather = getattr(dist, name)
    first = bench.full_buffer(0)
    gather(first, bench.start_shard(rank, 0))
    alias = first.detach() if keep else None
    del first
    shard = bench.start_shard(rank, 1)
    again = bench.full_buffer(1)
    gather(again, shard)
    elsewhere = torch.empty_like(again)
    gather(elsewhere, shard)
    del alias
    return torch.equal(again, elsewhere)


@pytest.mark.parametrize("name", ["all_gather_single", "all_gather_into_tensor"])
@pytest.mark.parametrize("keep", [False, True])
def test_a_gathered_buffer_dropped_is_no_longer_counted(keep, name):
    """gloo holds a gathered tensor for a moment after the call: the bench gathers into a
    scratch tensor, so that only the rank code decides what is alive; an alias of the
    storage keeps it alive, whatever became of the tensor handed out."""
    bench = FsdpBench(ShardedProblem(shard_sizes=(2, 2, 2), steps=1))
    sizes = bench.layer_buffer_bytes()
    for run in run_on_bench(_gather_into, bench, keep, name):
        assert run.value  # the copy into the buffer is the gathered layer
        assert run.peak_full_bytes == (sizes[0] + sizes[1] if keep else max(sizes[:2]))
        assert run.peak_layers == ((0, 1) if keep else (sizes.index(max(sizes[:2])),))
        assert (run.buffers, run.gathers_into_buffers, run.gathers_elsewhere) == (2, 2, 1)


def _copies(how, full, weight):
    """Copies (or an alias, or an activation) of layer 0's gathered weights, made ``how``."""
    if how == "clone":
        return [weight.clone()]
    if how == "data":
        return [weight.data]
    if how == "to":
        return [weight.to(torch.float32)]
    if how == "cat":
        return [torch.cat([full[:3], full[3:]])]
    if how == "copy_":
        return [torch.empty(2, 5, dtype=torch.float64).copy_(weight)]
    if how == "times one":
        return [weight * 1.0]
    if how == "numpy":
        return [full.numpy()]
    return [torch.ones(4, 2, dtype=torch.float64) @ weight]  # "matmul": compute, no copy


def _keep_copies(rank, world_size, bench, how):
    """Gather layer 0, keep a copy of its weights ``how``, drop the buffer, gather layer 1."""
    full = bench.full_buffer(0)
    dist.all_gather_into_tensor(full, bench.start_shard(rank, 0))
    kept = _copies(how, full, full[:10].view(2, 5))
    del full
    dist.all_gather_into_tensor(bench.full_buffer(1), bench.start_shard(rank, 1))
    return len(kept)


@pytest.mark.parametrize(
    "how", ["clone", "data", "to", "cat", "copy_", "times one", "numpy", "matmul"]
)
def test_copies_and_aliases_of_full_weights_count_as_their_layer(how):
    bench = FsdpBench(ShardedProblem(shard_sizes=(2, 2), layer_sizes=(5, 2, 3), steps=1))
    sizes = bench.layer_buffer_bytes()
    for run in run_on_bench(_keep_copies, bench, how):
        if how == "matmul":  # an activation computed from the weights is not a copy
            assert run.peak_layers in ((0,), (1,)) and run.copies == 0
        else:
            assert run.peak_layers == (0, 1), how
            assert run.peak_full_bytes == sum(sizes)


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
