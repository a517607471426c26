"""Tests of distopt.sim.collectives: simulated ring and parameter-server all-reduce on numpy arrays.

Every simulated collective is checked against the single-process result (np.sum over the
workers' arrays): exactly for integers, to 1e-12 relative for floats, whose sums the ring
adds in another order.
"""

from __future__ import annotations

import numpy as np
import pytest

from distopt.costs import comm
from distopt.sim import collectives
from distopt.sim.collectives import SimulatedNetwork

FLOAT_RTOL = 1e-12


def _worker_arrays(world_size: int, shape, *, integer: bool, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if integer:
        return [rng.integers(-1000, 1000, size=shape) for _ in range(world_size)]
    return [rng.standard_normal(shape) for _ in range(world_size)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 8])
@pytest.mark.parametrize("shape", [(24,), (5, 7), (3,)])
def test_ring_all_reduce_equals_the_sum(world_size, shape):
    for integer in (True, False):
        arrays = _worker_arrays(world_size, shape, integer=integer)
        before = [a.copy() for a in arrays]
        results = collectives.ring_all_reduce(arrays, SimulatedNetwork(world_size))
        expected = np.sum(arrays, axis=0)
        assert len(results) == world_size
        for result in results:
            assert result.shape == expected.shape
            if integer:
                np.testing.assert_array_equal(result, expected)
            else:
                np.testing.assert_allclose(result, expected, rtol=FLOAT_RTOL, atol=1e-12)
        for a, b in zip(arrays, before, strict=True):
            np.testing.assert_array_equal(a, b)  # inputs untouched


@pytest.mark.parametrize("world_size", [2, 3, 4, 8, 16])
def test_ring_bytes_per_worker_match_the_formula(world_size):
    arrays = [np.ones(48 * world_size) for _ in range(world_size)]
    network = SimulatedNetwork(world_size)
    collectives.ring_all_reduce(arrays, network)
    message_bytes = arrays[0].nbytes
    expected = comm.ring_allreduce_bytes_sent(message_bytes, world_size)
    assert network.bytes_sent == [expected] * world_size
    assert network.bytes_received == [expected] * world_size
    assert network.messages_sent == [2 * (world_size - 1)] * world_size
    # A ring: every message goes to the right neighbour.
    assert all(dst == (src + 1) % world_size for src, dst, _ in network.log)


def test_uneven_chunks_still_send_twice_the_buffer_in_total():
    world_size, length = 5, 13  # chunks of 3, 3, 3, 2, 2 elements
    network = SimulatedNetwork(world_size)
    collectives.ring_all_reduce([np.arange(length)] * world_size, network)
    total = sum(network.bytes_sent)
    assert total == 2 * (world_size - 1) * np.arange(length).nbytes


def test_reduce_scatter_gives_worker_r_chunk_r_and_all_gather_joins_them():
    world_size = 4
    arrays = _worker_arrays(world_size, (10,), integer=True, seed=1)
    network = SimulatedNetwork(world_size)
    owned = collectives.ring_reduce_scatter(arrays, network)
    expected_chunks = np.array_split(np.sum(arrays, axis=0), world_size)
    for got, expected in zip(owned, expected_chunks, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert sum(network.bytes_sent) == (world_size - 1) * arrays[0].nbytes
    gathered = collectives.ring_all_gather(owned, network)
    for full in gathered:
        np.testing.assert_array_equal(full, np.sum(arrays, axis=0))


@pytest.mark.parametrize("world_size", [2, 5, 8])
def test_parameter_server_sums_and_loads_the_server(world_size):
    arrays = _worker_arrays(world_size, (6,), integer=True, seed=2)
    network = SimulatedNetwork(world_size)
    results = collectives.parameter_server_all_reduce(arrays, network)
    for result in results:
        np.testing.assert_array_equal(result, np.sum(arrays, axis=0))
    m = arrays[0].nbytes
    assert network.bytes_sent == [(world_size - 1) * m] + [m] * (world_size - 1)
    assert network.bytes_received == [(world_size - 1) * m] + [m] * (world_size - 1)


def test_network_copies_messages_and_refuses_nonsense():
    network = SimulatedNetwork(3)
    original = np.zeros(4)
    received = network.send(0, 1, original)
    received += 1
    assert original.sum() == 0, "a message is a copy"
    assert network.bytes_sent == [32, 0, 0] and network.bytes_received == [0, 32, 0]
    assert network.log == [(0, 1, 32)]
    np.testing.assert_array_equal(network.payloads[0], original)  # kept apart from received
    network.reset()
    assert network.bytes_sent == [0, 0, 0] and network.log == [] and network.payloads == []
    with pytest.raises(ValueError):
        network.send(1, 1, original)
    with pytest.raises(ValueError):
        network.send(0, 3, original)
    with pytest.raises(ValueError):
        SimulatedNetwork(0)
    with pytest.raises(ValueError):
        collectives.ring_all_reduce([np.zeros(2)] * 2, SimulatedNetwork(3))


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_ring_messages_carry_the_partial_sums(world_size):
    """Worker r's reduce-scatter message of step s is chunk (r-s-1) summed over workers
    r-s..r; its all-gather message of step s is the fully summed chunk (r-s)."""
    arrays = _worker_arrays(world_size, (11,), integer=True, seed=3)
    network = SimulatedNetwork(world_size)
    collectives.ring_all_reduce(arrays, network)
    n = world_size
    chunks = [np.array_split(a, n) for a in arrays]
    expected = {r: [] for r in range(n)}
    for step in range(n - 1):
        for r in range(n):
            c = (r - step - 1) % n
            expected[r].append(sum(chunks[(r - k) % n][c] for k in range(step + 1)))
    for step in range(n - 1):
        for r in range(n):
            expected[r].append(sum(chunks[w][(r - step) % n] for w in range(n)))
    sent = {r: [] for r in range(n)}
    for (src, _, _), payload in zip(network.log, network.payloads, strict=True):
        sent[src].append(payload)
    for r in range(n):
        assert len(sent[r]) == len(expected[r])
        for got, want in zip(sent[r], expected[r], strict=True):
            np.testing.assert_array_equal(got, want)
