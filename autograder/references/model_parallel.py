"""Section 03's reference answers, on the grader's side: not in the package students get.

The graded exercises of ``03_model_parallel`` ask students to write these; the package they
receive (``shared/distopt``) must not hold a working answer to read and retype (issue 53,
item 9; ``tests/repo/test_no_answers_03.py`` proves it holds none). The course's own tests use
these as known-good answers for the checks (:mod:`distopt.ranks.model_parallel_checks`,
:mod:`distopt.ranks.expert_checks`, :mod:`distopt.ranks.context_checks`); the notebooks'
hidden tests compute what they need by an independent route (the unsplit model, the cost
model's own functions), because the grading kernel cannot import this package.

* :class:`CopyToTensorParallel`, :class:`ReduceFromTensorParallel` and
  :func:`megatron_mlp_rank`: Megatron's *f* and *g* and the MLP block built from them
  (Shoeybi et al. 2019, Section 3, Figure 3, https://arxiv.org/abs/1909.08053);
* :func:`best_degree`: the tensor-parallel degree with the highest throughput per GPU among
  those that fit;
* :func:`gpipe_stage`: one GPipe step of a pipeline stage with point-to-point messages;
* :class:`AllToAll` and :func:`expert_parallel_moe`: expert parallelism's dispatch and
  combine with their backward pass (Lepikhin et al. 2020, "GShard", Section 3.2);
* :func:`zigzag_chunks` and :func:`ring_attention_rank`: ring attention on ranks (Liu et al.
  2023), with the zig-zag order that balances a causal mask.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from distopt.costs.tensor_layer import _degrees, layer_efficiency
from distopt.problems.megatron_mlp import PARAMS, MLPShard
from distopt.problems.moe_layer import MoEShard
from distopt.problems.pipeline_stack import Stage
from distopt.problems.sequence_chunks import AttentionShard
from distopt.sim.sequence_parallel import online_softmax_step

__all__ = [
    "AllToAll",
    "CopyToTensorParallel",
    "ReduceFromTensorParallel",
    "best_degree",
    "expert_parallel_moe",
    "gpipe_stage",
    "megatron_mlp_rank",
    "ring_attention_rank",
    "zigzag_chunks",
]


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's *f*: identity in the forward pass, all-reduce (sum) in the backward pass.

    It stands in front of a column-parallel layer: every rank uses the whole input, so the
    input's gradient is the sum of the ranks' partial gradients (Shoeybi et al. 2019, Section
    3, Figure 3, https://arxiv.org/abs/1909.08053).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()  # autograd may share the incoming gradient with other nodes
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's *g*: all-reduce (sum) in the forward pass, identity in the backward pass.

    It ends a row-parallel layer: the ranks' partial outputs add up to the output, and each
    partial output's gradient is the output's gradient itself (the conjugate of *f*).
    """

    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def megatron_mlp_rank(rank: int, world_size: int, shard: MLPShard) -> tuple:
    """One rank of the Megatron MLP block, forward and backward from ``shard.grad_output``.

    Returns ``(output, grads, input_grad)``: the whole (tokens, hidden) output, this rank's
    shard gradients as ``{"w_in", "b_in", "w_out", "b_out"}``, and dloss/dx (tokens, hidden).
    """
    params = {name: getattr(shard, name).clone().requires_grad_() for name in PARAMS}
    x = shard.x.clone().requires_grad_()
    hidden = F.gelu(CopyToTensorParallel.apply(x) @ params["w_in"] + params["b_in"])
    y = ReduceFromTensorParallel.apply(hidden @ params["w_out"]) + params["b_out"]
    y.backward(shard.grad_output)
    return y.detach(), {name: p.grad for name, p in params.items()}, x.grad


def gpipe_stage(rank: int, world_size: int, stage: Stage) -> list:
    """One GPipe step of pipeline stage ``rank``: all forwards, then all backwards.

    Activations go to stage ``rank + 1`` and gradients back to ``rank - 1`` with
    ``dist.isend`` / ``dist.irecv``, one message per micro-batch, in micro-batch order.
    Returns this stage's parameter gradients (gradient of the whole batch's mean loss); its
    timeline is measured by the check (:class:`distopt.ranks.model_parallel_checks.
    StageRecording`).
    """
    first, last = rank == 0, rank == world_size - 1
    shape = (stage.micro_batch, stage.width)
    inputs, outputs, sends = [], [], []
    for k in range(stage.micro_batches):
        if first:
            x = stage.inputs[k]
        else:
            x = torch.empty(shape, dtype=torch.float64)
            dist.irecv(x, src=rank - 1).wait()
            x.requires_grad_()
        out = stage.model(x)
        if last:
            out = stage.loss_sum(out, stage.targets[k]) / stage.batch_size
        if not last:
            sends.append(dist.isend(out.detach(), dst=rank + 1))
        inputs.append(x)
        outputs.append(out)
    for k in range(stage.micro_batches):
        grad = None
        if not last:
            grad = torch.empty(shape, dtype=torch.float64)
            dist.irecv(grad, src=rank + 1).wait()
        outputs[k].backward(grad)
        if not first:
            sends.append(dist.isend(inputs[k].grad, dst=rank - 1))
    for work in sends:
        work.wait()
    return [p.grad for p in stage.model.parameters()]


def best_degree(
    tokens: int,
    hidden: int,
    heads: int,
    *,
    state_bytes: float,
    memory_bytes: float,
    flops_per_s: float,
    intra_bandwidth: float,
    inter_bandwidth: float,
    gpus_per_server: int,
    max_degree: int,
    bytes_per_value: int = 2,
) -> tuple[int | None, float]:
    """The degree with the highest throughput per GPU among those that fit, and its efficiency.

    Candidates: every t that divides ``heads`` (attention is split by heads) up to
    ``max_degree`` whose share ``state_bytes / t`` fits in ``memory_bytes``; a group of t GPUs
    uses ``intra_bandwidth`` if t <= ``gpus_per_server``, ``inter_bandwidth`` otherwise. At a
    fixed number of GPUs the throughput is proportional to :func:`layer_efficiency`, which
    falls as t grows, so the answer is the smallest t that fits. ``(None, 0.0)`` if none fits
    (the state must be cut another way: more pipeline stages, ZeRO).
    """
    best: tuple[int | None, float] = (None, 0.0)
    for t in _degrees(heads, max_degree):
        if state_bytes / t > memory_bytes:
            continue
        link = intra_bandwidth if t <= gpus_per_server else inter_bandwidth
        efficiency = layer_efficiency(
            tokens, hidden, t, flops_per_s=flops_per_s, bandwidth=link,
            bytes_per_value=bytes_per_value,
        )  # fmt: skip
        if efficiency > best[1]:
            best = (t, efficiency)
    return best


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


def zigzag_chunks(world_size: int) -> list[list[int]]:
    """Rank r's chunks of 2 world_size: ``[r, 2 world_size - 1 - r]``."""
    return [[r, 2 * world_size - 1 - r] for r in range(world_size)]


def ring_attention_rank(rank: int, world_size: int, shard: AttentionShard) -> np.ndarray:
    """Ring attention on rank ``rank``: its (s/N, d) output rows, in the order of ``shard.q``.

    One (chunk x chunk) block of scores per query chunk and key chunk, folded in ring order;
    with a causal mask, keys after their query are masked and blocks with no key at or before
    any query are skipped.
    """
    q = shard.q.numpy()
    length, scale = shard.chunk_len, 1 / math.sqrt(q.shape[1])
    mine = shard.positions[rank].numpy()
    states = [
        (np.full((length, 1), -np.inf), np.zeros((length, 1)), np.zeros((length, q.shape[1])))
        for _ in range(len(q) // length)
    ]
    block = torch.stack((shard.k, shard.v))  # one message per hop: keys and values
    for step in range(world_size):
        source = (rank - step) % world_size
        if step < world_size - 1:  # pass the block on while computing with it
            incoming = torch.empty_like(block)
            transfers = [
                dist.isend(block, (rank + 1) % world_size),
                dist.irecv(incoming, (rank - 1) % world_size),
            ]
        keys, values = block[0].numpy(), block[1].numpy()
        theirs = shard.positions[source].numpy()
        for a in range(len(states)):
            rows = slice(a * length, (a + 1) * length)
            for b in range(len(keys) // length):
                cols = slice(b * length, (b + 1) * length)
                if shard.causal and theirs[cols].min() > mine[rows].max():
                    continue  # every key after every query: nothing to compute
                scores = q[rows] @ keys[cols].T * scale
                if shard.causal:
                    scores = np.where(theirs[None, cols] <= mine[rows, None], scores, -np.inf)
                states[a] = online_softmax_step(*states[a], scores, values[cols])
        if step < world_size - 1:
            for transfer in transfers:
                transfer.wait()
            block = incoming
    return np.concatenate([numerator / row_sum for _, row_sum, numerator in states])
