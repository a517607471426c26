"""Checks for rank code a student writes: run it for real, compare, say what differed.

The test cells of sections 01 and 02 run the student's function on ``problem.world_size``
ranks with ``distopt.launch``, record what each rank sent (``distopt.dist.record``), and
compare the weights with the single-process baseline of :class:`ShardedProblem`. Every
failure says what was compared, the numbers, and a hint; nothing here solves an exercise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distopt.dist.launcher import launch
from distopt.dist.record import Recording, traced
from distopt.problems.shards import ShardedProblem, max_abs_diff, param_bytes

__all__ = ["param_bytes_of", "run_traced", "weights_of", "assert_weights_match"]


def run_traced(
    fn: Callable[..., Any], problem: ShardedProblem, *args: Any, timeout: float = 60
) -> list[tuple[Any, Recording]]:
    """``fn(rank, world_size, problem, *args)`` on the problem's ranks: (value, recording) each."""
    return launch(traced(fn), problem.world_size, problem, *args, timeout=timeout)


def weights_of(value: Any) -> list:
    """The parameter list a rank returned (alone, or first of a tuple)."""
    return list(value[0] if isinstance(value, tuple) else value)


def assert_weights_match(
    results: list[tuple[Any, Recording]],
    reference: list,
    *,
    what: str,
    tolerance: float = 1e-10,
    hint: str = "",
) -> None:
    """Every rank's returned weights equal ``reference`` within ``tolerance``."""
    for rank, (value, _) in enumerate(results):
        diff = max_abs_diff(weights_of(value), reference)
        assert diff <= tolerance, (
            f"rank {rank} of {len(results)}: its weights differ from {what} by {diff:.2e} "
            f"(tolerance {tolerance:g}). {hint}"
        )


def param_bytes_of(problem: ShardedProblem) -> int:
    """Bytes of all the model's parameters (float64)."""
    return sum(param_bytes(problem.new_model(0)))
