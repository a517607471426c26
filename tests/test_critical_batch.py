"""Tests of distopt.critical_batch: the McCandlish et al. model, B_simple, and measured steps."""

from __future__ import annotations

import numpy as np
import pytest

from distopt import critical_batch, data


def test_models_at_the_critical_batch_cost_twice_the_minimum():
    assert critical_batch.steps_model(50, min_steps=10, critical_batch=50) == 20
    assert critical_batch.examples_model(50, min_examples=500, critical_batch=50) == 1000
    sizes = np.array([1.0, 10, 100, 1000])
    steps = critical_batch.steps_model(sizes, min_steps=7, critical_batch=30)
    examples = sizes * steps
    # E = B S is the examples model with E_min = S_min B_crit.
    np.testing.assert_allclose(
        examples,
        critical_batch.examples_model(sizes, min_examples=7 * 30, critical_batch=30),
        rtol=1e-12,
    )


def test_simple_noise_scale_matches_numpy_covariance():
    grads = np.random.default_rng(0).standard_normal((50, 4)) + np.array([1.0, 0, 0, 2])
    mean = grads.mean(axis=0)
    expected = np.trace(np.cov(grads.T)) / (mean @ mean)
    assert critical_batch.simple_noise_scale(grads) == pytest.approx(expected, rel=1e-12)
    assert critical_batch.simple_noise_scale([[1.0, 0.0], [3.0, 0.0]]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        critical_batch.simple_noise_scale(np.ones((1, 3)))


def test_fit_steps_model_recovers_its_parameters():
    sizes = 2.0 ** np.arange(1, 12)
    steps = critical_batch.steps_model(sizes, min_steps=12.5, critical_batch=40)
    min_steps, crit = critical_batch.fit_steps_model(sizes, steps)
    assert min_steps == pytest.approx(12.5, rel=1e-9)
    assert crit == pytest.approx(40, rel=1e-9)


@pytest.fixture(scope="module")
def small_problem():
    features, labels = data.make_logistic_data(256, 4, seed=1)
    w_star = data.logistic_minimum(features, labels)
    start = data.logistic_loss(np.zeros(4), features, labels)
    best = data.logistic_loss(w_star, features, labels)
    return features, labels, best + 0.1 * (start - best)


def _one_run_at_a_time(features, labels, *, batch_size, lr, target, seed, max_steps=2000):
    """The single-run baseline: a plain loop, drawing batches as the vectorised code does."""
    rng = np.random.default_rng([seed, batch_size])
    w = np.zeros(features.shape[1])
    for step in range(1, max_steps + 1):
        batch = rng.integers(len(labels), size=(1, batch_size))[0]
        w = w - lr * data.logistic_grad(w, features[batch], labels[batch])
        if data.logistic_loss(w, features, labels) <= target:
            return step
    return None


@pytest.mark.parametrize("batch_size", [1, 8, 64])
def test_vectorised_sgd_matches_one_run_at_a_time(small_problem, batch_size):
    features, labels, target = small_problem
    steps, lr = critical_batch.sgd_steps_to_loss(
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
        critical_batch.sgd_steps_to_loss(
            features, labels, batch_size=b, learning_rates=rates, target_loss=target
        )[0]
        for b in (1, 16, 256)
    ]
    assert steps[0] > steps[1] >= steps[2] >= 1
    with pytest.raises(ValueError, match="odd"):
        critical_batch.sgd_steps_to_loss(
            features, labels, batch_size=4, learning_rates=rates, target_loss=target, num_seeds=2
        )
    with pytest.raises(RuntimeError):
        critical_batch.sgd_steps_to_loss(
            features,
            labels,
            batch_size=4,
            learning_rates=[1e-6],
            target_loss=target,
            max_steps=5,
        )
