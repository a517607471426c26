"""Tests of distopt.ranks.expert_checks: the reference answer passes, typical wrong answers fail
with the named check, and the guard stops the package's answer and torch's own backward."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as differentiable

from autograder.references.model_parallel import AllToAll, expert_parallel_moe
from distopt import LaunchError
from distopt.problems.moe_layer import MoELayer
from distopt.ranks import expert_checks as checks


@pytest.mark.parametrize(
    "problem",
    [
        MoELayer(),
        MoELayer(world_size=3, experts_per_rank=1, tokens_per_rank=5, top_k=1, capacity_factor=0.7),
    ],
)
def test_the_reference_answer_passes(problem):
    results = checks.run_expert_parallel(expert_parallel_moe, problem, guard=False)
    checks.assert_moe_matches(results, problem)
    checks.assert_all_to_all_traffic(results, problem)


def _layer(shard, world_size, *, capacity=True, sum_over_ranks=False):
    """The layer with a typical mistake switched on."""
    num_experts, k = shard.num_experts, shard.top_k
    local = num_experts // world_size
    x = shard.x.clone().requires_grad_()
    probs = torch.softmax(shard.router(x), dim=1)
    gates, chosen = probs.topk(k, dim=1)
    order = torch.argsort(chosen.flatten(), stable=True)
    token = order // k
    send = torch.bincount(chosen.flatten(), minlength=num_experts)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_counts = send.view(world_size, local).sum(dim=1).tolist()
    recv_counts = recv.view(world_size, local).sum(dim=1).tolist()
    received = AllToAll.apply(x[token], send_counts, recv_counts)
    expert_of = torch.arange(local).repeat(world_size).repeat_interleave(recv)
    results = torch.zeros_like(received)
    for j, expert in enumerate(shard.experts):
        rows = torch.nonzero(expert_of == j).flatten()
        rows = rows[: shard.capacity] if capacity else rows
        results = results.index_put((rows,), expert(received[rows]))
    returned = AllToAll.apply(results, recv_counts, send_counts)
    y = x.index_add(0, token, gates.flatten()[order, None] * returned)
    y.backward(shard.grad_output)
    if sum_over_ranks:  # an extra all-reduce "to be safe"
        dist.all_reduce(torch.zeros(1))
    return y.detach(), x.grad, [p.grad for p in shard.experts.parameters()]


def no_capacity(rank, world_size, shard):
    return _layer(shard, world_size, capacity=False)


def extra_all_reduce(rank, world_size, shard):
    return _layer(shard, world_size, sum_over_ranks=True)


def test_dropped_copies_kept_fail_on_the_values():
    problem = MoELayer()
    results = checks.run_expert_parallel(no_capacity, problem, guard=False)
    with pytest.raises(AssertionError, match="single-process layer"):
        checks.assert_moe_matches(results, problem)


def test_other_communication_fails_on_the_traffic():
    problem = MoELayer()
    results = checks.run_expert_parallel(extra_all_reduce, problem, guard=False)
    checks.assert_moe_matches(results, problem)
    with pytest.raises(AssertionError, match=r"called \['all_reduce'\]"):
        checks.assert_all_to_all_traffic(results, problem)


def torch_backward(rank, world_size, shard):
    rows = shard.x.clone()
    out = torch.empty_like(rows)
    differentiable.all_to_all_single(out, rows)
    return out


def rebuilds_the_layer(rank, world_size, shard):
    return MoELayer(world_size=world_size).reference()


@pytest.mark.parametrize("fn", [rebuilds_the_layer, torch_backward])
def test_the_guard_refuses_the_bench_and_torch_s_backward(fn):
    with pytest.raises(LaunchError, match="NotYourOwnWork"):
        checks.run_expert_parallel(fn, MoELayer())


class _DoubledAllToAll(torch.autograd.Function):
    """An all-to-all whose backward sends twice the gradient and halves what it receives: the
    values come out right (exactly: x 2 and / 2 lose nothing), the payloads are decoys."""

    @staticmethod
    def forward(ctx, rows, send_counts, recv_counts):
        ctx.counts = (send_counts, recv_counts)
        received = rows.new_empty((sum(recv_counts), rows.shape[1]))
        dist.all_to_all_single(received, rows.contiguous(), recv_counts, send_counts)
        return received

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.counts
        back = grad.new_empty((sum(send_counts), grad.shape[1]))
        dist.all_to_all_single(back, (2 * grad).contiguous(), send_counts, recv_counts)
        return back / 2, None, None


def doubled_backward_payloads(rank, world_size, shard):
    global AllToAll
    saved, AllToAll = AllToAll, _DoubledAllToAll
    try:
        return _layer(shard, world_size)
    finally:
        AllToAll = saved


def test_decoy_payloads_in_the_backward_all_to_alls_fail():
    problem = MoELayer()
    results = checks.run_expert_parallel(doubled_backward_payloads, problem, guard=False)
    checks.assert_moe_matches(results, problem)  # every value right
    with pytest.raises(AssertionError, match="rank 0 of 2: the combine's backward did not send "
                       "the gated gradient rows"):  # fmt: skip
        checks.assert_all_to_all_traffic(results, problem)


def skips_empty_experts(rank, world_size, shard):
    """Runs an expert only where it has rows: an empty rank's combine leaves the graph, so its
    backward all-to-all is skipped and the others wait for it."""
    x = shard.x.clone().requires_grad_()
    num_experts, k, local = shard.num_experts, shard.top_k, shard.num_experts // world_size
    probs = torch.softmax(shard.router(x), dim=1)
    gates, chosen = probs.topk(k, dim=1)
    order = torch.argsort(chosen.flatten(), stable=True)
    send = torch.bincount(chosen.flatten(), minlength=num_experts)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_counts = send.view(world_size, local).sum(dim=1).tolist()
    recv_counts = recv.view(world_size, local).sum(dim=1).tolist()
    received = AllToAll.apply(x[order // k], send_counts, recv_counts)
    expert_of = torch.arange(local).repeat(world_size).repeat_interleave(recv)
    results = torch.zeros_like(received)
    for j, expert in enumerate(shard.experts):
        rows = torch.nonzero(expert_of == j).flatten()[: shard.capacity]
        if len(rows):
            results = results.index_put((rows,), expert(received[rows]))
    returned = AllToAll.apply(results, recv_counts, send_counts)
    y = x.index_add(0, order // k, gates.flatten()[order, None] * returned)
    y.backward(shard.grad_output)
    return y.detach(), x.grad, [p.grad for p in shard.experts.parameters()]


EMPTY = MoELayer(world_size=3, experts_per_rank=1, tokens_per_rank=4, top_k=1, skew=30.0)


def test_the_empty_cases_are_named_and_the_reference_passes_them():
    assert checks.empty_cases(EMPTY) == [
        "rank 1 receives no rows",
        "rank 2 receives no rows",
    ]
    results = checks.run_expert_parallel(expert_parallel_moe, EMPTY, guard=False)
    checks.assert_moe_matches(results, EMPTY)
    checks.assert_all_to_all_traffic(results, EMPTY)


def test_a_rank_with_no_rows_that_skips_its_backward_all_to_all_is_named_in_words():
    with pytest.raises(LaunchError, match="rank 1 receives no rows; rank 2 receives no rows. "
                       "Such a rank or expert still takes part in every all-to-all"):  # fmt: skip
        checks.run_expert_parallel(skips_empty_experts, EMPTY, guard=False, timeout=10)


def test_an_expert_without_copies_and_no_gradient_is_named_in_words():
    problem = MoELayer(world_size=4, tokens_per_rank=8, top_k=3, skew=3.0, seed=2)
    assert checks.empty_cases(problem) == ["expert 7 (rank 3) keeps no copies"]
    results = checks.run_expert_parallel(skips_empty_experts, problem, guard=False)
    with pytest.raises(AssertionError, match="expert 7 keeps no copies in this case"):
        checks.assert_moe_matches(results, problem)
