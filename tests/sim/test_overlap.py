"""Tests of distopt.sim.overlap: the backward/all-reduce timeline with gradient buckets."""

from __future__ import annotations

import math

import pytest

from distopt.costs import comm
from distopt.sim import overlap

NET = dict(world_size=8, bandwidth=1e9, latency=1e-5)


def _allreduce_s(size):
    return comm.allreduce_time(size, 8, bandwidth=1e9, latency=1e-5)


def test_buckets_fill_from_the_last_layer():
    sizes = [10, 20, 30, 40]
    assert overlap.assign_buckets(sizes, 35) == [[3], [2, 1], [0]]
    assert overlap.assign_buckets(sizes, 1) == [[3], [2], [1], [0]]
    assert overlap.assign_buckets(sizes, math.inf) == [[3, 2, 1, 0]]
    with pytest.raises(ValueError):
        overlap.assign_buckets(sizes, 0)
    with pytest.raises(ValueError):
        overlap.assign_buckets([], 10)


def test_hand_worked_timeline():
    """Two layers of 1 s each; bucket per layer; the last layer's bucket overlaps layer 0."""
    backward_s = [1.0, 1.0]
    grad_bytes = [2e8, 1e8]  # all-reduces of ~0.175 s and ~0.35 s
    timeline = overlap.simulate_backward(backward_s, grad_bytes, bucket_bytes=1, **NET)
    assert [i.label for i in timeline.backward] == ["layer 1", "layer 0"]
    first, second = timeline.allreduce
    assert first.start_s == 1.0 and first.end_s == pytest.approx(1.0 + _allreduce_s(1e8))
    assert second.start_s == 2.0 and second.end_s == pytest.approx(2.0 + _allreduce_s(2e8))
    assert timeline.end_s == pytest.approx(2.0 + _allreduce_s(2e8))


def test_single_process_limit_and_no_overlap_baseline():
    backward_s = [0.3, 0.1, 0.2, 0.4]
    grad_bytes = [4e6, 1e6, 2e6, 3e6]
    # With free communication the step is the backward pass alone, as on one process.
    free = dict(world_size=8, bandwidth=math.inf, latency=0.0)
    timeline = overlap.simulate_backward(backward_s, grad_bytes, bucket_bytes=1, **free)
    assert timeline.end_s == pytest.approx(sum(backward_s), rel=1e-12)
    # Without overlap: backward, then every bucket's all-reduce one after the other.
    for bucket_bytes in (1, 3e6, 5e6, math.inf):
        no_overlap = overlap.simulate_backward(
            backward_s, grad_bytes, bucket_bytes=bucket_bytes, overlap=False, **NET
        )
        buckets = overlap.assign_buckets(grad_bytes, bucket_bytes)
        serial = sum(_allreduce_s(sum(grad_bytes[i] for i in b)) for b in buckets)
        assert no_overlap.end_s == pytest.approx(sum(backward_s) + serial, rel=1e-12)
        with_overlap = overlap.simulate_backward(
            backward_s, grad_bytes, bucket_bytes=bucket_bytes, **NET
        )
        assert max(sum(backward_s), serial) <= with_overlap.end_s + 1e-15
        assert with_overlap.end_s <= no_overlap.end_s + 1e-15
    naive = overlap.naive_backward(backward_s, grad_bytes, **NET)
    assert naive.end_s == pytest.approx(sum(backward_s) + _allreduce_s(sum(grad_bytes)))
    assert len(naive.allreduce) == 1


def test_network_carries_one_allreduce_at_a_time():
    timeline = overlap.simulate_backward(
        [0.001] * 20, [1e7] * 20, bucket_bytes=1, world_size=64, bandwidth=1e9, latency=1e-5
    )
    for earlier, later in zip(timeline.allreduce, timeline.allreduce[1:], strict=False):
        assert later.start_s >= earlier.end_s
    with pytest.raises(ValueError):
        overlap.simulate_backward([1.0], [1.0, 2.0], bucket_bytes=1, **NET)


def test_transformer_tensors_count_gpt2_medium():
    """24 blocks of hidden size 1024: 12h² + 13h parameters a block, 302 million in all."""
    backward_s, grad_bytes = overlap.transformer_tensors(
        1024, 24, tokens_per_gpu=8192, flops_per_s=100e12, per_tensor_s=20e-6
    )
    assert len(grad_bytes) == 6 * 24
    assert grad_bytes.sum() == 4 * 24 * (12 * 1024**2 + 13 * 1024) == 4 * 302_309_376
    # the MLP's first matrix: 4h² + 4h parameters, 4 FLOPs each per token, plus the overhead
    assert math.isclose(backward_s[4], 4 * (4 * 1024**2 + 4096) * 8192 / 100e12 + 20e-6)
    assert grad_bytes[0] == 4 * 2 * 1024  # the first layer norm's gain and bias
