"""Tests of distopt.data: the toy logistic-regression problem and its gradients."""

from __future__ import annotations

import numpy as np
import pytest

from distopt import data


@pytest.fixture(scope="module")
def problem():
    return data.make_logistic_data(256, 5, seed=3)


def test_data_is_seeded_and_shaped(problem):
    features, labels = problem
    assert features.shape == (256, 5) and labels.shape == (256,)
    assert set(np.unique(labels)) == {0.0, 1.0}
    again = data.make_logistic_data(256, 5, seed=3)
    np.testing.assert_array_equal(features, again[0])
    np.testing.assert_array_equal(labels, again[1])
    assert not np.array_equal(features, data.make_logistic_data(256, 5, seed=4)[0])


def test_gradient_matches_finite_differences(problem):
    features, labels = problem
    w = np.random.default_rng(0).standard_normal(5)
    grad = data.logistic_grad(w, features, labels)
    eps = 1e-6
    for i in range(5):
        step = np.zeros(5)
        step[i] = eps
        numeric = (
            data.logistic_loss(w + step, features, labels)
            - data.logistic_loss(w - step, features, labels)
        ) / (2 * eps)
        assert grad[i] == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_per_example_gradients_average_to_the_gradient(problem):
    features, labels = problem
    w = np.linspace(-1, 1, 5)
    per_example = data.logistic_per_example_grads(w, features, labels)
    assert per_example.shape == (256, 5)
    np.testing.assert_allclose(
        per_example.mean(axis=0), data.logistic_grad(w, features, labels), rtol=1e-12
    )


def test_loss_of_several_weight_vectors_at_once(problem):
    features, labels = problem
    ws = np.random.default_rng(1).standard_normal((3, 5))
    together = data.logistic_loss(ws, features, labels)
    one_by_one = [data.logistic_loss(w, features, labels) for w in ws]
    np.testing.assert_allclose(together, one_by_one, rtol=1e-12)
    assert isinstance(data.logistic_loss(ws[0], features, labels), float)


def test_minimum_has_zero_gradient_and_sigmoid_never_overflows(problem):
    features, labels = problem
    w_star = data.logistic_minimum(features, labels)
    assert np.abs(data.logistic_grad(w_star, features, labels)).max() < 1e-10
    with np.errstate(all="raise"):
        np.testing.assert_allclose(data.sigmoid(np.array([-1e4, 0.0, 1e4])), [0, 0.5, 1])
