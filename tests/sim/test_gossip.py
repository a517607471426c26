"""Tests of distopt.sim.gossip: graphs, Metropolis weights, consensus, decentralized SGD."""

import numpy as np
import pytest

from distopt.problems.least_squares import make_least_squares
from distopt.sim import gossip

GRAPHS = {
    "ring": gossip.ring(8),
    "torus": gossip.torus(3, 4),
    "complete": gossip.complete(8),
    "exponential": gossip.exponential(16),
}


@pytest.mark.parametrize("name", GRAPHS)
def test_metropolis_weights_are_a_symmetric_doubly_stochastic_mixing_matrix(name):
    adjacency = GRAPHS[name]
    weights = gossip.metropolis_weights(adjacency)
    assert np.allclose(weights, weights.T) and np.allclose(weights.sum(axis=1), 1)
    assert np.all(weights >= 0) and np.all(
        weights[(adjacency == 0) & ~np.eye(len(weights), dtype=bool)] == 0
    )
    # The consensus distance shrinks at least as fast as the bound says.
    x0 = np.random.default_rng(0).standard_normal((len(weights), 3))
    distances = gossip.consensus_distances(weights, x0, 30)
    bound = gossip.mixing_rate(weights) ** np.arange(31) * distances[0]
    assert np.all(distances <= bound + 1e-12)


def test_known_spectra_and_degrees():
    assert gossip.ring(8).sum(axis=1).tolist() == [2] * 8
    assert gossip.torus(3, 4).sum(axis=1).tolist() == [4] * 12
    assert gossip.exponential(16).sum(axis=1).tolist() == [7] * 16  # +-1, +-2, +-4, 8
    # Ring with weights 1/3: eigenvalues 1/3 + 2/3 cos(2 pi k / n).
    rate = gossip.mixing_rate(gossip.metropolis_weights(gossip.ring(8)))
    assert np.isclose(rate, 1 / 3 + 2 / 3 * np.cos(2 * np.pi / 8))
    assert np.isclose(gossip.mixing_rate(gossip.metropolis_weights(gossip.complete(8))), 0)
    with pytest.raises(ValueError, match="symmetric"):
        gossip.metropolis_weights(np.triu(np.ones((3, 3)), 1))


def test_decentralized_sgd_with_complete_averaging_is_minibatch_sgd():
    problem = make_least_squares(256, 4, seed=1)
    shards = problem.shards(4)
    uniform = np.full((4, 4), 0.25)
    losses, node_losses, distances = gossip.decentralized_sgd(
        shards, uniform, num_steps=30, lr=0.1, seed=2
    )
    # Baseline: one model, the average of the 4 shards' minibatch gradients per step.
    rng = np.random.default_rng(2)
    w = np.zeros(4)
    for _ in range(30):
        rows = rng.integers(0, 64, (4, 8))
        w = w - 0.1 * np.mean([s.grad(w, rows[i]) for i, s in enumerate(shards)], axis=0)
    best = problem.loss(problem.minimum())
    assert abs(losses[-1] - (problem.loss(w) - best)) < 1e-12
    assert np.all(distances < 1e-12) and np.allclose(node_losses, losses, atol=1e-12)
    ring_losses, ring_node_losses, ring_distances = gossip.decentralized_sgd(
        shards, gossip.metropolis_weights(gossip.ring(4)), num_steps=300, lr=0.1
    )
    assert ring_losses[-1] < 0.05 * ring_losses[0] and ring_distances[-1] > 0
    assert ring_node_losses[-1] >= ring_losses[-1]  # f is convex: f(mean) <= mean of f


def test_ring_weights_are_metropolis_hastings_and_count_the_double_edge_at_two_nodes():
    for n in (3, 4, 7):
        assert np.allclose(gossip.ring_weights(n), gossip.metropolis_weights(gossip.ring(n)))
    assert np.allclose(gossip.ring_weights(2), [[1 / 3, 2 / 3], [2 / 3, 1 / 3]])
    assert np.isclose(gossip.mixing_rate(gossip.ring_weights(2)), 1 / 3)
    assert np.isclose(gossip.mixing_rate(gossip.ring_weights(4)), 1 / 3)
    with pytest.raises(ValueError, match="at least 2"):
        gossip.ring_weights(1)


def test_the_trajectory_is_the_simulators_and_its_rows_are_drawn_step_by_step():
    problem = make_least_squares(96, 3, seed=4)
    shards = problem.shards(3)
    rows = gossip.minibatch_rows(3, 32, batch_size=5, num_steps=7, seed=9)
    rng = np.random.default_rng(9)
    assert rows.shape == (7, 3, 5)
    assert all(np.array_equal(r, rng.integers(0, 32, (3, 5))) for r in rows)
    assert gossip.minibatch_rows(3, 32, batch_size=5, num_steps=0).shape == (0, 3, 5)
    weights = gossip.ring_weights(3)
    start = np.arange(9.0).reshape(3, 3)
    models = gossip.decentralized_sgd_trajectory(shards, weights, rows=rows, lr=0.1, start=start)
    assert models.shape == (8, 3, 3) and np.array_equal(models[0], start)
    x = start
    for t in range(7):
        grads = np.stack([s.grad(x[i], rows[t, i]) for i, s in enumerate(shards)])
        x = weights @ (x - 0.1 * grads)
        assert np.array_equal(models[t + 1], x)
    # lr = 0 is pure gossip: the consensus distances of X <- W X.
    still = gossip.decentralized_sgd_trajectory(shards, weights, rows=rows, lr=0.0, start=start)
    distances = [np.linalg.norm(m - m.mean(axis=0)) for m in still]
    assert np.allclose(distances, gossip.consensus_distances(weights, start, 7), atol=1e-12)


@pytest.mark.parametrize("n", [8, 16, 64, 256])
def test_spectral_gaps_follow_the_closed_forms_the_notebook_plots(n):
    """Ring 1/N^2, torus 1/N, exponential graph exactly 2 / log2 N (Metropolis weights)."""

    def gap(adjacency):
        return 1 - gossip.mixing_rate(gossip.metropolis_weights(adjacency))

    assert np.isclose(gap(gossip.ring(n)), 2 / 3 * (1 - np.cos(2 * np.pi / n)), atol=1e-12)
    side = int(np.sqrt(n)) if int(np.sqrt(n)) ** 2 == n else None
    if side is not None and side >= 3:
        expected = 2 / 5 * (1 - np.cos(2 * np.pi / side))
        assert np.isclose(gap(gossip.torus(side, side)), expected, atol=1e-12)
    assert np.isclose(gap(gossip.exponential(n)), 2 / np.log2(n), atol=1e-12)


def test_circulant_mixing_rate_equals_the_eigenvalue_computation():
    cases = [
        (gossip.ring(12), (12,)),
        (gossip.exponential(32), (32,)),
        (gossip.torus(4, 4), (4, 4)),
        (gossip.torus(3, 5), (3, 5)),
        (gossip.complete(6), (6,)),
    ]
    for adjacency, grid in cases:
        weights = gossip.metropolis_weights(adjacency)
        got = gossip.circulant_mixing_rate(weights, grid)
        assert np.isclose(got, gossip.mixing_rate(weights), atol=1e-12), grid
    star = np.zeros((4, 4), dtype=int)
    star[0, 1:] = star[1:, 0] = 1
    with pytest.raises(ValueError, match="circulant"):
        gossip.circulant_mixing_rate(gossip.metropolis_weights(star), (4,))


def _linear_model_distance(shards, weights, lr, batch_size, rounds=3000):
    """sqrt(E||Delta||^2) of the linear model iterated on its mean and covariance (no
    eigenvectors): an independent computation of what predicted_consensus_distance sums."""
    from distopt.problems.least_squares import LeastSquares

    n, d = len(shards), shards[0].num_features
    full = LeastSquares(
        np.concatenate([s.features for s in shards]), np.concatenate([s.targets for s in shards])
    )
    optimum, hessian = full.minimum(), full.features.T @ full.features / len(full.targets)
    project = np.eye(n) - np.ones((n, n)) / n
    step = np.kron(weights @ project, np.eye(d) - lr * hessian)  # vec(Delta) row-major
    push = np.kron(weights @ project, np.eye(d))
    z = np.concatenate([s.grad(optimum) for s in shards])
    noise = np.zeros((n * d, n * d))
    for i, s in enumerate(shards):
        per_row = s.features * (s.features @ optimum - s.targets)[:, None]
        noise[i * d : (i + 1) * d, i * d : (i + 1) * d] = np.cov(per_row.T, bias=True) / batch_size
    mean, cov = np.zeros(n * d), np.zeros((n * d, n * d))
    for _ in range(rounds):
        mean = step @ mean - lr * push @ z
        cov = step @ cov @ step.T + lr**2 * push @ noise @ push.T
    return float(np.sqrt(mean @ mean)), float(np.sqrt(np.trace(cov)))


@pytest.mark.parametrize("graph", ["ring", "torus", "exponential"])
def test_predicted_consensus_distance_sums_the_linear_models_modes(graph):
    from distopt.sim.local_sgd import heterogeneous_shards

    adjacency = {
        "ring": gossip.ring(9),
        "torus": gossip.torus(3, 3),
        "exponential": gossip.exponential(9),
    }[graph]
    weights = gossip.metropolis_weights(adjacency)
    shards = heterogeneous_shards(9, 16, num_features=3, seed=2)
    got = gossip.predicted_consensus_distance(shards, weights, lr=0.1, batch_size=4)
    mean, noise = _linear_model_distance(shards, weights, 0.1, 4)
    assert np.isclose(got.heterogeneity, mean, rtol=1e-6)
    assert np.isclose(got.noise, noise, rtol=1e-6)
    assert np.isclose(got.distance, np.hypot(mean, noise))
    assert np.isclose(got.rate, gossip.mixing_rate(weights))
    # Dropping the curvature and putting every mode at lambda only makes it larger.
    assert got.distance < got.bound


def test_predicted_consensus_distance_against_decentralized_sgd():
    problem = make_least_squares(256, 4, seed=3)
    shards = problem.shards(8)
    for adjacency in (gossip.ring(8), gossip.exponential(8)):
        weights = gossip.metropolis_weights(adjacency)
        predicted = gossip.predicted_consensus_distance(shards, weights, lr=0.2)
        measured = []
        for seed in range(2):
            *_, distances = gossip.decentralized_sgd(
                shards, weights, num_steps=600, lr=0.2, seed=seed
            )
            measured.append(np.sqrt(np.mean(distances[100:] ** 2)))  # past the transient
        # Within 1 % here; the bound (no curvature, every mode at lambda) is 1.7-2.7x off.
        assert np.allclose(measured, predicted.distance, rtol=0.05), (measured, predicted)
    complete = gossip.predicted_consensus_distance(
        shards, gossip.metropolis_weights(gossip.complete(8)), lr=0.2
    )
    assert complete.distance < 1e-12 and complete.rate < 1e-12


def test_predicted_consensus_distance_refuses_what_it_does_not_model():
    shards = make_least_squares(64, 3, seed=0).shards(4)
    ring = gossip.metropolis_weights(gossip.ring(4))
    with pytest.raises(ValueError, match="doubly stochastic"):
        gossip.predicted_consensus_distance(shards, ring * 0.9, lr=0.1)
    with pytest.raises(ValueError, match="equal sizes"):
        unequal = shards[:3] + make_least_squares(8, 3).shards(1)
        gossip.predicted_consensus_distance(unequal, ring, lr=0.1)
    with pytest.raises(ValueError, match="lr too large"):
        gossip.predicted_consensus_distance(shards, ring, lr=100.0)
