"""Tests of distopt.ranks.model_parallel_checks: typical wrong answers fail, the guard works.

The right answers pass in test_model_parallel.py; here each check must catch a typical bug
of section 03's exercises, and the guard must stop rank code that calls the package's answer
or builds the whole model from the problem.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from distopt import LaunchError
from distopt.problems.megatron_mlp import PARAMS, MegatronMLP
from distopt.problems.pipeline_stack import PipelineStack
from distopt.ranks import model_parallel_checks as checks
from distopt.ranks.model_parallel_ranks import gpipe_stage, megatron_mlp_rank


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
    return PipelineStack(stages=world_size).reference_grads()[rank], []


@pytest.mark.parametrize(
    ("run", "fn", "problem"),
    [
        (checks.run_megatron_mlp, megatron_mlp_rank, MegatronMLP(world_size=1)),
        (checks.run_pipeline, gpipe_stage, PipelineStack(stages=1)),
        (checks.run_pipeline, peeks_at_the_problem, PipelineStack(stages=1)),
    ],
)
def test_the_guard_stops_the_package_answers_and_the_whole_problem(run, fn, problem):
    with pytest.raises(LaunchError, match="NotYourOwnWork"):
        run(fn, problem)


def _results(timelines):
    return [((None, timeline), None) for timeline in timelines]


def test_gpipe_timeline_accepts_gpipe_and_refuses_other_orders_and_acausal_times():
    problem = PipelineStack(stages=2, micro_batches=2)
    gpipe = [
        [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 5, 7), ("B", 1, 7, 9)],
        [("F", 0, 1, 2), ("F", 1, 2, 3), ("B", 0, 3, 5), ("B", 1, 5, 7)],
    ]
    checks.assert_gpipe_timeline(_results(gpipe), problem)
    one_f_one_b = [gpipe[0], [("F", 0, 1, 2), ("B", 0, 2, 4), ("F", 1, 4, 5), ("B", 1, 5, 7)]]
    with pytest.raises(AssertionError, match="GPipe runs all the forwards first"):
        checks.assert_gpipe_timeline(_results(one_f_one_b), problem)
    too_early = [gpipe[0], [("F", 0, 0.5, 2), *gpipe[1][1:]]]
    with pytest.raises(AssertionError, match="starts on stage 1 before it ended on stage 0"):
        checks.assert_gpipe_timeline(_results(too_early), problem)
    missing = [gpipe[0][:3], gpipe[1]]
    with pytest.raises(AssertionError, match="expected each of 0..1 once"):
        checks.assert_gpipe_timeline(_results(missing), problem)
