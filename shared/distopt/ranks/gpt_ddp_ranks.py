"""Data parallelism for the small GPT with nothing overlapped (a ``distopt.launch`` worker).

Section 07's "slow throughput" failure: the gradients are all-reduced *after* the backward
pass, one message per parameter tensor, so every step waits for its communication. The
history times computation and communication apart, which is what diagnosing the run needs.
DDP proper buckets the gradients and overlaps the all-reduces with the backward pass
(section 01).
"""

from __future__ import annotations

import time

import torch.distributed as dist

from distopt.project.loop import (
    TrainConfig,
    batch_at,
    make_model,
    make_optimizer,
    mean_over_ranks,
    run_steps,
)

__all__ = ["ddp_no_overlap"]


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
