"""Tests of distopt.ranks.expert_checks: the reference answer passes, typical wrong answers fail
with the named check, and the guard stops the package's answer and torch's own backward."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as differentiable

from distopt import LaunchError
from distopt.problems.moe_layer import MoELayer
from distopt.ranks import expert_checks as checks
from distopt.ranks.expert_ranks import AllToAll, expert_parallel_moe


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


@pytest.mark.parametrize("fn", [expert_parallel_moe, torch_backward])
def test_the_guard_refuses_the_package_answer_and_torch_s_backward(fn):
    with pytest.raises(LaunchError, match="NotYourOwnWork"):
        checks.run_expert_parallel(fn, MoELayer())
