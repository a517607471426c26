"""Tests of distopt.costs.critical_batch: the McCandlish et al. model, its fit, B_simple."""

from __future__ import annotations

import numpy as np
import pytest

from distopt.costs import critical_batch


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
