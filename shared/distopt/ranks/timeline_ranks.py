"""Section 01's runs on the emulated link (:mod:`distopt.engine.link`), for ``launch``.

On loopback, two processes on two cores hide nothing; on an emulated link of a stated
latency and bandwidth, with the model's compute emulated by sleeping
(``ShardedProblem(layer_backward_s=...)``), overlap shows as it does on a cluster:

* :func:`step_times` runs data-parallel rank code (the student's naive, bucketed and
  accumulating functions) and measures each one's steady step time;
* :func:`bus_bandwidth` times one all-reduce in process groups of the first 2, 3, ... ranks;
* :func:`profiled` runs rank code under ``torch.profiler`` on the link: rank 0 hands back a
  Chrome/Perfetto trace with a compute lane and the link's lane;
* :func:`layerwise_overlapped_sgd` is a data-parallel run that overlaps one all-reduce per
  layer with the backward pass: the timeline that exercise 10's test reads, made without the
  student's exercise 8 (a bug there must not cost exercise 10 its points).

Every rank takes a :class:`distopt.engine.link.LinkConfig`; times are wall seconds
(``time_scale`` times the stated network's).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from distopt.engine import link, record
from distopt.problems.shards import ShardedProblem

__all__ = ["bus_bandwidth", "layerwise_overlapped_sgd", "profiled", "step_times"]


def step_times(
    rank: int, world_size: int, config: link.LinkConfig, runs: Sequence[tuple]
) -> list[dict[str, Any]]:
    """Each ``(fn, problem, *args)`` of ``runs``: ``fn(rank, world_size, problem, *args)`` on
    the link, under the recorder. A step runs from the first backward pass of one optimizer
    step (``problem.micro_batches`` backward passes each) to the first of the next; per run:
    ``step_s``, the median over the steps, ``steps_s``, each, ``all_reduces``, per step, and
    ``late``, the transfers whose real op outlasted the model (0 when the link is faithful).
    """
    found = []
    for fn, problem, *args in runs:
        dist.barrier()  # start together: the link assumes the ranks issue in step
        with record.communication() as log, config.open() as wire:
            fn(rank, world_size, problem, *args)
        starts = [begin for begin, _ in log.backward][:: problem.micro_batches]
        steps_s = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
        found.append(
            {
                "step_s": statistics.median(steps_s) if steps_s else float("nan"),
                "steps_s": steps_s,
                "all_reduces": len(wire.of("all_reduce")) / problem.steps,
                "late": len(wire.late()),
            }
        )
    return found


def bus_bandwidth(
    rank: int,
    world_size: int,
    config: link.LinkConfig,
    message_bytes: int,
    group_sizes: Sequence[int],
    repeats: int = 2,
) -> dict[int, dict[str, float]]:
    """One all-reduce of ``message_bytes`` (float32) in groups of the first n ranks, n in
    ``group_sizes``, on the link: rank 0's fastest of ``repeats`` (``time_s``, wall), the
    modelled time (``model_s``, unscaled) and how many real ops outlasted the model."""
    groups = {n: dist.new_group(list(range(n))) for n in group_sizes}
    tensor = torch.ones(message_bytes // 4)
    found = {}
    for n in group_sizes:
        if rank < n:
            dist.all_reduce(tensor, group=groups[n])  # warm-up, off the link
            times = []
            with config.open() as wire:
                for _ in range(repeats):
                    start = time.perf_counter()
                    dist.all_reduce(tensor, group=groups[n])
                    times.append(time.perf_counter() - start)
            found[n] = {
                "time_s": min(times),
                "model_s": wire.transfers[0].model_s,
                "late": len(wire.late()),
            }
        dist.barrier()
    return found if rank == 0 else {}


def profiled(
    rank: int,
    world_size: int,
    config: link.LinkConfig,
    fn: Callable[..., Any],
    problem: Any,
    *args: Any,
) -> tuple[Any, record.Recording, link.Link, str | None]:
    """``fn(rank, world_size, problem, *args)`` on the link, under the recorder; rank 0 also
    under ``torch.profiler`` (every thread: the link's ranges are on a thread of their own).
    Returns (value, recording, link, rank 0's Chrome trace as JSON text, else None)."""
    dist.barrier()
    trace = None
    with record.communication() as log, config.open() as wire:
        if rank == 0:
            with link.profiler() as prof:
                value = fn(rank, world_size, problem, *args)
            handle, path = tempfile.mkstemp(suffix=".json")
            os.close(handle)
            try:
                prof.export_chrome_trace(path)
                with open(path, encoding="utf-8") as file:
                    trace = file.read()
            finally:
                os.unlink(path)
        else:
            value = fn(rank, world_size, problem, *args)
    return value, log, wire, trace


def layerwise_overlapped_sgd(
    rank: int, world_size: int, problem: ShardedProblem
) -> list[torch.Tensor]:
    """Data-parallel SGD on ``problem`` whose gradients travel one layer at a time: each
    ``nn.Linear``'s weight and bias, once both are accumulated, go into one asynchronous
    all-reduce while the backward pass goes on to the earlier layers; the step waits for all of
    them. Returns the parameters (those of one process training on each global batch)."""
    model = problem.new_model(rank)
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
    pending: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []

    def send_when_complete(layer: torch.nn.Module) -> None:
        params = list(layer.parameters())
        arrived: set[int] = set()

        def arrive(param: torch.Tensor) -> None:
            arrived.add(id(param))
            if len(arrived) == len(params):
                arrived.clear()
                packed = torch.cat([q.grad.reshape(-1) for q in params])
                pending.append((dist.all_reduce(packed, async_op=True), packed, params))

        for param in params:
            param.register_post_accumulate_grad_hook(arrive)

    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            send_when_complete(layer)
    for step in range(problem.steps):
        model.zero_grad()
        x, y = problem.batch(step, rank)
        (problem.loss_sum(model, x, y) / problem.global_batch).backward()
        with torch.no_grad():
            for work, packed, params in pending:
                work.wait()
                offset = 0
                for param in params:
                    param.grad.copy_(packed[offset : offset + param.numel()].view_as(param))
                    offset += param.numel()
            pending.clear()
            for param in model.parameters():
                param -= problem.lr * param.grad
    return [param.detach() for param in model.parameters()]
