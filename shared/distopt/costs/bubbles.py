"""The pipeline bubble: how much of a pipelined step each device spends idle.

With ``stages`` = p devices in a pipeline, ``micro_batches`` = m per step and ``interleave``
= v model chunks per device (Narayanan et al. 2021, Megatron-LM, Section 2.2), each device
idles (p - 1) / v stage-times at the start and end of a step while doing m stage-times of
work. :mod:`distopt.sim.pipeline` simulates the schedules and measures the same idle time.

ZB-H1 (Qi et al. 2023, Zero Bubble Pipeline Parallelism) splits each backward into B (the
input's gradient, on the critical path) and W (the weights' gradient, deferred into the idle
end of the step): each device idles (p - 1)(t_F + t_B - t_W) instead of (p - 1)(t_F + t_B + t_W),
a third of 1F1B's when the three task times are equal, with the same peak activation memory.
"""

from __future__ import annotations

__all__ = ["bubble_fraction", "bubble_overhead", "check_shape", "zero_bubble_h1_fraction"]


def check_shape(stages: int, micro_batches: int, interleave: int) -> None:
    """ValueError unless stages, micro_batches and interleave are positive ints."""
    for name, value in (("stages", stages), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(interleave, int) or interleave < 1:
        raise ValueError(f"interleave must be a positive int, got {interleave!r}")


def bubble_overhead(stages: int, micro_batches: int, *, interleave: int = 1) -> float:
    """Idle time over ideal compute time: (p - 1) / (v m), Narayanan et al. 2021, Section 2.2.

    p = ``stages``, m = ``micro_batches``, v = ``interleave`` (model chunks per device).
    """
    check_shape(stages, micro_batches, interleave)
    return (stages - 1) / (interleave * micro_batches)


def bubble_fraction(stages: int, micro_batches: int, *, interleave: int = 1) -> float:
    """Idle fraction of the step's total time: (p - 1) / (v m + p - 1).

    The step lasts ideal + idle time, so fraction = overhead / (1 + overhead).
    """
    check_shape(stages, micro_batches, interleave)
    return (stages - 1) / (interleave * micro_batches + stages - 1)


def zero_bubble_h1_fraction(
    stages: int,
    micro_batches: int,
    *,
    forward_time: float = 1.0,
    input_grad_time: float = 1.0,
    weight_grad_time: float = 1.0,
) -> float:
    """ZB-H1's idle fraction of the step: (p-1)(t_F+t_B-t_W) / (m(t_F+t_B+t_W) + that).

    t_F = ``forward_time``, t_B = ``input_grad_time`` (the backward's input gradient), t_W =
    ``weight_grad_time`` (its weight gradient), per micro-batch and stage (Qi et al. 2023,
    Section 3.1). Exact for the schedule of :func:`distopt.sim.pipeline.simulate` with
    ``"zb-h1"`` when m >= p and t_W <= t_B; ValueError otherwise.
    """
    check_shape(stages, micro_batches, 1)
    if micro_batches < stages:
        raise ValueError(
            f"the closed form needs micro_batches >= stages, got {micro_batches} < {stages}"
        )
    if not 0 <= weight_grad_time <= input_grad_time:
        raise ValueError("the closed form needs 0 <= weight_grad_time <= input_grad_time")
    idle = (stages - 1) * (forward_time + input_grad_time - weight_grad_time)
    return idle / (micro_batches * (forward_time + input_grad_time + weight_grad_time) + idle)
