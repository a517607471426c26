"""Checks for section 03's rank code: run it on real ranks, compare with one process.

The tensor-parallel and pipeline exercises hand each rank only what that rank holds in a real
run: ``fn(rank, world_size, problem.shard(rank))`` (:class:`~distopt.problems.megatron_mlp.
MegatronMLP`) or ``fn(rank, world_size, problem.stage(rank))`` (:class:`~distopt.problems.
pipeline_stack.PipelineStack`). The whole model, the other ranks' data and the single-process
reference stay in the test, so rank code cannot compute the answer without communicating;
with ``guard=True`` a call of the package's own answers (:mod:`distopt.ranks.model_parallel_ranks`)
or of the problem's whole-model methods fails as well (:func:`distopt.grading.own_work`).

Each run records the rank's communication (:mod:`distopt.engine.record`); the ``assert_*``
helpers compare values and say which rank, which tensor and by how much they differ.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from distopt.engine import record
from distopt.engine.launcher import launch
from distopt.engine.record import POINT_TO_POINT, SENDS, Call, Recording
from distopt.grading import own_work
from distopt.problems.megatron_mlp import PARAMS, MegatronMLP, mlp_block
from distopt.problems.pipeline_stack import PipelineStack
from distopt.ranks import model_parallel_ranks

__all__ = [
    "assert_gpipe_timeline",
    "assert_mlp_matches",
    "assert_stage_grads_match",
    "by_pass",
    "point_to_point",
    "run_megatron_mlp",
    "run_pipeline",
]

# What the rank code may not call: the package's answers, and the problems, whose methods
# build the whole model (own_work watches every method of a class it is given).
_MEGATRON_ANSWERS = (
    model_parallel_ranks.megatron_mlp_rank,
    model_parallel_ranks.CopyToTensorParallel,
    model_parallel_ranks.ReduceFromTensorParallel,
    model_parallel_ranks.dtensor_mlp_check,
    model_parallel_ranks.engine_checks,
    MegatronMLP,
    mlp_block,
)
_PIPELINE_ANSWERS = (
    model_parallel_ranks.gpipe_stage,
    model_parallel_ranks.pipelining_grad_check,
    model_parallel_ranks.engine_checks,
    PipelineStack,
)
# A time stamp of another process may trail the event it follows by this much (seconds):
# perf_counter is one clock for every process of the machine, read a few instructions apart.
_CLOCK_SLACK_S = 1e-4


def _guarded(fn: Callable, answers: tuple, guard: bool) -> Callable:
    if not guard:
        return fn
    return own_work(fn, *answers)


def _megatron_rank(fn: Callable, guard: bool, rank: int, world_size: int, problem: MegatronMLP):
    shard = problem.shard(rank)
    fn = _guarded(fn, _MEGATRON_ANSWERS, guard)
    with record.communication() as log:
        value = fn(rank, world_size, shard)
    return value, log


def _pipeline_rank(
    fn: Callable, guard: bool, warmup: int, rank: int, world_size: int, problem: PipelineStack
):
    fn = _guarded(fn, _PIPELINE_ANSWERS, guard)
    for _ in range(warmup):  # first calls pay for allocations and autograd's set-up
        fn(rank, world_size, problem.stage(rank))
    stage = problem.stage(rank)
    # The ranks start one after another and build their stages at their own pace: start the
    # step together, so that a late rank's set-up does not count as pipeline idle time.
    dist.barrier()
    with record.communication() as log:
        value = fn(rank, world_size, stage)
    return value, log


def run_megatron_mlp(
    fn: Callable, problem: MegatronMLP, *, guard: bool = True, timeout: float = 30
) -> list[tuple[Any, Recording]]:
    """``fn(rank, world_size, problem.shard(rank))`` on ``problem.world_size`` ranks.

    Returns ``(fn's value, its Recording)`` per rank, in rank order.
    """
    # functools.partial, not a wrapper object: launch ships the cells fn's lines come from
    # (a rank's traceback shows them) by walking partial's arguments.
    runner = functools.partial(_megatron_rank, fn, guard)
    return launch(runner, problem.world_size, problem, timeout=timeout)


def run_pipeline(
    fn: Callable,
    problem: PipelineStack,
    *,
    guard: bool = True,
    warmup: int = 0,
    timeout: float = 30,
) -> list[tuple[Any, Recording]]:
    """``fn(rank, world_size, problem.stage(rank))`` on ``problem.stages`` ranks.

    Returns ``(fn's value, its Recording)`` per rank, in rank order. The stages start the
    recorded call together (a barrier), after ``warmup`` unrecorded calls on fresh stages.
    For timing runs: ``warmup=1`` and ``guard=False`` (the guard's profile hook slows every
    Python call).
    """
    runner = functools.partial(_pipeline_rank, fn, guard, warmup)
    return launch(runner, problem.stages, problem, timeout=timeout)


def by_pass(log: Recording, name: str) -> tuple[list[Call], list[Call]]:
    """The calls named ``name`` made outside any backward pass, and those made during one."""
    during = log.during_backward(name)
    return [c for c in log.of(name) if all(c is not d for d in during)], during


def point_to_point(log: Recording) -> dict[tuple[str, int | None], list[int]]:
    """This rank's messages by direction and peer: ``{("send", peer): [bytes, ...], ...}``.

    ``send``/``isend`` count as "send", ``recv``/``irecv`` as "recv", in the order made.
    """
    found: dict[tuple[str, int | None], list[int]] = {}
    for call in log.calls:
        if call.name in POINT_TO_POINT:
            way = "send" if call.name in SENDS else "recv"
            found.setdefault((way, call.peer), []).append(call.payload_bytes)
    return found


def _largest_diff(got: Any, expected: torch.Tensor, what: str) -> float:
    assert got is not None, f"{what} is None: did the backward pass reach that tensor?"
    got = torch.as_tensor(got)
    assert tuple(got.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    )
    return float((got.to(torch.float64) - expected).abs().max()) if expected.numel() else 0.0


def _assert_close(got: Any, expected: torch.Tensor, what: str, tolerance: float, hint: str):
    diff = _largest_diff(got, expected, what)
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    assert diff <= tolerance * scale, (
        f"{what} differs from one process by {diff:.2e} (tolerance {tolerance * scale:.1e}). "
        + hint
    )


def assert_mlp_matches(
    results: Sequence[tuple[Any, Recording]], problem: MegatronMLP, *, tolerance: float = 1e-12
) -> None:
    """Every rank's output, shard gradients and input gradient equal the unsplit block's.

    Each rank must return ``(output, grads, input_grad)`` with ``grads`` a dict keyed
    "w_in", "b_in", "w_out", "b_out" of its shard's gradients. The tolerance is absolute,
    times the largest entry of the reference where that is above 1.
    """
    reference = problem.reference()
    shard_grads = []
    for rank, (value, _) in enumerate(results):
        who = f"rank {rank} of {problem.world_size}"
        assert isinstance(value, tuple | list) and len(value) == 3, (
            f"{who} returned {type(value).__name__}; expected (output, grads, input_grad)"
        )
        output, grads, input_grad = value
        _assert_close(
            output,
            reference.output,
            f"{who}: the output",
            tolerance,
            "Is the partial output all-reduced once (g's forward), and b_out added after it, once? "
            "(GELU: F.gelu's default, exact form)",
        )
        assert isinstance(grads, dict) and set(grads) == set(PARAMS), (
            f"{who}: grads should be a dict with keys {PARAMS}, got "
            f"{sorted(grads) if isinstance(grads, dict) else type(grads).__name__}"
        )
        for name in PARAMS:
            _assert_close(
                grads[name],
                problem.split(name, reference.grads[name], rank),
                f"{who}: the gradient of its {name} block",
                tolerance,
                "Does g's backward pass the gradient through unchanged (no second all-reduce)?",
            )
        _assert_close(
            input_grad,
            reference.input_grad,
            f"{who}: the input gradient",
            tolerance,
            "Each rank holds only part of dloss/dx: f's backward must sum them (all-reduce).",
        )
        shard_grads.append(grads)
    for name, whole in problem.gather(shard_grads).items():
        _assert_close(
            whole, reference.grads[name], f"the gathered gradient of {name}", tolerance, ""
        )


def assert_stage_grads_match(
    results: Sequence[tuple[Any, Recording]], problem: PipelineStack, *, tolerance: float = 1e-12
) -> None:
    """Every stage's parameter gradients equal the unsplit model's on the whole batch.

    Each stage must return ``(grads, timeline)``, grads in ``stage.model.parameters()`` order.
    """
    reference = problem.reference_grads()
    for rank, (value, _) in enumerate(results):
        who = f"stage {rank} of {problem.stages}"
        assert isinstance(value, tuple | list) and len(value) == 2, (
            f"{who} returned {type(value).__name__}; expected (grads, timeline)"
        )
        grads = list(value[0])
        assert len(grads) == len(reference[rank]), (
            f"{who} returned {len(grads)} gradients; its model has {len(reference[rank])} "
            "parameters (weights and biases)"
        )
        for index, (got, expected) in enumerate(zip(grads, reference[rank], strict=True)):
            _assert_close(
                got,
                expected,
                f"{who}: the gradient of parameter {index}",
                tolerance,
                "The loss is the mean over the whole batch (loss_sum / batch_size), summed "
                "over the micro-batches; is each micro-batch's gradient sent to the right stage?",
            )


def assert_gpipe_timeline(results: Sequence[tuple[Any, Recording]], problem: PipelineStack) -> None:
    """Each stage's timeline is a GPipe step, and no task starts before its input existed.

    Per stage: one "F" and one "B" per micro-batch, as (kind, micro_batch, start, end) with
    start <= end, not overlapping, every F ending before the first B starts; across stages,
    F of micro-batch k on stage s starts after it ended on s - 1, and B after it ended on s + 1.
    """
    m, p = problem.micro_batches, problem.stages
    ends: dict[tuple[str, int, int], float] = {}
    starts: dict[tuple[str, int, int], float] = {}
    for rank, (value, _) in enumerate(results):
        who = f"stage {rank}"
        timeline = [tuple(entry) for entry in value[1]]
        assert all(len(entry) == 4 for entry in timeline), (
            f"{who}: timeline entries should be (kind, micro_batch, start, end), got {timeline[:2]}"
        )
        for kind in ("F", "B"):
            seen = sorted(k for (what, k, _, _) in timeline if what == kind)
            assert seen == list(range(m)), (
                f"{who}: {kind} tasks for micro-batches {seen}; expected each of 0..{m - 1} once"
            )
        assert len(timeline) == 2 * m, f"{who}: {len(timeline)} entries, expected 2 x {m}"
        ordered = sorted(timeline, key=lambda entry: entry[2])
        for kind, k, start, end in ordered:
            assert start <= end, f"{who}: {kind} of micro-batch {k} ends before it starts"
            starts[(kind, k, rank)], ends[(kind, k, rank)] = start, end
        for a, b in zip(ordered, ordered[1:], strict=False):
            assert a[3] <= b[2], f"{who}: {a[0]}{a[1]} and {b[0]}{b[1]} overlap in time"
        last_forward = max(end for kind, _, _, end in timeline if kind == "F")
        first_backward = min(start for kind, _, start, _ in timeline if kind == "B")
        assert last_forward <= first_backward, (
            f"{who}: a backward starts before the last forward ends; GPipe runs all the "
            "forwards first"
        )
    for k in range(m):
        for s in range(1, p):
            assert starts[("F", k, s)] >= ends[("F", k, s - 1)] - _CLOCK_SLACK_S, (
                f"F of micro-batch {k} starts on stage {s} before it ended on stage {s - 1}: "
                "start the clock once the activation has arrived, stop it before sending"
            )
            assert starts[("B", k, s - 1)] >= ends[("B", k, s)] - _CLOCK_SLACK_S, (
                f"B of micro-batch {k} starts on stage {s - 1} before it ended on stage {s}: "
                "start the clock once the gradient has arrived, stop it before sending"
            )
