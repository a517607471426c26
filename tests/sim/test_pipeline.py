"""Tests of distopt.sim.pipeline: the simulated schedules against the bubble formulas."""

import math

import pytest

from distopt.costs.bubbles import bubble_fraction
from distopt.sim.pipeline import idle_fraction, max_in_flight, simulate


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 5, 8, 16])
def test_simulated_bubble_matches_formula(schedule, stages, micro_batches):
    tasks = simulate(schedule, stages, micro_batches)
    assert math.isclose(idle_fraction(tasks), bubble_fraction(stages, micro_batches), abs_tol=1e-12)


@pytest.mark.parametrize(
    ("stages", "micro_batches", "interleave"), [(2, 4, 2), (4, 8, 2), (4, 4, 3), (3, 9, 4)]
)
def test_interleaved_bubble_matches_formula(stages, micro_batches, interleave):
    tasks = simulate("interleaved", stages, micro_batches, interleave=interleave)
    expected = bubble_fraction(stages, micro_batches, interleave=interleave)
    assert math.isclose(idle_fraction(tasks), expected, abs_tol=1e-12)


def test_every_task_runs_once_and_respects_dependencies():
    tasks = simulate("1f1b", 4, 6, forward_time=1.0, backward_time=3.0)
    assert len(tasks) == 2 * 4 * 6
    end = {(t.kind, t.micro_batch, t.device): t.end for t in tasks}
    for t in tasks:
        if t.kind == "F" and t.device > 0:
            assert t.start >= end[("F", t.micro_batch, t.device - 1)]
        if t.kind == "B" and t.device < 3:
            assert t.start >= end[("B", t.micro_batch, t.device + 1)]


def test_in_flight_gpipe_vs_1f1b():
    gpipe, one_f_one_b = simulate("gpipe", 4, 8), simulate("1f1b", 4, 8)
    assert [max_in_flight(gpipe, d) for d in range(4)] == [8] * 4
    assert [max_in_flight(one_f_one_b, d) for d in range(4)] == [4, 3, 2, 1]


def test_bad_input():
    with pytest.raises(ValueError, match="schedule"):
        simulate("zigzag", 2, 2)
    with pytest.raises(ValueError, match="divisible"):
        simulate("interleaved", 4, 6, interleave=2)
    with pytest.raises(ValueError, match="micro_batches"):
        bubble_fraction(4, 0)


# The real torch.distributed.pipelining run (pipelining_grad_check) is tested in
# test_model_parallel.py, in the same processes as the DTensor check.
