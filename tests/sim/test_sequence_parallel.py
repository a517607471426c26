"""Tests of distopt.sim.sequence_parallel: ring attention equals full attention."""

import numpy as np
import pytest

from distopt.sim.sequence_parallel import attention, attention_activation_bytes, ring_attention


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_ring_attention_matches_full_attention(world_size):
    rng = np.random.default_rng(world_size)
    # Large scores (scale 5): the running maximum must keep exp() from overflowing.
    q, k, v = (5 * rng.standard_normal((32, 8)) for _ in range(3))
    assert np.abs(ring_attention(q, k, v, world_size) - attention(q, k, v)).max() < 1e-12


def test_attention_rows_are_convex_combinations():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 6, 4))
    v = np.ones((6, 4))
    assert np.allclose(attention(q, k, v), 1.0)


def test_activation_bytes():
    full = attention_activation_bytes(1024, 64, 4, blockwise=False)
    assert full == (4 * 1024 * 64 + 4 * 1024**2) * 2
    split = attention_activation_bytes(1024, 64, 4, world_size=4)
    assert split == (4 * 256 * 64 + 4 * 256**2) * 2
    with pytest.raises(ValueError, match="split evenly"):
        attention_activation_bytes(10, 4, 1, world_size=3)
