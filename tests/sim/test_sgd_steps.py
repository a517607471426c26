"""Tests of distopt.sim.sgd_steps: vectorised SGD runs, and fewer steps at larger batches."""

from __future__ import annotations

import numpy as np
import pytest

from distopt.problems import logistic
from distopt.sim import sgd_steps


def _one_run_at_a_time(features, labels, *, batch_size, lr, target, seed, max_steps=2000):
    """The single-run baseline: a plain loop, drawing batches as the vectorised code does."""
    rng = np.random.default_rng([seed, batch_size])
    w = np.zeros(features.shape[1])
    for step in range(1, max_steps + 1):
        batch = rng.integers(len(labels), size=(1, batch_size))[0]
        w = w - lr * logistic.logistic_grad(w, features[batch], labels[batch])
        if logistic.logistic_loss(w, features, labels) <= target:
            return step
    return None


@pytest.fixture(scope="module")
def small_problem():
    features, labels = logistic.make_logistic_data(256, 4, seed=1)
    w_star = logistic.logistic_minimum(features, labels)
    start = logistic.logistic_loss(np.zeros(4), features, labels)
    best = logistic.logistic_loss(w_star, features, labels)
    return features, labels, best + 0.1 * (start - best)


@pytest.mark.parametrize("batch_size", [1, 8, 64])
def test_vectorised_sgd_matches_one_run_at_a_time(small_problem, batch_size):
    features, labels, target = small_problem
    steps, lr = sgd_steps.sgd_steps_to_loss(
        features,
        labels,
        batch_size=batch_size,
        learning_rates=[0.5],
        target_loss=target,
        num_seeds=1,
        seed=5,
    )
    assert lr == 0.5
    assert steps == _one_run_at_a_time(
        features, labels, batch_size=batch_size, lr=0.5, target=target, seed=5
    )


def test_larger_batches_need_fewer_steps_but_not_below_the_minimum(small_problem):
    features, labels, target = small_problem
    rates = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
    steps = [
        sgd_steps.sgd_steps_to_loss(
            features, labels, batch_size=b, learning_rates=rates, target_loss=target
        )[0]
        for b in (1, 16, 256)
    ]
    assert steps[0] > steps[1] >= steps[2] >= 1
    with pytest.raises(ValueError, match="odd"):
        sgd_steps.sgd_steps_to_loss(
            features, labels, batch_size=4, learning_rates=rates, target_loss=target, num_seeds=2
        )
    with pytest.raises(RuntimeError):
        sgd_steps.sgd_steps_to_loss(
            features,
            labels,
            batch_size=4,
            learning_rates=[1e-6],
            target_loss=target,
            max_steps=5,
        )
