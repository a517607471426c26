"""The pipeline bubble: how much of a pipelined step each device spends idle.

With ``stages`` = p devices in a pipeline, ``micro_batches`` = m per step and ``interleave``
= v model chunks per device (Narayanan et al. 2021, Megatron-LM, Section 2.2), each device
idles (p - 1) / v stage-times at the start and end of a step while doing m stage-times of
work. :mod:`distopt.sim.pipeline` simulates the schedules and measures the same idle time.
"""

from __future__ import annotations

__all__ = ["bubble_fraction", "bubble_overhead", "check_shape"]


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
