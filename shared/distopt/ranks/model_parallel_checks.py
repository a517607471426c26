"""Checks for section 03's rank code: run it on real ranks, compare with one process.

The tensor-parallel and pipeline exercises hand each rank only what that rank holds in a real
run: ``fn(rank, world_size, shard)`` with ``shard = problem.shard(rank)``
(:class:`~distopt.problems.megatron_mlp.MegatronMLP`) or ``stage = problem.stage(rank)``
(:class:`~distopt.problems.pipeline_stack.PipelineStack`). Those parts are built in the
launching process and each rank receives its own only (:class:`OwnParts`): the bench, its
seed, the other ranks' data and the single-process reference never reach a rank, so rank code
cannot compute the answer without communicating; with ``guard=True`` a call of the package's
engines (:mod:`distopt.ranks.model_parallel_ranks`: DTensor's tensor parallelism, torch's
pipelining) or of the problem's methods fails as well (:func:`distopt.grading.own_work`). The
exercises' reference answers are not in this package.

Each run records the rank's communication with what each call carried
(:mod:`distopt.engine.record`); the ``assert_*`` helpers compare values, what each message
carried and in which order, and say which rank, which tensor and by how much they differ. A
pipeline stage's timeline is measured, not reported by the rank code: forward hooks on the
stage's model time each forward and note its input, the recorder times each backward pass
(:class:`StageRecording`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from distopt.engine import record
from distopt.engine.launcher import launch
from distopt.engine.own_parts import OwnParts
from distopt.engine.record import POINT_TO_POINT, SENDS, Call, Recording
from distopt.grading import own_work
from distopt.problems.megatron_mlp import PARAMS, MegatronMLP, mlp_block
from distopt.problems.pipeline_stack import PipelineStack
from distopt.ranks import model_parallel_ranks

__all__ = [
    "OwnParts",
    "StageRecording",
    "assert_fg_payloads",
    "assert_gpipe_messages",
    "assert_gpipe_timeline",
    "assert_mlp_matches",
    "assert_stage_grads_match",
    "by_pass",
    "point_to_point",
    "run_megatron_mlp",
    "run_pipeline",
    "stage_timeline",
]

# What the rank code may not call: the package's engines that do the exercise's work, and
# the problems, whose methods build the whole model (own_work watches every method of a class).
_MEGATRON_ANSWERS = (
    model_parallel_ranks.dtensor_mlp_check,
    model_parallel_ranks.engine_checks,
    MegatronMLP,
    mlp_block,
)
_PIPELINE_ANSWERS = (
    model_parallel_ranks.pipelining_grad_check,
    model_parallel_ranks.engine_checks,
    PipelineStack,
)
# A time stamp of another process may trail the event it follows by this much (seconds):
# perf_counter is one clock for every process of the machine, read a few instructions apart.
_CLOCK_SLACK_S = 1e-4
# Messages and partial sums are float64 computed in the same order as the reference, up to
# the all-reduce's own order of additions: relative to the largest entry.
_PAYLOAD_TOLERANCE = 1e-12


@dataclasses.dataclass
class StageRecording(Recording):
    """A stage's recording with its forwards measured: ``(start, end, input)`` per call of the
    stage's model, in order (``input`` a copy of the first tensor it was given)."""

    forwards: list[tuple[float, float, torch.Tensor | None]] = dataclasses.field(
        default_factory=list
    )

    def timeline(self) -> list[tuple[str, int, float, float]]:
        """The measured tasks in the order run: the i-th forward as ("F", i, start, end), the
        i-th backward pass as ("B", i, start, end) (:mod:`distopt.sim.pipeline`'s kinds)."""
        tasks = [("F", i, start, end) for i, (start, end, _) in enumerate(self.forwards)]
        tasks += [("B", i, start, end) for i, (start, end) in enumerate(self.backward)]
        return sorted(tasks, key=lambda task: task[2])


@contextmanager
def stage_timeline(
    model: torch.nn.Module, *, payloads: bool = False, messages: bool = True
) -> Iterator[StageRecording]:
    """Record a stage's communication, time each call of ``model`` (forward hooks, which also
    keep a copy of its input) and each backward pass (the recorder), until the block ends: a
    :class:`StageRecording`. ``messages=False`` times the tasks alone (no recorder, no input
    copies), for timing runs where every Python call a busy core must make counts."""
    forwards: list[list[Any]] = []

    def before(module: torch.nn.Module, args: tuple) -> None:
        first = next((a for a in args if isinstance(a, torch.Tensor)), None) if messages else None
        copy = None if first is None else first.detach().clone()
        forwards.append([time.perf_counter(), None, copy])

    def after(module: torch.nn.Module, args: tuple, output: Any) -> None:
        forwards[-1][1] = time.perf_counter()

    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    found = StageRecording()
    try:
        with record.communication(payloads=payloads) if messages else _backward_times() as log:
            yield found
    finally:
        for handle in handles:
            handle.remove()
        found.calls, found.backward = log.calls, log.backward
        found.forwards = [(start, end, x) for start, end, x in forwards if end is not None]


@contextmanager
def _backward_times() -> Iterator[Recording]:
    """Only the backward passes' (start, end), as the recorder times them, no calls."""
    log, original = Recording(), torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            log.backward.append((start, time.perf_counter()))

    torch.autograd.backward = backward
    try:
        yield log
    finally:
        torch.autograd.backward = original


def _guarded(fn: Callable, answers: tuple, guard: bool) -> Callable:
    if not guard:
        return fn
    return own_work(fn, *answers)


def _megatron_rank(fn: Callable, guard: bool, rank: int, world_size: int, parts: OwnParts):
    shard = parts.take(rank)
    fn = _guarded(fn, _MEGATRON_ANSWERS, guard)
    with record.communication(payloads=True) as log:
        value = fn(rank, world_size, shard)
    return value, log


def _pipeline_rank(fn: Callable, guard: bool, rank: int, world_size: int, parts: OwnParts):
    *warmups, stage = parts.take(rank)
    fn = _guarded(fn, _PIPELINE_ANSWERS, guard)
    for fresh in warmups:  # first calls pay for allocations and autograd's set-up
        fn(rank, world_size, fresh)
    # The ranks start one after another and build their stages at their own pace: start the
    # step together, so that a late rank's set-up does not count as pipeline idle time.
    dist.barrier()
    with stage_timeline(stage.model, payloads=True) as log:
        value = fn(rank, world_size, stage)
    return value, log


def run_megatron_mlp(
    fn: Callable, problem: MegatronMLP, *, guard: bool = True, timeout: float = 30
) -> list[tuple[Any, Recording]]:
    """``fn(rank, world_size, problem.shard(rank))`` on ``problem.world_size`` ranks.

    Returns ``(fn's value, its Recording)`` per rank, in rank order, with each call's payload.
    """
    # functools.partial, not a wrapper object: launch ships the cells fn's lines come from
    # (a rank's traceback shows them) by walking partial's arguments.
    runner = functools.partial(_megatron_rank, fn, guard)
    with OwnParts([problem.shard(r) for r in range(problem.world_size)]) as parts:
        return launch(runner, problem.world_size, parts, timeout=timeout)


def run_pipeline(
    fn: Callable,
    problem: PipelineStack,
    *,
    guard: bool = True,
    warmup: int = 0,
    timeout: float = 30,
) -> list[tuple[Any, StageRecording]]:
    """``fn(rank, world_size, problem.stage(rank))`` on ``problem.stages`` ranks.

    Returns ``(fn's value, its StageRecording)`` per rank, in rank order: the messages with
    what they carried, and the stage's measured forwards and backward passes
    (``log.timeline()``). The stages start the recorded call together (a barrier), after
    ``warmup`` unrecorded calls on fresh stages.
    For timing runs: ``warmup=1`` and ``guard=False`` (the guard's profile hook slows every
    Python call).
    """
    runner = functools.partial(_pipeline_rank, fn, guard)
    stages = [[problem.stage(r) for _ in range(warmup + 1)] for r in range(problem.stages)]
    with OwnParts(stages) as parts:
        return launch(runner, problem.stages, parts, timeout=timeout)


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


def assert_fg_payloads(results: Sequence[tuple[Any, Recording]], problem: MegatronMLP) -> None:
    """Each rank's two all-reduces carry what f and g sum: its partial output
    GELU(x w_in_r + b_in_r) w_out_r in the forward pass (b_out is added after the sum), and its
    partial dloss/dx through its own columns of w_in during the backward pass.

    Call it after the counts are checked (one all-reduce each way); with one rank the
    all-reduces may be skipped, and those made are checked the same way.
    """
    for rank, (_, log) in enumerate(results):
        who = f"rank {rank} of {problem.world_size}"
        forward, backward = by_pass(log, "all_reduce")
        partial_output, partial_input_grad = problem.partials(rank)
        for found, want, what, why in (
            (
                forward,
                partial_output,
                "forward (g)",
                "its partial output GELU(x w_in + b_in) "
                "w_out from its own blocks, before b_out is added",
            ),
            (
                backward,
                partial_input_grad,
                "backward (f)",
                "its partial dloss/dx, the gradient reaching x through its own columns of w_in",
            ),
        ):
            if problem.world_size > 1:
                assert len(found) == 1, (
                    f"{who}: {len(found)} all-reduce(s) in the {what} pass; expected one. "
                    f"Its traffic: {log.summary()}"
                )
            for call in found:
                sent = call.payload[0] if call.payload else None
                assert sent is not None and tuple(sent.shape) == tuple(want.shape), (
                    f"{who}: its {what} all-reduce carried a tensor of shape "
                    f"{None if sent is None else tuple(sent.shape)}; expected {why}, "
                    f"{tuple(want.shape)}"
                )
                diff = float((sent.to(torch.float64) - want).abs().max())
                scale = max(1.0, float(want.abs().max()))
                assert diff <= _PAYLOAD_TOLERANCE * scale, (
                    f"{who}: its {what} all-reduce carried a tensor that differs from {why} by "
                    f"{diff:.2e} (largest entry {float(want.abs().max()):.3g}). The sum over the "
                    "ranks must be made of each rank's own part, not of zeros, copies or a "
                    "value found another way"
                )


def _grads_of(value: Any, who: str) -> list:
    listed = isinstance(value, list | tuple)
    assert listed and all(g is None or isinstance(g, torch.Tensor) for g in value), (
        f"{who} returned {type(value).__name__}"
        + (f" of {[type(v).__name__ for v in value][:3]}" if listed else "")
        + "; expected the list of its parameters' gradients, in stage.model.parameters() order"
    )
    return list(value)


def assert_stage_grads_match(
    results: Sequence[tuple[Any, Recording]], problem: PipelineStack, *, tolerance: float = 1e-12
) -> None:
    """Every stage's parameter gradients equal the unsplit model's on the whole batch.

    Each stage must return its gradients, in ``stage.model.parameters()`` order.
    """
    reference = problem.reference_grads()
    for rank, (value, _) in enumerate(results):
        who = f"stage {rank} of {problem.stages}"
        grads = _grads_of(value, who)
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


def _payload(call: Call) -> torch.Tensor | None:
    return call.payload[0] if call.payload else None


def _same(got: torch.Tensor | None, want: torch.Tensor) -> bool:
    if got is None or tuple(got.shape) != tuple(want.shape):
        return False
    if not want.numel():
        return True
    scale = max(1.0, float(want.abs().max()))
    return float((got.to(torch.float64) - want).abs().max()) <= _PAYLOAD_TOLERANCE * scale


def assert_gpipe_messages(results: Sequence[tuple[Any, Recording]], problem: PipelineStack) -> None:
    """What each stage's messages carried, and in which order (the recorder's payloads).

    Stage s < p - 1 sends stage s + 1 the activations of micro-batches 0, 1, ..., m - 1 in
    that order (the output of its layers for each), every one before its first gradient
    receive from s + 1 (GPipe: all the forwards first); stage s > 0 sends stage s - 1 the
    gradients with respect to its inputs, of micro-batches 0, 1, ..., m - 1 in that order.
    Zeros, copies or any other tensor of the right size fail.
    """
    activations, gradients = problem.boundaries()
    p, m = problem.stages, problem.micro_batches
    for rank, (_, log) in enumerate(results):
        who = f"stage {rank} of {p}"
        calls = [c for c in log.calls if c.name in POINT_TO_POINT]
        if rank < p - 1:
            ahead = [i for i, c in enumerate(calls) if c.name in SENDS and c.peer == rank + 1]
            want = activations[rank + 1]
            assert len(ahead) == m, (
                f"{who} sent {len(ahead)} messages to stage {rank + 1}; expected {m}, the "
                "activation of each micro-batch"
            )
            for k, i in enumerate(ahead):
                if not _same(_payload(calls[i]), want[k]):
                    match = [j for j in range(m) if _same(_payload(calls[i]), want[j])]
                    raise AssertionError(
                        f"{who}: its activation message {k} to stage {rank + 1} "
                        + (
                            f"carried micro-batch {match[0]}'s activation; GPipe sends them "
                            f"in micro-batch order 0..{m - 1}"
                            if match
                            else "carried no micro-batch's activation (the output of its "
                            "layers for that micro-batch, out.detach()): a message must carry "
                            "what the next stage computes from"
                        )
                    )
            back = [i for i, c in enumerate(calls) if c.name not in SENDS and c.peer == rank + 1]
            assert not back or max(ahead) < back[0], (
                f"{who}: its activation message {sum(i > back[0] for i in ahead)} of {m} to "
                f"stage {rank + 1} left after its first gradient receive from that stage; "
                "GPipe runs every forward before the first backward"
            )
        if rank > 0:
            behind = [i for i, c in enumerate(calls) if c.name in SENDS and c.peer == rank - 1]
            want = gradients[rank]
            assert len(behind) == m, (
                f"{who} sent {len(behind)} messages to stage {rank - 1}; expected {m}, the "
                "gradient of each micro-batch's input"
            )
            for k, i in enumerate(behind):
                if not _same(_payload(calls[i]), want[k]):
                    match = [j for j in range(m) if _same(_payload(calls[i]), want[j])]
                    raise AssertionError(
                        f"{who}: its gradient message {k} to stage {rank - 1} "
                        + (
                            f"carried micro-batch {match[0]}'s gradient; the backwards run "
                            f"in micro-batch order 0..{m - 1} too"
                            if match
                            else "carried no micro-batch's input gradient (x.grad after that "
                            "micro-batch's backward pass, the loss being the mean over the "
                            "whole batch)"
                        )
                    )


def assert_gpipe_timeline(results: Sequence[tuple[Any, Recording]], problem: PipelineStack) -> None:
    """Each stage's measured timeline is a GPipe step, and no task starts before its input
    existed.

    The timeline is the recorder's, not the rank code's (:func:`run_pipeline`): each call of
    the stage's model is a forward, identified by its input (micro-batch k's), and each
    backward pass (``.backward()``) a backward, the i-th that of micro-batch i. Per stage: one
    forward and one backward per micro-batch, the forwards in micro-batch order, every
    forward ending before the first backward starts; across stages, F of micro-batch k on
    stage s starts after it ended on s - 1, and B after it ended on s + 1.
    """
    m, p = problem.micro_batches, problem.stages
    activations, _ = problem.boundaries()
    ends: dict[tuple[str, int, int], float] = {}
    starts: dict[tuple[str, int, int], float] = {}
    for rank, (_, log) in enumerate(results):
        who = f"stage {rank}"
        assert isinstance(log, StageRecording), (
            f"{who}: no measured timeline; run the stages with run_pipeline"
        )
        forwards = log.forwards
        assert len(forwards) == m, (
            f"{who}: its model ran {len(forwards)} time(s) in the step; expected {m}, once per "
            "micro-batch (the whole batch at once, or a micro-batch twice, is another schedule). "
            "Call stage.model(x) itself, not its layers one by one: the check times its calls"
        )
        for k, (start, end, x) in enumerate(forwards):
            assert x is not None and _same(x, activations[rank][k]), (
                f"{who}: its forward {k} ran on "
                + (
                    "no micro-batch's input"
                    if x is None or not any(_same(x, a) for a in activations[rank])
                    else "another micro-batch's input"
                )
                + f"; GPipe runs micro-batches 0..{m - 1} in order, each on the input "
                "received (stage 0: stage.inputs[k])"
            )
            starts[("F", k, rank)], ends[("F", k, rank)] = start, end
        assert len(log.backward) == m, (
            f"{who}: the recorder saw {len(log.backward)} backward pass(es); expected {m}, one "
            "per micro-batch (out.backward(grad) for each)"
        )
        for k, (start, end) in enumerate(log.backward):
            starts[("B", k, rank)], ends[("B", k, rank)] = start, end
        ordered = log.timeline()
        for a, b in zip(ordered, ordered[1:], strict=False):
            assert a[3] <= b[2], f"{who}: {a[0]}{a[1]} and {b[0]}{b[1]} overlap in time"
        last_forward = max(end for _, end, _ in forwards)
        first_backward = min(start for start, _ in log.backward)
        assert last_forward <= first_backward, (
            f"{who}: a backward starts before the last forward ends; GPipe runs all the "
            "forwards first"
        )
    for k in range(m):
        for s in range(1, p):
            assert starts[("F", k, s)] >= ends[("F", k, s - 1)] - _CLOCK_SLACK_S, (
                f"F of micro-batch {k} starts on stage {s} before it ended on stage {s - 1}"
            )
            assert starts[("B", k, s - 1)] >= ends[("B", k, s)] - _CLOCK_SLACK_S, (
                f"B of micro-batch {k} starts on stage {s - 1} before it ended on stage {s}"
            )
