"""distopt.ranks.fsdp_checks on real ranks: a right ZeRO-3 passes every check, and each
typical mistake (one gather a step, full weights kept, an all-reduce, a gradient averaged
twice, a buffer of its own) fails the check that names it."""

import pytest
import torch
import torch.distributed as dist

from distopt.problems.shards import ShardedProblem
from distopt.ranks import fsdp_checks
from distopt.ranks.fsdp_ranks import FsdpBench, run_on_bench

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _zero3(rank, world_size, bench, mistake=None):
    """ZeRO-3 SGD by hand, or with one ``mistake``."""
    problem = bench.problem
    kept = {}

    def gather(layer, shard):
        if mistake == "gather_once" and layer in kept:
            return kept[layer]
        full = (
            torch.zeros(world_size * len(shard), dtype=torch.float64)
            if mistake == "own_buffer"
            else bench.full_buffer(layer)
        )
        dist.all_gather_into_tensor(full, shard)
        out_features, in_features = bench.layer_shapes[layer]
        split = out_features * in_features
        weights = full[:split].view(out_features, in_features), full[split : split + out_features]
        if mistake in ("gather_once", "keep_after_forward"):
            kept[layer] = weights
        if mistake == "detach_alias":  # the reviewer's: an alias, the tensor handed out dies
            kept[layer] = weights[0].detach()
        if mistake == "clone_kept":
            kept[layer] = weights[0].clone()
        return weights

    class ShardedLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, shard, layer):
            weight, bias = gather(layer, shard)
            ctx.save_for_backward(x, shard)
            ctx.layer = layer
            return x @ weight.T + bias

        @staticmethod
        def backward(ctx, grad_out):
            x, shard = ctx.saved_tensors
            weight, _ = gather(ctx.layer, shard)
            out_features, in_features = bench.layer_shapes[ctx.layer]
            split = out_features * in_features
            full_grad = torch.zeros(world_size * len(shard), dtype=torch.float64)
            full_grad[:split] = (grad_out.T @ x).reshape(-1)
            full_grad[split : split + out_features] = grad_out.sum(0)
            if mistake == "all_reduce":
                dist.all_reduce(full_grad)
                grad_shard = full_grad[rank * len(shard) : (rank + 1) * len(shard)].clone()
            else:
                grad_shard = torch.empty_like(shard)
                dist.reduce_scatter_tensor(grad_shard, full_grad)
                if mistake == "averaged":  # the mean of the ranks' shares: 1/N too small
                    grad_shard /= world_size
            return grad_out @ weight, grad_shard, None

    shards = [bench.start_shard(rank, i).requires_grad_() for i in range(bench.num_layers)]

    def forward(x):
        for layer, shard in enumerate(shards):
            x = ShardedLinear.apply(x, shard, layer)
            if layer < len(shards) - 1:
                x = torch.relu(x)
        return x

    for step in range(problem.steps):
        kept.clear()  # gathered once a step (gather_once), or kept through it: all whole
        x, y = problem.batch(step, rank)
        (problem.loss_sum(forward, x, y) / problem.global_batch).backward()
        with torch.no_grad():
            for shard in shards:
                shard -= problem.lr * shard.grad
                shard.grad = None
    return [s.detach() for s in shards]


def _check_all(runs, bench):
    fsdp_checks.assert_shards_match(runs, bench)
    fsdp_checks.assert_traffic(runs, bench)
    fsdp_checks.assert_messages_carry(runs, bench)
    fsdp_checks.assert_one_layer_at_a_time(runs, bench)


@pytest.mark.parametrize(
    "problem",
    [
        ShardedProblem(shard_sizes=(6, 6), steps=2),
        ShardedProblem(shard_sizes=(5, 9, 2), layer_sizes=(5, 7, 9, 2), steps=2, seed=3),
    ],
    ids=["2-ranks", "3-ranks-padded"],
)
def test_a_right_zero3_passes_every_check(problem):
    bench = FsdpBench(problem)
    runs = run_on_bench(_zero3, bench)
    _check_all(runs, bench)
    for run in runs:
        assert run.buffers == run.gathers_into_buffers == 2 * bench.num_layers * problem.steps
        assert run.peak_layers == (max(range(bench.num_layers), key=bench.shard_numel),)
        sent = fsdp_checks.ring_bytes_sent(run, problem.world_size)
        n = problem.world_size
        assert sent == pytest.approx(problem.steps * 3 * (n - 1) / n * bench.padded_param_bytes())


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("gather_once", "once per step"),
        ("keep_after_forward", "were alive at once"),
        ("all_reduce", "all-reduced"),
        ("averaged", "summed, not averaged again"),
        ("own_buffer", "did not hand out"),
        ("detach_alias", "were alive at once"),
        ("clone_kept", "copies of full weights"),
    ],
)
def test_each_typical_mistake_fails_its_own_check(mistake, match):
    bench = FsdpBench(ShardedProblem(shard_sizes=(4, 4), steps=2))
    runs = run_on_bench(_zero3, bench, mistake)
    with pytest.raises(AssertionError, match=match):
        _check_all(runs, bench)


def _carry_the_wrong_thing(rank, world_size, bench, what):
    """One layer, one step, the right calls and sizes, but ``what`` carries the wrong numbers:
    the gathers zeros, or the reduce-scatter ones."""
    shard = bench.start_shard(rank, 0)
    handed = torch.zeros_like(shard) if what == "gather" else shard
    for _ in range(2):  # forward, backward
        dist.all_gather_into_tensor(bench.full_buffer(0), handed)
    grad = torch.empty_like(shard)
    dist.reduce_scatter_tensor(grad, torch.ones(world_size * len(shard), dtype=torch.float64))
    return [shard]


@pytest.mark.parametrize(("what", "match"), [("gather", "all-gathered"), ("scatter", "own shard")])
def test_the_contents_of_the_messages_are_checked(what, match):
    bench = FsdpBench(ShardedProblem(shard_sizes=(4, 4), layer_sizes=(3, 2), steps=1))
    runs = run_on_bench(_carry_the_wrong_thing, bench, what)
    fsdp_checks.assert_traffic(runs, bench)
    with pytest.raises(AssertionError, match=match):
        fsdp_checks.assert_messages_carry(runs, bench)
