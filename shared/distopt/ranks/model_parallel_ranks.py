"""The real engines of model parallelism on CPU processes (workers for ``distopt.launch``).

* :func:`dtensor_mlp_check`: the Megatron MLP of :mod:`distopt.sim.tensor_parallel` with
  ``torch.distributed.tensor.parallel`` (``ColwiseParallel`` then ``RowwiseParallel``);
* :func:`pipelining_grad_check`: one step of a stack of layers cut into stages with
  ``torch.distributed.pipelining`` (GPipe and 1F1B), the schedules of
  :mod:`distopt.sim.pipeline`;
* :func:`engine_checks`: both in the same processes. Starting a group of CPU processes costs a
  second or more per rank, so section 03 runs ``launch(engine_checks, 2)`` and
  ``launch(engine_checks, 4)`` instead of four launches.

Each compares with a single-process float64 reference and returns the largest differences.

The same two ideas written by hand are section 03's rank-code exercises (Megatron's *f* and
*g* with the MLP block built from them, bench :class:`distopt.problems.megatron_mlp.MegatronMLP`;
one GPipe step of a pipeline stage, bench :class:`distopt.problems.pipeline_stack.PipelineStack`),
checked by :mod:`distopt.ranks.model_parallel_checks`; their reference answers stay with the
grader, not in this package. :func:`measured_tasks` turns the stages' measured timelines (the
check's, :class:`distopt.ranks.model_parallel_checks.StageRecording`) into the simulator's
tasks, for its Gantt chart and idle fraction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from distopt.sim.pipeline import Task

__all__ = [
    "dtensor_mlp_check",
    "engine_checks",
    "measured_tasks",
    "pipelining_grad_check",
]


def dtensor_mlp_check(rank: int, world_size: int, hidden: int = 16, seed: int = 0) -> dict:
    """Worker for ``distopt.launch``: the MLP under ``ColwiseParallel`` / ``RowwiseParallel``.

    Builds Linear(hidden, 4 hidden) -> GELU -> Linear(4 hidden, hidden) in float64 on every
    rank, parallelizes a copy over a 1-D CPU device mesh of ``world_size`` ranks, runs forward
    and backward on the same batch as the single-process module, with the input requiring a
    gradient (so that the backward all-reduce of Megatron's *f* runs), and returns the largest
    absolute differences of the outputs, of the (gathered) weight gradients and of the input
    gradients, and the all-reduces DTensor issued in the forward and in the backward pass
    (counted by ``torch.distributed.tensor.debug.CommDebugMode``).

    ``nn.Linear`` stores its weight as (out_features, in_features), so splitting the output
    features, a "column" split of y = x W^T, shards the stored weight along dim 0.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.set_default_dtype(torch.float64)
    torch.manual_seed(seed)
    reference = nn.Sequential(
        nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
    )
    parallel = nn.Sequential(
        nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
    )
    parallel.load_state_dict(reference.state_dict())
    mesh = init_device_mesh("cpu", (world_size,))
    parallelize_module(parallel, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})

    x = torch.randn(8, hidden, generator=torch.Generator().manual_seed(seed + 1))
    x_ref, x_par = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref = reference(x_ref)
    forward, backward = CommDebugMode(), CommDebugMode()
    with forward:
        y_par = parallel(x_par)
    y_ref.square().sum().backward()
    with backward:
        y_par.square().sum().backward()
    grad_diff = 0.0
    for p_ref, p_par in zip(reference.parameters(), parallel.parameters(), strict=True):
        full_grad = p_par.grad.full_tensor()  # gathers the shards of a DTensor gradient
        grad_diff = max(grad_diff, float((full_grad - p_ref.grad).abs().max()))
    local_shape = tuple(parallel[0].weight.to_local().shape)

    def all_reduces(mode: CommDebugMode) -> int:
        return sum(n for op, n in mode.get_comm_counts().items() if "all_reduce" in str(op))

    return {
        "rank": rank,
        "max_abs_output_diff": float((y_par - y_ref).abs().max()),
        "max_abs_grad_diff": grad_diff,
        "max_abs_input_grad_diff": float((x_par.grad - x_ref.grad).abs().max()),
        "local_weight_shape": local_shape,
        "forward_all_reduces": all_reduces(forward),
        "backward_all_reduces": all_reduces(backward),
    }


def _stage_model(seed: int, width: int, layers: int) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks: list[nn.Module] = []
        for _ in range(layers):
            blocks += [nn.Linear(width, width), nn.Tanh()]
        return nn.Sequential(*blocks)


def pipelining_grad_check(
    rank: int,
    world_size: int,
    schedules: Sequence[str] = ("gpipe", "1f1b"),
    micro_batches: int = 4,
    seed: int = 0,
) -> dict:
    """Worker for ``distopt.launch``: one training step with ``torch.distributed.pipelining``.

    A stack of ``2 * world_size`` Linear+Tanh blocks (width 16, float64) is cut into
    ``world_size`` stages, one per rank; a batch of 8 samples runs with ``ScheduleGPipe``
    (``"gpipe"``) and/or ``Schedule1F1B`` (``"1f1b"``) and a mean-squared-error loss per
    micro-batch (the schedule averages the micro-batch gradients). Returns, per schedule, the
    largest absolute difference between this rank's gradients and those of the unsplit model.
    """
    # Imported here so that only the spawned ranks pay for it (and see its warnings).
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    for schedule in schedules:
        if schedule not in classes:
            raise ValueError(f"schedule must be one of {tuple(classes)}, got {schedule!r}")
    width, per_stage, batch = 16, 2, 8
    torch.set_default_dtype(torch.float64)
    full = _stage_model(seed, width, per_stage * world_size)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, width, generator=gen)
    y = torch.randn(batch, width, generator=gen)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    # Reference: the whole model on one process, gradient of the mean micro-batch loss.
    pieces = zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True)
    (sum(loss_fn(full(xm), ym) for xm, ym in pieces) / micro_batches).backward()
    modules_per_stage = 2 * per_stage  # a Linear and a Tanh per block
    stage_module = full[rank * modules_per_stage : (rank + 1) * modules_per_stage]
    ref_grads = [p.grad.clone() for p in stage_module.parameters()]

    diffs = {}
    for schedule in schedules:
        stage_module.zero_grad()
        stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
        runner = classes[schedule](stage, n_microbatches=micro_batches, loss_fn=loss_fn)
        if rank == 0:
            runner.step(x)
        elif rank == world_size - 1:
            runner.step(target=y)
        else:
            runner.step()
        grads = zip(stage_module.parameters(), ref_grads, strict=True)
        diffs[schedule] = max(float((p.grad - g).abs().max()) for p, g in grads)
        dist.barrier()
    return {"rank": rank, "max_abs_grad_diff": diffs}


def engine_checks(rank: int, world_size: int, seed: int = 0) -> dict:
    """``dtensor_mlp_check`` then ``pipelining_grad_check`` in this rank's process.

    Returns ``{"tensor": <dtensor_mlp_check result>, "pipeline": <pipelining_grad_check
    result>}`` for this rank.
    """
    return {
        "tensor": dtensor_mlp_check(rank, world_size, seed=seed),
        "pipeline": pipelining_grad_check(rank, world_size, seed=seed),
    }


def measured_tasks(
    timelines: Sequence[Iterable[tuple[str, int, float, float]]], time_unit_s: float
) -> list[Task]:
    """Stages' measured timelines as :class:`distopt.sim.pipeline.Task` s (device = stage).

    ``timelines[s]`` holds stage s's ``(kind, micro_batch, start_s, end_s)`` entries
    (``time.perf_counter()`` seconds, one clock for every process of the machine). Times
    become multiples of ``time_unit_s`` from the earliest start, so ``plot_gantt`` and
    ``idle_fraction`` apply to a measured run as to a simulated one.
    """
    entries = [(s, *entry) for s, timeline in enumerate(timelines) for entry in timeline]
    if not entries:
        return []
    zero = min(start for *_, start, _ in entries)
    return [
        Task(s, kind, k, 0, (start - zero) / time_unit_s, (end - zero) / time_unit_s)
        for s, kind, k, start, end in entries
    ]
