"""The small GPT trained data-parallel on ranks (``distopt.launch`` workers).

Each worker runs the course's one loop (``distopt.project.loop.run_steps``) on its rank's
share of every batch, with ``config.micro_batches`` micro-batches per step, and returns the
history (the loss averaged over ranks):

* :func:`ddp_no_overlap`, section 07's "slow throughput" failure: the gradients are
  all-reduced *after* the backward pass, one message per parameter tensor, so every step
  waits for its communication. The history times computation and communication apart,
  which is what diagnosing the run needs.
* :func:`data_parallel`: what ``torchrun -m distopt.project.train`` runs, PyTorch's
  ``DistributedDataParallel`` (the gradients all-reduced in buckets while the backward pass
  runs, section 01) or FSDP2 (``fully_shard``: the weights gathered before each block's
  forward and backward, its gradients reduce-scattered, section 02).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from distopt.project.loop import (
    TrainConfig,
    batch_at,
    make_model,
    make_optimizer,
    mean_over_ranks,
    run_steps,
)
from distopt.project.train import parallelize

__all__ = ["data_parallel", "ddp_no_overlap"]


def ddp_no_overlap(rank: int, world_size: int, config: TrainConfig) -> dict[str, list]:
    """Train with the course's loop, averaging gradients tensor by tensor after backward.

    Each rank computes the gradient of its ``batch_size / world_size`` sequences, then the
    gradients are averaged with ``dist.all_reduce``, then every rank takes the same AdamW
    step. The history adds ``compute_time`` (forward, backward, optimizer, s) and
    ``comm_time`` (the all-reduces, s, waiting for the slower rank included) per step;
    ``step_time`` is their sum.
    """
    model = make_model(config)
    optimizer = make_optimizer(model, config)

    def average_gradients() -> float:
        start = time.perf_counter()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)
        return time.perf_counter() - start

    return run_steps(
        model,
        optimizer,
        config,
        batch_at(config, rank=rank, world_size=world_size),
        sync=average_gradients,
        mean_over_ranks=mean_over_ranks,
    )


def data_parallel(
    rank: int,
    world_size: int,
    config: TrainConfig,
    parallel: str = "ddp",
    *,
    bucket_mb: float | None = None,
) -> dict[str, list]:
    """Train with the course's loop, the model wrapped in DDP (``parallel="ddp"``) or
    sharded with FSDP2 (``"fsdp"``) as the ``torchrun`` trainer does
    (``distopt.project.train.parallelize``). Returns the history; its losses are the mean
    over ranks.

    With ``config.micro_batches > 1`` the wrapper's communication is held back for every
    micro-batch but the last (gradient accumulation: the gradients cross the network once
    per step).

    DDP only: ``bucket_mb`` caps its gradient buckets (MiB; None: DDP's 25 MiB, one bucket
    for a model this small, so nothing overlaps). Its buckets go through PyTorch's stock
    comm hook (``default_hooks.allreduce_hook``: ``dist.all_reduce(..., async_op=True)``
    from Python, the same sums as DDP's C++ default), so that the course's recorder and
    emulated link (``distopt.engine.record``, ``distopt.engine.link``) see them. The history
    adds ``comm_time``, the *exposed* communication of each step (from the last gradient
    computed to the end of the backward pass, where DDP waits for its all-reduces), and
    ``compute_time``, the rest of the step.
    """
    model = make_model(config)
    wrapped, no_sync = parallelize(model, parallel, bucket_mb=bucket_mb)
    sync = None
    if parallel == "ddp":
        wrapped.register_comm_hook(None, default_hooks.allreduce_hook)
        sync = _exposed_communication(model)
    optimizer = make_optimizer(model, config)  # after fully_shard: over the shards
    return run_steps(
        wrapped,
        optimizer,
        config,
        batch_at(config, rank=rank, world_size=world_size),
        sync=sync,
        mean_over_ranks=mean_over_ranks,
        no_sync=no_sync,
    )


def _exposed_communication(model: nn.Module) -> Callable[[], float]:
    """A ``sync`` for ``run_steps``: called right after backward, it returns the seconds
    since the last gradient was computed, the communication the backward pass did not hide."""
    last_gradient_s = [0.0]

    def mark(_param: torch.Tensor) -> None:
        last_gradient_s[0] = time.perf_counter()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(mark)
    return lambda: time.perf_counter() - last_gradient_s[0]
