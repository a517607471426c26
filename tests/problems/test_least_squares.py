"""Tests of distopt.problems.least_squares: the toy problem's loss, gradient, optimum and shards."""

import numpy as np
import pytest

from distopt.problems.least_squares import LeastSquares, make_least_squares


def test_gradient_matches_finite_differences_and_vanishes_at_the_minimum():
    problem = make_least_squares(200, 5, seed=3)
    w = np.random.default_rng(0).standard_normal(5)
    eps = 1e-6
    numeric = [
        (problem.loss(w + eps * e) - problem.loss(w - eps * e)) / (2 * eps) for e in np.eye(5)
    ]
    assert np.allclose(problem.grad(w), numeric, atol=1e-6)
    assert np.abs(problem.grad(problem.minimum())).max() < 1e-10


def test_batched_loss_and_shards_cover_the_data():
    problem = make_least_squares(64, 3, seed=1)
    ws = np.random.default_rng(2).standard_normal((4, 3))
    assert np.allclose(problem.loss(ws), [problem.loss(w) for w in ws])
    shards = problem.shards(4)
    assert all(isinstance(s, LeastSquares) and len(s.targets) == 16 for s in shards)
    # The mean of the shards' losses is the full loss (equal shard sizes).
    assert np.isclose(np.mean([s.loss(ws[0]) for s in shards]), problem.loss(ws[0]))
    with pytest.raises(ValueError, match="do not split"):
        problem.shards(5)


def test_seeded_and_validated():
    a, b = make_least_squares(seed=7), make_least_squares(seed=7)
    assert np.array_equal(a.features, b.features) and np.array_equal(a.targets, b.targets)
    with pytest.raises(ValueError):
        make_least_squares(condition=0.5)
