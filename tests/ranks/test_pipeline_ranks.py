"""Tests of distopt.ranks.pipeline_ranks: 1F1B gives the unsplit model's gradients in 1F1B's
order, the activation meter counts what autograd holds, emulated stages sleep as stated."""

import time

import pytest
import torch

from autograder.references.model_parallel import gpipe_stage
from distopt.problems.pipeline_stack import PipelineStack
from distopt.ranks import model_parallel_checks as checks
from distopt.ranks import pipeline_ranks
from distopt.sim import pipeline


@pytest.mark.parametrize("stages,micro_batches", [(1, 3), (2, 4), (3, 2)])
def test_1f1b_gives_the_unsplit_gradients_in_1f1b_order(stages, micro_batches):
    problem = PipelineStack(stages=stages, micro_batches=micro_batches, width=5, seed=2)
    results = checks.run_pipeline(pipeline_ranks.one_f_one_b_stage, problem, guard=False)
    checks.assert_stage_grads_match(results, problem)
    orders = pipeline.schedule_order("1f1b", stages, micro_batches)
    for rank, (_, log) in enumerate(results):  # the timeline the check measured
        assert [(kind, k) for kind, k, _, _ in log.timeline()] == [
            (kind, k) for kind, k, _ in orders[rank]
        ]
        assert len(log.sent()) == micro_batches * ((rank > 0) + (rank < stages - 1))


def test_the_meter_counts_saved_activations_until_the_backward_frees_them():
    layer = torch.nn.Linear(4, 4).double()
    x = torch.ones(3, 4, dtype=torch.float64)
    with pipeline_ranks.ActivationMeter(ignore=layer.parameters()) as meter:
        first = torch.tanh(layer(x)).sum()
        one = meter.held
        second = torch.tanh(layer(x)).sum()
        assert meter.held == 2 * one > 0
        first.backward()
        assert meter.held == one
        second.backward()
    assert meter.held == 0 and meter.peak == 2 * one
    # the saved input (3 x 4) and tanh's output (3 x 4), float64; the weight is left out
    assert one == 2 * 3 * 4 * 8


def test_an_emulated_stage_sleeps_and_keeps_the_values():
    problem = PipelineStack(stages=1, micro_batches=1, width=3)
    stage = problem.stage(0)
    slow = pipeline_ranks.emulated(problem.stage(0), forward_s=0.02, backward_s=0.04)
    x = stage.inputs[0]
    start = time.perf_counter()
    out = slow.model(x)
    middle = time.perf_counter()
    out.sum().backward()
    end = time.perf_counter()
    assert torch.equal(out, stage.model(x))
    assert middle - start >= 0.02 and end - middle >= 0.04
    assert [p.shape for p in slow.model.parameters()] == [p.shape for p in stage.model.parameters()]


def test_the_sweep_measures_the_activations_each_schedule_holds():
    problem = PipelineStack(stages=3, micro_batches=1, width=4)
    schedules = {"gpipe": gpipe_stage, "1f1b": pipeline_ranks.one_f_one_b_stage}
    found = pipeline_ranks.sweep(
        schedules, problem, (1, 4), runs=1, forward_s=0.001, backward_s=0.002, timeout=60
    )
    for name in schedules:
        tasks = pipeline.simulate(name, 3, 4)
        alive = [
            found[s][(name, 4, 0)]["peak_bytes"] / found[s][(name, 1, 0)]["peak_bytes"]
            for s in range(3)
        ]
        assert alive == [pipeline.max_in_flight(tasks, s) for s in range(3)]
        assert all(len(found[s][(name, 4, 0)]["timeline"]) == 8 for s in range(3))
