"""Tests of distopt.ranks.model_parallel_checks: typical wrong answers fail, the guard works.

The right answers pass in test_model_parallel.py; here each check must catch a typical bug
of section 03's exercises, and the guard must stop rank code that calls the package's answer
or builds the whole model from the problem.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from autograder.references.model_parallel import gpipe_stage
from distopt import LaunchError
from distopt.problems.megatron_mlp import PARAMS, MegatronMLP
from distopt.problems.pipeline_stack import PipelineStack
from distopt.ranks import model_parallel_checks as checks


def _mlp_rank(shard, *, f_backward_reduces=True, g_backward_reduces=False, reduce_after=False):
    """The Megatron block with f and g as plain functions, bugs switched on by the flags."""

    class F_(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            if f_backward_reduces:
                dist.all_reduce(grad)
            return grad

    class G_(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            total = partial.clone()
            dist.all_reduce(total)
            return total

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            if g_backward_reduces:
                dist.all_reduce(grad)
            return grad

    params = {name: getattr(shard, name).clone().requires_grad_() for name in PARAMS}
    x = shard.x.clone().requires_grad_()
    hidden = F.gelu(F_.apply(x) @ params["w_in"] + params["b_in"])
    y = G_.apply(hidden @ params["w_out"]) + params["b_out"]
    y.backward(shard.grad_output)
    if reduce_after:  # the input gradient summed after the backward pass, not inside it
        dist.all_reduce(x.grad)
    return y.detach(), {name: p.grad for name, p in params.items()}, x.grad


def no_f_all_reduce(rank, world_size, shard):
    return _mlp_rank(shard, f_backward_reduces=False)


def g_all_reduces_backward(rank, world_size, shard):
    return _mlp_rank(shard, g_backward_reduces=True)


def input_grad_reduced_after_backward(rank, world_size, shard):
    return _mlp_rank(shard, f_backward_reduces=False, reduce_after=True)


def test_a_missing_f_all_reduce_fails_on_the_input_gradient():
    problem = MegatronMLP(world_size=2)
    results = checks.run_megatron_mlp(no_f_all_reduce, problem)
    with pytest.raises(AssertionError, match="rank 0 of 2: the input gradient"):
        checks.assert_mlp_matches(results, problem)


def test_a_second_all_reduce_in_g_fails_on_the_weight_gradients():
    problem = MegatronMLP(world_size=2)
    results = checks.run_megatron_mlp(g_all_reduces_backward, problem)
    with pytest.raises(AssertionError, match="gradient of its w_in block"):
        checks.assert_mlp_matches(results, problem)


def test_an_all_reduce_after_the_backward_pass_counts_as_forward_traffic():
    problem = MegatronMLP(world_size=2)
    results = checks.run_megatron_mlp(input_grad_reduced_after_backward, problem)
    checks.assert_mlp_matches(results, problem)  # right values, ...
    for _, log in results:  # ... but the all-reduce of f is not in the backward pass
        forward, backward = checks.by_pass(log, "all_reduce")
        assert (len(forward), len(backward)) == (2, 0)


def mean_per_micro_batch(rank, world_size, stage):
    """GPipe with each micro-batch's loss averaged over its own samples: m times too large."""
    wrong = type(stage)(**{**stage.__dict__, "batch_size": stage.micro_batch})
    return gpipe_stage(rank, world_size, wrong)


def test_a_loss_not_averaged_over_the_whole_batch_fails():
    problem = PipelineStack(stages=2, micro_batches=4)
    results = checks.run_pipeline(mean_per_micro_batch, problem, guard=False)
    with pytest.raises(AssertionError, match="stage 0 of 2: the gradient of parameter 0"):
        checks.assert_stage_grads_match(results, problem)


def peeks_at_the_problem(rank, world_size, stage):
    return PipelineStack(stages=world_size).reference_grads()[rank]


def runs_dtensor(rank, world_size, shard):
    from distopt.ranks.model_parallel_ranks import dtensor_mlp_check

    return dtensor_mlp_check(rank, world_size)


def runs_torch_pipelining(rank, world_size, stage):
    from distopt.ranks.model_parallel_ranks import pipelining_grad_check

    return pipelining_grad_check(rank, world_size)


@pytest.mark.parametrize(
    ("run", "fn", "problem"),
    [
        (checks.run_megatron_mlp, runs_dtensor, MegatronMLP(world_size=1)),
        (checks.run_pipeline, runs_torch_pipelining, PipelineStack(stages=1)),
        (checks.run_pipeline, peeks_at_the_problem, PipelineStack(stages=1)),
    ],
)
def test_the_guard_stops_the_package_engines_and_the_whole_problem(run, fn, problem):
    with pytest.raises(LaunchError, match="NotYourOwnWork"):
        run(fn, problem)


def _measured(problem, timelines):
    """Per stage, a StageRecording of the given tasks: forwards run on the right inputs."""
    activations, _ = problem.boundaries()
    results = []
    for rank, timeline in enumerate(timelines):
        log = checks.StageRecording()
        log.forwards = [(start, end, activations[rank][k]) for kind, k, start, end in timeline
                        if kind == "F"]  # fmt: skip
        log.backward = [(start, end) for kind, _, start, end in timeline if kind == "B"]
        results.append((None, log))
    return results


def test_gpipe_timeline_accepts_gpipe_and_refuses_other_orders_and_acausal_times():
    problem = PipelineStack(stages=2, micro_batches=2)
    gpipe = [
        [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 5, 7), ("B", 1, 7, 9)],
        [("F", 0, 1, 2), ("F", 1, 2, 3), ("B", 0, 3, 5), ("B", 1, 5, 7)],
    ]
    checks.assert_gpipe_timeline(_measured(problem, gpipe), problem)
    one_f_one_b = [gpipe[0], [("F", 0, 1, 2), ("B", 0, 2, 4), ("F", 1, 4, 5), ("B", 1, 5, 7)]]
    with pytest.raises(AssertionError, match="GPipe runs all the forwards first"):
        checks.assert_gpipe_timeline(_measured(problem, one_f_one_b), problem)
    too_early = [gpipe[0], [("F", 0, 0.5, 2), *gpipe[1][1:]]]
    with pytest.raises(AssertionError, match="starts on stage 1 before it ended on stage 0"):
        checks.assert_gpipe_timeline(_measured(problem, too_early), problem)
    missing = [gpipe[0][:3], gpipe[1]]
    with pytest.raises(AssertionError, match="backward pass"):
        checks.assert_gpipe_timeline(_measured(problem, missing), problem)
    swapped = [[("F", 1, 0, 1), ("F", 0, 1, 2), *gpipe[0][2:]], gpipe[1]]
    with pytest.raises(AssertionError, match="stage 0: its forward 0 ran on another micro-batch"):
        checks.assert_gpipe_timeline(_measured(problem, swapped), problem)


def _whole_batch(rank, world_size, stage):
    first, last = rank == 0, rank == world_size - 1
    m, b, w = stage.micro_batches, stage.micro_batch, stage.width
    if first:
        x = torch.cat(list(stage.inputs))
    else:
        x = torch.empty((m * b, w), dtype=torch.float64)
        for k in range(m):  # m messages, each a micro-batch, as GPipe sends them
            part = torch.empty((b, w), dtype=torch.float64)
            dist.recv(part, src=rank - 1)
            x[k * b : (k + 1) * b] = part
        x.requires_grad_()
    out = stage.model(x)
    if last:
        pieces = zip(out.split(b), stage.targets, strict=True)
        out = sum(stage.loss_sum(o, t) for o, t in pieces) / (m * b)
    else:
        for part in out.detach().split(b):
            dist.send(part.contiguous(), dst=rank + 1)
    grad = None
    if not last:
        grad = torch.empty((m * b, w), dtype=torch.float64)
        for k in range(m):
            part = torch.empty((b, w), dtype=torch.float64)
            dist.recv(part, src=rank + 1)
            grad[k * b : (k + 1) * b] = part
    out.backward(grad)
    if not first:
        for part in x.grad.split(b):
            dist.send(part.contiguous(), dst=rank - 1)
    return [p.grad for p in stage.model.parameters()]


def test_a_drawn_chart_does_not_pass_the_measured_timeline():
    """Right gradients and GPipe's messages, but one forward of the whole batch per stage: a
    chart drawn by the rank code would say GPipe, the measured one has one forward and one
    backward per stage."""
    problem = PipelineStack(stages=2, micro_batches=3)
    results = checks.run_pipeline(_whole_batch, problem, guard=False)
    checks.assert_stage_grads_match(results, problem)
    checks.assert_gpipe_messages(results, problem)  # the messages are GPipe's
    with pytest.raises(AssertionError, match="its model ran 1 time"):
        checks.assert_gpipe_timeline(results, problem)


def activations_out_of_order(rank, world_size, stage):
    """GPipe with the micro-batches' forwards in reverse order: right sums, wrong order."""
    reverse = type(stage)(**{**stage.__dict__, "inputs": stage.inputs and stage.inputs[::-1],
                             "targets": stage.targets and stage.targets[::-1]})  # fmt: skip
    return gpipe_stage(rank, world_size, reverse)


def test_gpipe_messages_out_of_micro_batch_order_fail():
    problem = PipelineStack(stages=2, micro_batches=3)
    results = checks.run_pipeline(activations_out_of_order, problem, guard=False)
    checks.assert_stage_grads_match(results, problem)  # the same sums
    with pytest.raises(AssertionError, match="carried micro-batch 2's activation"):
        checks.assert_gpipe_messages(results, problem)


def test_f_and_g_payloads_must_be_the_partials():
    problem = MegatronMLP(world_size=2)
    results = checks.run_megatron_mlp(offsets_that_cancel_in_g, problem, guard=False)
    checks.assert_mlp_matches(results, problem)  # the sums come out right
    with pytest.raises(AssertionError, match="rank 0 of 2: its forward \\(g\\) all-reduce"):
        checks.assert_fg_payloads(results, problem)
    results = checks.run_megatron_mlp(offsets_that_cancel, problem, guard=False)
    checks.assert_mlp_matches(results, problem)
    with pytest.raises(AssertionError, match="its backward \\(f\\) all-reduce carried"):
        checks.assert_fg_payloads(results, problem)


def offsets_that_cancel_in_g(rank, world_size, shard):
    """g sums the partial output plus an offset, +1 on rank 0 and -1 on rank 1: the output is
    right, what each rank sent is not its partial output."""
    params = {name: getattr(shard, name).clone().requires_grad_() for name in PARAMS}
    x = shard.x.clone().requires_grad_()
    hidden = F.gelu(_F.apply(x) @ params["w_in"] + params["b_in"])
    offset = 1.0 if rank == 0 else -1.0 if rank == 1 else 0.0
    y = _G.apply(hidden @ params["w_out"] + offset) + params["b_out"]
    y.backward(shard.grad_output)
    return y.detach(), {name: p.grad for name, p in params.items()}, x.grad


def offsets_that_cancel(rank, world_size, shard):
    """f's backward sums its partial dx plus an offset, +1 on rank 0 and -1 on rank 1: the
    sum is right, what rank 0 and rank 1 sent is not their own part."""

    class Offset(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            grad = grad + (1.0 if rank == 0 else -1.0 if rank == 1 else 0.0)
            dist.all_reduce(grad)
            return grad

    params = {name: getattr(shard, name).clone().requires_grad_() for name in PARAMS}
    x = shard.x.clone().requires_grad_()
    hidden = F.gelu(Offset.apply(x) @ params["w_in"] + params["b_in"])
    y = _G.apply(hidden @ params["w_out"]) + params["b_out"]
    y.backward(shard.grad_output)
    return y.detach(), {name: p.grad for name, p in params.items()}, x.grad


class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad
