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


def test_zero_bubble_h1_matches_its_closed_form():
    from distopt.costs.bubbles import zero_bubble_h1_fraction

    for p, m in [(2, 3), (4, 4), (4, 8), (3, 7), (8, 16)]:
        for f, b, w in [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 1.0), (1.0, 1.0, 0.0)]:
            tasks = simulate("zb-h1", p, m, forward_time=f, backward_time=b + w, weight_time=w)
            expected = zero_bubble_h1_fraction(
                p, m, forward_time=f, input_grad_time=b, weight_grad_time=w
            )
            assert abs(idle_fraction(tasks) - expected) < 1e-12, (p, m, f, b, w)
    # a third of 1F1B's idle time when F = B = W; the same peak activations as 1F1B's
    zb, plain = simulate("zb-h1", 4, 8), simulate("1f1b", 4, 8)
    idle = [idle_fraction(t) / (1 - idle_fraction(t)) for t in (zb, plain)]
    assert abs(idle[0] / idle[1] - 1 / 3) < 1e-12
    assert max(max_in_flight(zb, d) for d in range(4)) == max_in_flight(plain, 0) == 4
    with pytest.raises(ValueError, match="weight_time"):
        simulate("1f1b", 4, 8, weight_time=1.0)
    with pytest.raises(ValueError, match="micro_batches >= stages"):
        zero_bubble_h1_fraction(4, 2)


def test_zero_bubble_h1_runs_every_task_after_its_inputs():
    tasks = simulate("zb-h1", 4, 6)
    end = {(t.kind, t.micro_batch, t.device): t.end for t in tasks}
    assert sorted(end) == sorted((k, mb, d) for k in "FBW" for mb in range(6) for d in range(4))
    for t in tasks:
        if t.kind == "W":
            assert t.start >= end[("B", t.micro_batch, t.device)]
        if t.kind == "B" and t.device < 3:
            assert t.start >= end[("B", t.micro_batch, t.device + 1)]
