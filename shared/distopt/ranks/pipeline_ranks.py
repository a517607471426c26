"""Pipeline schedules on real ranks with emulated devices: 1F1B beside GPipe, measured.

On a laptop, 4 pipeline stages share 2 cores: a stage whose input has arrived may still wait
for a core, and its measured idle time says more about the operating system's scheduler than
about the schedule. Here each stage's compute is *emulated*: its model ends in a layer that
sleeps a stated time in its forward and in its backward pass. A sleeping process frees its
core, so p stages on fewer cores behave like p devices: every task takes the stated time
whatever else runs, and the idle time measured is the schedule's bubble, plus the messages'
latency.

* :func:`emulated`: a :class:`~distopt.problems.pipeline_stack.Stage` whose model sleeps
  ``forward_s`` per forward and ``backward_s`` per backward (the values are unchanged);
* :func:`one_f_one_b_stage`: one step of stage ``rank`` under 1F1B (Narayanan et al. 2021,
  Section 2.2, PipeDream-Flush): ``min(p - rank - 1, m)`` warm-up forwards, then one forward
  and one backward in turn, then the remaining backwards. Same contract as section 03's
  ``gpipe_stage``: it returns its gradients, and its timeline is measured around it;
* :class:`ActivationMeter`: the bytes autograd holds for backward passes (its saved tensors,
  parameters left out), now and at the peak: a stage's activations;
* :func:`sweep` (worker :func:`emulated_sweep`): runs stage functions (GPipe's, 1F1B's) on
  emulated stages for several micro-batch counts, several times each, each rank handed its
  own stages only, and returns their measured timelines, peak activation bytes and gradients.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from distopt.problems.pipeline_stack import PipelineStack, Stage

__all__ = [
    "ActivationMeter",
    "EmulatedCompute",
    "emulated",
    "emulated_sweep",
    "one_f_one_b_stage",
    "sweep",
]


class _Sleep(torch.autograd.Function):
    """Identity whose forward sleeps ``forward_s`` and whose backward sleeps ``backward_s``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        time.sleep(ctx.backward_s)
        return grad, None, None


class EmulatedCompute(nn.Module):
    """A layer that stands for a device's compute: it passes x through unchanged and sleeps
    ``forward_s`` seconds in the forward pass, ``backward_s`` in the backward pass."""

    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        if forward_s < 0 or backward_s < 0:
            raise ValueError(f"durations must be >= 0, got {forward_s}, {backward_s}")
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x, self.forward_s, self.backward_s)


def emulated(stage: Stage, *, forward_s: float, backward_s: float) -> Stage:
    """``stage`` on an emulated device: its model followed by :class:`EmulatedCompute`."""
    model = nn.Sequential(*stage.model, EmulatedCompute(forward_s, backward_s))
    return dataclasses.replace(stage, model=model)


def one_f_one_b_stage(rank: int, world_size: int, stage: Stage) -> list:
    """One 1F1B step of pipeline stage ``rank``; returns its gradients, like GPipe's.

    The same messages as GPipe (one activation to ``rank + 1`` and one gradient to
    ``rank - 1`` per micro-batch, ``dist.isend`` and a blocking ``dist.recv``), in another
    order: a stage starts the backward of micro-batch i as soon as it can, so it holds at most
    ``p - rank`` micro-batches' activations instead of all m.
    """
    first, last = rank == 0, rank == world_size - 1
    shape = (stage.micro_batch, stage.width)
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    sends = []

    def forward(k: int) -> None:
        if first:
            x = stage.inputs[k]
        else:
            x = torch.empty(shape, dtype=torch.float64)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        out = stage.model(x)
        if last:
            out = stage.loss_sum(out, stage.targets[k]) / stage.batch_size
        if not last:
            sends.append(dist.isend(out.detach(), dst=rank + 1))
        inputs[k], outputs[k] = x, out

    def backward(k: int) -> None:
        grad = None
        if not last:
            grad = torch.empty(shape, dtype=torch.float64)
            dist.recv(grad, src=rank + 1)
        outputs.pop(k).backward(grad)  # the graph, and the activations it saved, are freed
        x = inputs.pop(k)
        if not first:
            sends.append(dist.isend(x.grad, dst=rank - 1))

    m = stage.micro_batches
    warmup = min(world_size - rank - 1, m)
    for k in range(warmup):
        forward(k)
    for i in range(m - warmup):  # steady state: one forward, one backward
        forward(warmup + i)
        backward(i)
    for k in range(m - warmup, m):  # cool-down: the backwards left
        backward(k)
    for work in sends:
        work.wait()
    return [p.grad for p in stage.model.parameters()]


class _Saved:
    """What the pack hook hands autograd: the saved tensor, in an object that can be weakly
    referenced, so that the meter sees when autograd lets go of it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class ActivationMeter:
    """The bytes autograd holds for backward passes while the block runs, and their peak.

    ``with ActivationMeter(ignore=model.parameters()) as meter: ...``, then ``meter.peak``.
    Every tensor an operation saves for its backward passes through a pack hook
    (``torch.autograd.graph.saved_tensors_hooks``) and counts until autograd releases it (a
    backward pass that does not retain its graph releases what it used). Each saved tensor
    counts its own bytes, so a tensor saved by two operations counts twice: the count is
    proportional to the activations, the same for every micro-batch of a stage. Tensors that
    share storage with ``ignore`` (the weights, which every micro-batch uses) are left out.
    """

    def __init__(self, ignore: Iterable[torch.Tensor] = ()) -> None:
        self._ignored = {t.untyped_storage().data_ptr() for t in ignore}
        self.held = 0  # bytes held now
        self.peak = 0  # the most held at once
        self._hooks: Any = None

    def __enter__(self) -> ActivationMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, tensor: torch.Tensor) -> Any:
        if tensor.untyped_storage().data_ptr() in self._ignored:
            return tensor
        saved = _Saved(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        self.held += nbytes
        self.peak = max(self.peak, self.held)
        weakref.finalize(saved, self._release, nbytes)
        return saved

    def _release(self, nbytes: int) -> None:
        self.held -= nbytes

    @staticmethod
    def _unpack(saved: Any) -> torch.Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved


def emulated_sweep(
    rank: int,
    world_size: int,
    schedules: dict[str, Callable],
    parts: Any,
    micro_batches: Sequence[int],
    *,
    runs: int,
    forward_s: float,
    backward_s: float,
) -> dict[tuple[str, int, int], dict[str, Any]]:
    """Worker for ``distopt.launch`` (through :func:`sweep`): each schedule's stage function
    on emulated stages.

    ``parts`` is an :class:`~distopt.engine.own_parts.OwnParts` whose part for this
    rank maps ``m`` to a list of fresh stages of this rank (the bench stays in the launching
    process). For every name and ``fn`` in ``schedules`` (``fn(rank, world_size, stage)``
    returning the stage's gradients), every m in ``micro_batches`` and ``runs`` times: one
    step with m micro-batches on a fresh emulated stage, started together (a barrier), its
    timeline measured around ``fn`` (:func:`distopt.ranks.model_parallel_checks.
    stage_timeline`: the stage model's forwards and the backward passes, in the order run).
    One unrecorded step of each schedule comes first (first calls pay for allocations).
    Returns ``{(name, m, run): {"timeline", "peak_bytes", "grads"}}`` for this rank.
    """
    from distopt.ranks.model_parallel_checks import stage_timeline

    stages = parts.take(rank)
    found: dict[tuple[str, int, int], dict[str, Any]] = {}

    def step(fn: Callable, m: int) -> tuple[list, list, int]:
        stage = emulated(stages[m].pop(), forward_s=forward_s, backward_s=backward_s)
        dist.barrier()
        with ActivationMeter(ignore=stage.model.parameters()) as meter:
            with stage_timeline(stage.model, messages=False) as log:
                grads = fn(rank, world_size, stage)
        return grads, log.timeline(), meter.peak

    for fn in schedules.values():
        step(fn, min(micro_batches))
    for name, fn in schedules.items():
        for m in micro_batches:
            for run in range(runs):
                grads, timeline, peak = step(fn, m)
                found[(name, m, run)] = {
                    "timeline": [tuple(entry) for entry in timeline],
                    "peak_bytes": peak,
                    "grads": [g.clone() for g in grads] if run == 0 else None,
                }
    return found


def sweep(
    schedules: dict[str, Callable],
    problem: PipelineStack,
    micro_batches: Sequence[int],
    *,
    runs: int,
    forward_s: float,
    backward_s: float,
    timeout: float = 120,
) -> list[dict[tuple[str, int, int], dict[str, Any]]]:
    """:func:`emulated_sweep` on ``problem.stages`` ranks, each handed only its own fresh
    stages, built here: each rank's finds, in rank order."""
    from distopt.engine.launcher import launch
    from distopt.engine.own_parts import OwnParts

    def fresh(rank: int) -> dict[int, list[Stage]]:
        count = {m: len(schedules) * runs for m in micro_batches}
        count[min(micro_batches)] += len(schedules)  # the warm-up steps
        return {
            m: [dataclasses.replace(problem, micro_batches=m).stage(rank) for _ in range(n)]
            for m, n in count.items()
        }

    worker = functools.partial(
        emulated_sweep, runs=runs, forward_s=forward_s, backward_s=backward_s
    )
    with OwnParts([fresh(rank) for rank in range(problem.stages)]) as parts:
        return launch(worker, problem.stages, schedules, parts, micro_batches, timeout=timeout)
