"""Tests of distopt.sim.tensor_parallel: simulated tensor parallelism vs one device."""

import numpy as np
import pytest

from distopt.sim.tensor_parallel import (
    column_parallel_linear,
    megatron_mlp,
    mlp,
    row_parallel_linear,
)

TOL = 1e-12


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_parallel_layers_match_single_device(world_size):
    rng = np.random.default_rng(world_size)
    x = rng.standard_normal((5, 16))
    w = rng.standard_normal((16, 32))
    assert np.abs(column_parallel_linear(x, w, world_size) - x @ w).max() < TOL
    assert np.abs(row_parallel_linear(x, w, world_size) - x @ w).max() < TOL
    w_out = rng.standard_normal((32, 16))
    assert np.abs(megatron_mlp(x, w, w_out, world_size) - mlp(x, w, w_out)).max() < TOL


def test_uneven_split_raises():
    with pytest.raises(ValueError, match="divisible"):
        column_parallel_linear(np.ones((2, 4)), np.ones((4, 6)), 4)


# The real DTensor run (dtensor_mlp_check) is tested in test_model_parallel.py, in the same
# processes as the pipelining check: each launch costs seconds.
