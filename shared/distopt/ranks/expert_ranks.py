"""Expert parallelism on real ranks: tokens to their experts and back by all-to-all.

The reference answer of section 03's expert-parallel exercise (its test forbids calling it,
:mod:`distopt.ranks.expert_checks`); the bench is :class:`distopt.problems.moe_layer.MoELayer`.

* :class:`AllToAll`: ``dist.all_to_all_single`` as an autograd function. Its backward pass is
  the same exchange reversed: the gradient of each row received goes back to the rank that
  sent it (the split sizes swap);
* :func:`expert_parallel_moe`: one MoE layer, forward and backward, on rank ``rank``. The ranks
  first exchange how many copies each sends to each expert (one small all-to-all of integers),
  because a receiver must size its buffer and the expert must know which copies fall within
  its capacity; then the copies travel (dispatch), the experts run, and the results return
  (combine). With the backward pass: four all-to-alls of tokens per layer (Lepikhin et al.
  2020, "GShard", Section 3.2; Fedus et al. 2021, "Switch Transformers", Figure 3).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distopt.problems.moe_layer import MoEShard

__all__ = ["AllToAll", "expert_parallel_moe"]


class AllToAll(torch.autograd.Function):
    """``rows`` cut into ``send_counts[j]`` rows for each rank j, exchanged; the
    ``recv_counts[j]`` rows from each rank j come back concatenated in rank order.

    Backward: the gradients of the received rows return to their senders, the same
    all-to-all with ``send_counts`` and ``recv_counts`` swapped.
    """

    @staticmethod
    def forward(ctx, rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]):
        ctx.counts = (send_counts, recv_counts)
        received = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
        dist.all_to_all_single(received, rows.contiguous(), recv_counts, send_counts)
        return received

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        send_counts, recv_counts = ctx.counts
        back = grad.new_empty((sum(send_counts), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), send_counts, recv_counts)
        return back, None, None


def expert_parallel_moe(rank: int, world_size: int, shard: MoEShard) -> tuple:
    """One MoE layer on rank ``rank``, forward and backward from ``shard.grad_output``.

    Returns ``(output, input_grad, expert_grads)``: this rank's (T, hidden) output and
    dloss/dx, and the gradients of ``shard.experts.parameters()`` in order.
    """
    num_experts, k = shard.num_experts, shard.top_k
    local = num_experts // world_size
    x = shard.x.clone().requires_grad_()
    probs = torch.softmax(shard.router(x), dim=1)
    gates, chosen = probs.topk(k, dim=1)
    # This rank's copies sorted by expert, so by destination rank; token order within each.
    flat = chosen.flatten()
    order = torch.argsort(flat, stable=True)
    token = order // k
    send_per_expert = torch.bincount(flat, minlength=num_experts)
    recv_per_expert = torch.empty_like(send_per_expert)
    dist.all_to_all_single(recv_per_expert, send_per_expert)  # the split sizes, first
    send_counts = send_per_expert.view(world_size, local).sum(dim=1).tolist()
    recv_counts = recv_per_expert.view(world_size, local).sum(dim=1).tolist()
    received = AllToAll.apply(x[token], send_counts, recv_counts)
    # Received rows: from rank 0 its copies for my expert 0, then 1, ...; then from rank 1.
    # So each expert's rows, in order, are its queue in token order over the whole step.
    expert_of = torch.arange(local).repeat(world_size).repeat_interleave(recv_per_expert)
    results = torch.zeros_like(received)  # a dropped copy returns as zeros
    for j, expert in enumerate(shard.experts):
        rows = torch.nonzero(expert_of == j).flatten()[: shard.capacity]
        results = results.index_put((rows,), expert(received[rows]))
    returned = AllToAll.apply(results, recv_counts, send_counts)
    y = x.index_add(0, token, gates.flatten()[order, None] * returned)
    y.backward(shard.grad_output)
    return y.detach(), x.grad, [p.grad for p in shard.experts.parameters()]
