"""Real-engine checks of tensor and pipeline parallelism in one launch (a launch worker).

Starting a group of CPU processes costs a second or more per rank, so the notebook of section
03 runs both checks in the same processes: ``launch(engine_checks, 2)`` and
``launch(engine_checks, 4)`` instead of four separate launches.
"""

from __future__ import annotations

from distopt.pipeline import pipelining_grad_check
from distopt.tensor_parallel import dtensor_mlp_check

__all__ = ["engine_checks"]


def engine_checks(rank: int, world_size: int, seed: int = 0) -> dict:
    """Worker for ``distopt.launch``: ``dtensor_mlp_check`` then ``pipelining_grad_check``.

    Returns ``{"tensor": <dtensor_mlp_check result>, "pipeline": <pipelining_grad_check
    result>}`` for this rank; both compare with a single-process float64 reference.
    """
    return {
        "tensor": dtensor_mlp_check(rank, world_size, seed=seed),
        "pipeline": pipelining_grad_check(rank, world_size, seed=seed),
    }
