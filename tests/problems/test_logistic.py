"""Tests of distopt.problems.logistic: the toy problem, its gradients and its minimum."""

from __future__ import annotations

import numpy as np
import pytest

from distopt.problems import logistic


@pytest.fixture(scope="module")
def problem():
    return logistic.make_logistic_data(256, 5, seed=3)


def test_data_is_seeded_and_shaped(problem):
    features, labels = problem
    assert features.shape == (256, 5) and labels.shape == (256,)
    assert set(np.unique(labels)) == {0.0, 1.0}
    again = logistic.make_logistic_data(256, 5, seed=3)
    np.testing.assert_array_equal(features, again[0])
    np.testing.assert_array_equal(labels, again[1])
    assert not np.array_equal(features, logistic.make_logistic_data(256, 5, seed=4)[0])


def test_gradient_matches_finite_differences(problem):
    features, labels = problem
    w = np.random.default_rng(0).standard_normal(5)
    grad = logistic.logistic_grad(w, features, labels)
    eps = 1e-6
    for i in range(5):
        step = np.zeros(5)
        step[i] = eps
        numeric = (
            logistic.logistic_loss(w + step, features, labels)
            - logistic.logistic_loss(w - step, features, labels)
        ) / (2 * eps)
        assert grad[i] == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_per_example_gradients_average_to_the_gradient(problem):
    features, labels = problem
    w = np.linspace(-1, 1, 5)
    per_example = logistic.logistic_per_example_grads(w, features, labels)
    assert per_example.shape == (256, 5)
    np.testing.assert_allclose(
        per_example.mean(axis=0), logistic.logistic_grad(w, features, labels), rtol=1e-12
    )


def test_loss_of_several_weight_vectors_at_once(problem):
    features, labels = problem
    ws = np.random.default_rng(1).standard_normal((3, 5))
    together = logistic.logistic_loss(ws, features, labels)
    one_by_one = [logistic.logistic_loss(w, features, labels) for w in ws]
    np.testing.assert_allclose(together, one_by_one, rtol=1e-12)
    assert isinstance(logistic.logistic_loss(ws[0], features, labels), float)


def test_minimum_has_zero_gradient_and_sigmoid_never_overflows(problem):
    features, labels = problem
    w_star = logistic.logistic_minimum(features, labels)
    assert np.abs(logistic.logistic_grad(w_star, features, labels)).max() < 1e-10
    with np.errstate(all="raise"):
        np.testing.assert_allclose(logistic.sigmoid(np.array([-1e4, 0.0, 1e4])), [0, 0.5, 1])


def test_the_minimum_is_refused_for_separable_data():
    features = np.array([[1.0, 0.0], [2.0, 1.0], [-1.0, 0.5], [-2.0, -1.0]])
    labels = (features[:, 0] > 0).astype(float)
    with pytest.raises(RuntimeError, match="separable"):
        logistic.logistic_minimum(features, labels)
