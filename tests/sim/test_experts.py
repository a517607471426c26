"""Tests of distopt.sim.experts: routing, all-to-all counts and capacity, against brute force."""

import numpy as np
import pytest

from distopt.sim.experts import (
    dispatch_counts,
    dropped_copies,
    expert_capacity,
    load_balancing_loss,
    router_logits,
    top_k_experts,
)


def test_top_k_picks_the_largest():
    logits = router_logits(50, 8, seed=1)
    chosen = top_k_experts(logits, 2)
    for row, experts in zip(logits, chosen, strict=True):
        assert set(experts) == set(np.argsort(row)[-2:])


def test_dispatch_counts_brute_force():
    experts = top_k_experts(router_logits(64, 8, skew=3.0, seed=2), 2)
    token_device = np.arange(64) % 4
    counts = dispatch_counts(experts, token_device, 8, 4)
    brute = np.zeros((4, 4), dtype=int)
    for token, chosen in enumerate(experts):
        for e in chosen:
            brute[token_device[token], e // 2] += 1
    assert (counts == brute).all()
    assert counts.sum() == 128


def test_capacity_and_drops():
    assert expert_capacity(100, 8, 2, 1.25) == 32
    assert 1.1 * 200 * 3 / 4 > 165  # floating point: 165.00000000000003
    assert expert_capacity(200, 4, 3, 1.1) == 165  # rounded before the ceiling, not 166
    experts = np.array([[0], [0], [0], [1]])
    # capacity ceil(1.0 * 4 / 2) = 2: one of expert 0's three tokens is dropped.
    assert dropped_copies(experts, 2, 1.0) == 1
    assert dropped_copies(experts, 2, 2.0) == 0


def test_skew_makes_load_uneven():
    even = np.bincount(top_k_experts(router_logits(4096, 8, seed=3), 1).ravel(), minlength=8)
    skewed = np.bincount(
        top_k_experts(router_logits(4096, 8, skew=4.0, seed=3), 1).ravel(), minlength=8
    )
    assert skewed.max() / skewed.mean() > even.max() / even.mean() + 0.5


def test_load_balancing_loss_is_one_when_even_and_grows_with_skew():
    # uniform probabilities: E * sum_i f_i / E = 1 whatever the routing
    assert (
        abs(load_balancing_loss(np.zeros((3, 4)), np.array([[0, 1], [0, 2], [0, 3]]), 4) - 1)
        < 1e-12
    )
    # all to expert 0 at probability 3/4: 2 * (1 * 3/4) ; shifting a row's scores changes nothing
    logits = np.log([[3.0, 1.0], [3.0, 1.0]])
    assert abs(load_balancing_loss(logits, np.array([[0], [0]]), 2) - 1.5) < 1e-12
    assert abs(load_balancing_loss(logits + 900.0, np.array([[0], [0]]), 2) - 1.5) < 1e-12
    losses = []
    for skew in (0.0, 2.0, 4.0):
        scores = router_logits(2048, 8, skew=skew, seed=4)
        losses.append(load_balancing_loss(scores, top_k_experts(scores, 2), 8))
    assert abs(losses[0] - 1) < 0.01 and losses[0] < losses[1] < losses[2]


def test_bad_input():
    with pytest.raises(ValueError, match="k must"):
        top_k_experts(np.zeros((2, 4)), 5)
    with pytest.raises(ValueError, match="divisible"):
        dispatch_counts(np.zeros((2, 1), dtype=int), np.zeros(2, dtype=int), 6, 4)
