"""Real data parallelism on CPU processes: DDP training and all-reduce timing, for ``launch``.

``train_ddp`` trains a small MLP with ``torch.nn.parallel.DistributedDataParallel`` (gloo):
every step, the global batch is cut into ``world_size`` equal shards, rank r trains on shard
r, and DDP averages the gradients with all-reduces during the backward pass.
``train_single_process`` trains the same model on the whole global batch in one process; the
two must end with the same weights, up to float32 rounding.

``time_all_reduce`` measures ``dist.all_reduce`` for a list of message sizes, to fit the
alpha-beta model (``distopt.costs.comm.fit_alpha_beta``); with ``group_sizes`` it measures
them again in process groups of the first 2, 3, ... ranks of one launch, to see how the time
changes with the number of workers.

Example::

    from distopt import launch
    from distopt.ranks.ddp_ranks import DDPConfig, train_ddp, train_single_process

    config = DDPConfig()
    per_rank = launch(train_ddp, 2, config)
    reference = train_single_process(config)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from distopt.problems.logistic import make_logistic_data
from distopt.problems.mlp import build_mlp

__all__ = [
    "DDPConfig",
    "train_ddp",
    "train_single_process",
    "time_all_reduce",
    "time_all_reduce_by_group_size",
    "train_ddp_and_time_all_reduce",
]


@dataclass(frozen=True)
class DDPConfig:
    """What to train; every rank and the single-process reference use the same config."""

    layer_sizes: tuple[int, ...] = (8, 64, 64, 2)  # MLP widths: features, hidden..., classes
    global_batch: int = 64  # examples per step, over all ranks together
    num_steps: int = 10  # SGD steps
    lr: float = 0.1  # SGD learning rate
    momentum: float = 0.9  # SGD momentum: the optimizer has state, as real ones do
    bucket_cap_mb: float = 0.008  # DDP's bucket capacity, small so that this MLP needs two
    seed: int = 0  # initial weights and data


def _batches(config: DDPConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """All steps' data: features (num_steps, global_batch, in) and labels (num_steps, batch)."""
    features, labels = make_logistic_data(
        config.num_steps * config.global_batch, config.layer_sizes[0], seed=config.seed
    )
    shape = (config.num_steps, config.global_batch)
    return (
        torch.from_numpy(features).float().reshape(*shape, -1),
        torch.from_numpy(labels).long().reshape(shape),
    )


def _weights(model: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in model.parameters()]


def train_single_process(config: DDPConfig) -> list[np.ndarray]:
    """Weights after ``num_steps`` SGD steps on the whole global batch, in one process."""
    model = build_mlp(config.layer_sizes, seed=config.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    features, labels = _batches(config)
    for step in range(config.num_steps):
        optimizer.zero_grad()
        F.cross_entropy(model(features[step]), labels[step]).backward()
        optimizer.step()
    return _weights(model)


def train_ddp(rank: int, world_size: int, config: DDPConfig) -> dict[str, Any]:
    """Train with DDP on this rank's shard of each global batch (a ``launch`` worker).

    Returns ``{"weights": [np.ndarray, ...], "buckets": [[name, ...], ...]}``: the final
    weights (the same on every rank) and, for the last step, the parameter names in each
    gradient bucket, in the order DDP all-reduced them.
    """
    from torch.nn.parallel import DistributedDataParallel

    if config.global_batch % world_size:
        raise ValueError(f"global_batch {config.global_batch} must divide by {world_size}")
    model = build_mlp(config.layer_sizes, seed=config.seed)
    names = {id(p): name for name, p in model.named_parameters()}
    ddp = DistributedDataParallel(model, bucket_cap_mb=config.bucket_cap_mb)
    buckets: list[list[str]] = []

    # No annotations: DDP checks a hook's annotations, and this module's are strings.
    def recording_allreduce(state, bucket):
        """DDP's default all-reduce (divide by world size, then sum), noting the bucket."""
        buckets.append([names[id(p)] for p in bucket.parameters()])
        tensor = bucket.buffer().div_(world_size)
        work = dist.all_reduce(tensor, async_op=True)
        return work.get_future().then(lambda future: future.value()[0])

    ddp.register_comm_hook(None, recording_allreduce)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=config.lr, momentum=config.momentum)
    features, labels = _batches(config)
    shard = config.global_batch // world_size
    mine = slice(rank * shard, (rank + 1) * shard)
    for step in range(config.num_steps):
        buckets.clear()
        optimizer.zero_grad()
        F.cross_entropy(ddp(features[step, mine]), labels[step, mine]).backward()
        optimizer.step()
    return {"weights": _weights(model), "buckets": buckets}


def time_all_reduce(
    rank: int,
    world_size: int,
    message_bytes: Sequence[int],
    repeats: int = 5,
    group: dist.ProcessGroup | None = None,
) -> list[float]:
    """Seconds of one ``dist.all_reduce`` of float32 tensors of each size (a ``launch`` worker).

    For each size: one untimed warm-up call, then ``repeats`` timed calls, each after a
    barrier so that all ranks start together; the result is the fastest of them, the one
    least disturbed by other programs on the machine. ``group``: the process group to time
    (default: all ranks); only its members may call.
    """
    fastest: list[float] = []
    for size in message_bytes:
        tensor = torch.ones(max(1, int(size) // 4))
        dist.all_reduce(tensor, group=group)
        times_s = []
        for _ in range(repeats):
            dist.barrier(group=group)
            start = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            times_s.append(time.perf_counter() - start)
        fastest.append(min(times_s))
    return fastest


def time_all_reduce_by_group_size(
    rank: int,
    world_size: int,
    message_bytes: Sequence[int],
    group_sizes: Sequence[int],
    repeats: int = 5,
) -> dict[int, list[float]]:
    """``time_all_reduce`` in a group of the first n ranks, for each n in ``group_sizes``.

    Every rank creates every group (``dist.new_group`` must be called by all ranks); the
    ranks outside a group wait at a barrier while it is timed, so one group's messages never
    compete with another's. Returns {n: seconds per size} on the ranks of the group, and
    only the sizes the rank took part in.
    """
    if any(not 1 <= n <= world_size for n in group_sizes):
        raise ValueError(f"group_sizes must lie in 1..{world_size}, got {tuple(group_sizes)}")
    timings: dict[int, list[float]] = {}
    for n in group_sizes:
        group = dist.new_group(ranks=list(range(n)))
        if rank < n:
            timings[n] = time_all_reduce(rank, world_size, message_bytes, repeats, group=group)
        dist.barrier()
    return timings


def train_ddp_and_time_all_reduce(
    rank: int,
    world_size: int,
    config: DDPConfig,
    message_bytes: Sequence[int],
    repeats: int = 5,
    group_sizes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """``train_ddp``, then all-reduce timings in the same processes (one launch for both).

    Returns ``train_ddp``'s dict with one more key: ``"all_reduce_s"``, the times of
    ``time_all_reduce`` over all ranks, or with ``group_sizes`` ``"all_reduce_s_by_ranks"``,
    those of ``time_all_reduce_by_group_size``.
    """
    result = train_ddp(rank, world_size, config)
    if group_sizes is None:
        result["all_reduce_s"] = time_all_reduce(rank, world_size, message_bytes, repeats)
    else:
        result["all_reduce_s_by_ranks"] = time_all_reduce_by_group_size(
            rank, world_size, message_bytes, group_sizes, repeats
        )
    return result
