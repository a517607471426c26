"""Tests of distopt.sim.sequence_parallel: ring attention equals full attention, and the
closed-form counts of memory, FLOPs, causal work and ring traffic."""

import math

import numpy as np
import pytest

from distopt.sim.sequence_parallel import (
    attention,
    attention_activation_bytes,
    causal_attention_work,
    device_chunks,
    layer_forward_flops,
    online_softmax_step,
    ring_attention,
    ring_kv_bytes,
    ring_overlap_tokens_per_device,
    ring_step_flops,
)


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


def test_activation_bytes_naive():
    # one device: q, k, v, o (4 s h) and all heads x s^2 scores, 2 bytes each
    full = attention_activation_bytes(1024, 64, 4, blockwise=False)
    assert full == (4 * 1024 * 64 + 4 * 1024**2) * 2
    # 4 devices: 256 queries each against all 1024 keys, plus the incoming k/v block
    split = attention_activation_bytes(1024, 64, 4, world_size=4, blockwise=False)
    assert split == (6 * 256 * 64 + 4 * 256 * 1024) * 2


def test_activation_bytes_blockwise():
    # one device, 128 x 128 tiles: slices, one tile per head, running max and sum per row
    one = attention_activation_bytes(1024, 64, 4)
    assert one == (4 * 1024 * 64 + 4 * 128 * 128 + 2 * 4 * 1024) * 2
    # 16 devices: 64-token blocks, smaller than the tile
    ring = attention_activation_bytes(1024, 64, 4, world_size=16, tile=128)
    assert ring == (6 * 64 * 64 + 4 * 64 * 64 + 2 * 4 * 64) * 2
    # linear in s on one device: doubling s (tile fixed) doubles everything but the tile
    a, b = (attention_activation_bytes(s, 64, 4, bytes_per_value=1) for s in (2048, 4096))
    assert b - 4 * 128 * 128 == 2 * (a - 4 * 128 * 128)


def test_activation_bytes_rejects_bad_splits():
    with pytest.raises(ValueError, match="split evenly"):
        attention_activation_bytes(10, 4, 1, world_size=3)
    with pytest.raises(ValueError, match="tile"):
        attention_activation_bytes(16, 4, 1, tile=0)


def test_layer_forward_flops_and_crossover():
    f = layer_forward_flops(100, 10, micro_batch=3)
    assert f == {"matmuls": 24 * 3 * 100 * 10 * 10, "attention": 4 * 3 * 100 * 100 * 10}
    # the two parts are equal exactly at s = 6 h
    g = layer_forward_flops(6 * 512, 512)
    assert g["matmuls"] == g["attention"]
    with pytest.raises(ValueError, match="hidden"):
        layer_forward_flops(8, 0)
    # a causal mask halves the attention: the crossover moves to s = 12 h
    c = layer_forward_flops(12 * 512, 512, causal=True)
    assert c["matmuls"] == c["attention"]


def test_device_chunks():
    assert device_chunks(3) == [[0], [1], [2]]
    assert device_chunks(4, "zigzag") == [[0, 7], [1, 6], [2, 5], [3, 4]]
    with pytest.raises(ValueError, match="order"):
        device_chunks(2, "striped")


def _brute_force_work(seq_len, world_size, order):
    chunks = device_chunks(world_size, order)
    length = seq_len // sum(len(c) for c in chunks)
    mask = np.tril(np.ones((seq_len, seq_len), dtype=int))  # mask[q, k] = 1 if k <= q
    return [int(sum(mask[c * length : (c + 1) * length].sum() for c in held)) for held in chunks]


def test_causal_work_hand_worked():
    # N = 2, s = 8: contiguous queries 0-3 see 1+2+3+4 keys, 4-7 see 5+6+7+8
    assert causal_attention_work(8, 2) == [10, 26]
    # zig-zag, chunks of 2: device 0 holds tokens 0,1,6,7, device 1 tokens 2,3,4,5
    assert causal_attention_work(8, 2, "zigzag") == [1 + 2 + 7 + 8, 3 + 4 + 5 + 6]
    # N = 4, s = 8
    assert causal_attention_work(8, 4) == [3, 7, 11, 15]
    assert causal_attention_work(8, 4, "zigzag") == [9, 9, 9, 9]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("order", ["contiguous", "zigzag"])
def test_causal_work_matches_mask(world_size, order):
    s = 2 * world_size * 5
    work = causal_attention_work(s, world_size, order)
    assert work == _brute_force_work(s, world_size, order)
    assert sum(work) == s * (s + 1) // 2
    if order == "zigzag":
        assert len(set(work)) == 1, "zig-zag gives every device the same work"
    else:
        assert work == sorted(work) and (world_size == 1 or work[-1] > work[0])


def test_causal_work_rejects_uneven_chunks():
    with pytest.raises(ValueError, match="split evenly into 4 chunks"):
        causal_attention_work(6, 2, "zigzag")


def test_ring_kv_bytes():
    got = ring_kv_bytes(1024, 64, 4, bytes_per_value=2)
    assert got["per_step"] == 2 * 256 * 64 * 2
    assert got["per_layer"] == 3 * got["per_step"] == 3 / 4 * 2 * 1024 * 64 * 2
    assert ring_kv_bytes(512, 8, 1)["per_layer"] == 0
    # grouped-query attention: 8 key/value heads of 32 send a quarter
    gqa = ring_kv_bytes(1024, 64, 4, bytes_per_value=2, heads=32, kv_heads=8)
    assert gqa["per_layer"] == got["per_layer"] / 4
    with pytest.raises(ValueError, match="kv_heads"):
        ring_kv_bytes(1024, 64, 4, heads=32, kv_heads=5)


def test_ulysses_bytes():
    from distopt.sim.sequence_parallel import ulysses_bytes

    # 4 all-to-alls (Q, K, V, output), each sending (N - 1)/N of a device's s/N x h block
    assert ulysses_bytes(1024, 64, 4) == 4 * (3 / 4) * 256 * 64 * 2
    assert ulysses_bytes(1024, 64, 1) == 0
    # GQA narrows K and V only: (2 h + 2 h / 4) instead of 4 h
    got = ulysses_bytes(1024, 64, 4, heads=32, kv_heads=8)
    assert got == (3 / 16) * 1024 * (2 * 64 + 2 * 16) * 2
    # falls as 1/N, where the ring's stays near 2 s h
    assert ulysses_bytes(4096, 64, 16) < ulysses_bytes(4096, 64, 4) / 3
    with pytest.raises(ValueError, match="divide heads"):
        ulysses_bytes(1024, 64, 4, heads=32, kv_heads=2)


def test_ring_step_flops():
    assert ring_step_flops(1024, 64, 4) == 4 * 256**2 * 64
    # summed over N steps and N devices: the full non-causal attention, 4 s^2 h
    s, h, n = 4096, 32, 8
    assert n * n * ring_step_flops(s, h, n) == layer_forward_flops(s, h)["attention"]


def test_overlap_threshold_balances_compute_and_transfer():
    flops, beta = 400e12, 50e9
    threshold = ring_overlap_tokens_per_device(flops, beta)
    assert threshold == 8000
    assert ring_overlap_tokens_per_device(flops, beta, bytes_per_value=4) == 16000
    # at s/N = threshold the step's compute time equals its transfer time, for any h
    n = 4
    for h in (64, 4096):
        compute = ring_step_flops(int(threshold) * n, h, n) / flops
        transfer = ring_kv_bytes(int(threshold) * n, h, n)["per_step"] / beta
        assert math.isclose(compute, transfer)
        longer = 2 * int(threshold) * n
        assert (
            ring_step_flops(longer, h, n) / flops > ring_kv_bytes(longer, h, n)["per_step"] / beta
        )
    with pytest.raises(ValueError, match="bandwidth"):
        ring_overlap_tokens_per_device(1e12, 0)


def test_online_softmax_step_keeps_the_running_max_and_sum():
    rng = np.random.default_rng(8)
    scores = 30 * rng.standard_normal((3, 4, 5))  # 3 blocks of (4 rows x 5 keys), large
    values = rng.standard_normal((3, 5, 2))
    state = (np.full((4, 1), -np.inf), np.zeros((4, 1)), np.zeros((4, 2)))
    for step in range(3):
        state = online_softmax_step(*state, scores[step], values[step])
        seen = np.concatenate(scores[: step + 1], axis=1)
        expected_max = seen.max(axis=1, keepdims=True)
        weights = np.exp(seen - expected_max)
        assert np.array_equal(state[0], expected_max)
        np.testing.assert_allclose(state[1], weights.sum(axis=1, keepdims=True), rtol=1e-12)
        np.testing.assert_allclose(
            state[2], weights @ np.concatenate(values[: step + 1]), rtol=1e-12, atol=1e-300
        )
