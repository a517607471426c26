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
