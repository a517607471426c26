"""Gossip averaging and decentralized SGD on a communication graph.

Instead of a central average, node i replaces its vector by a weighted average of its own
and its neighbours': ``X <- W X`` with ``W`` (n, n) the *mixing matrix*, symmetric, doubly
stochastic and zero outside the graph's edges. Then the deviation from the mean shrinks at
least by ``lambda = max(|lambda_2|, |lambda_n|)``, the second-largest eigenvalue magnitude
of ``W``, every round (Boyd et al. 2006, "Randomized gossip algorithms", Sec. II):
``||X_t - mean|| <= lambda^t ||X_0 - mean||``.

Graphs (as 0/1 adjacency matrices, no self loops): ring, 2-D torus, complete graph and the
exponential graph (node i linked to i +- 2^k; Ying et al. 2021, "Exponential graph is
provably efficient for decentralized deep training"). Weights: Metropolis-Hastings,
``W_ij = 1 / (1 + max(deg_i, deg_j))`` on edges, the rest on the diagonal (Xiao & Boyd 2004).

Decentralized SGD (Lian et al. 2017, D-PSGD): every node takes a gradient step on its own
data, then averages with its neighbours once.
"""

from __future__ import annotations

import numpy as np

from distopt.problems.least_squares import LeastSquares


def ring(num_nodes: int) -> np.ndarray:
    """Adjacency (n, n) of a cycle: i linked to i - 1 and i + 1 (mod n). n >= 3."""
    if num_nodes < 3:
        raise ValueError(f"a ring needs at least 3 nodes, got {num_nodes}")
    return _circulant(num_nodes, [1])


def torus(rows: int, cols: int) -> np.ndarray:
    """Adjacency (rows*cols,)*2 of a 2-D torus: node (r, c) = r*cols + c, 4 wrap-around links."""
    if rows < 3 or cols < 3:
        raise ValueError(f"a torus needs at least 3 x 3 nodes, got {rows} x {cols}")
    return np.kron(ring(rows), np.eye(cols, dtype=int)) + np.kron(
        np.eye(rows, dtype=int), ring(cols)
    )


def complete(num_nodes: int) -> np.ndarray:
    """Adjacency of the complete graph: every node linked to every other."""
    if num_nodes < 2:
        raise ValueError(f"a graph needs at least 2 nodes, got {num_nodes}")
    return np.ones((num_nodes, num_nodes), dtype=int) - np.eye(num_nodes, dtype=int)


def exponential(num_nodes: int) -> np.ndarray:
    """Adjacency of the (undirected) exponential graph: i linked to i +- 1, 2, 4, ... (mod n)."""
    if num_nodes < 2:
        raise ValueError(f"a graph needs at least 2 nodes, got {num_nodes}")
    hops = [2**k for k in range(int(np.log2(num_nodes - 1)) + 1)] if num_nodes > 2 else [1]
    return _circulant(num_nodes, hops)


def _circulant(num_nodes: int, hops: list[int]) -> np.ndarray:
    adjacency = np.zeros((num_nodes, num_nodes), dtype=int)
    nodes = np.arange(num_nodes)
    for hop in hops:
        adjacency[nodes, (nodes + hop) % num_nodes] = 1
        adjacency[nodes, (nodes - hop) % num_nodes] = 1
    np.fill_diagonal(adjacency, 0)
    return adjacency


def metropolis_weights(adjacency: np.ndarray) -> np.ndarray:
    """Metropolis-Hastings mixing matrix (n, n) of a symmetric 0/1 adjacency matrix."""
    adjacency = np.asarray(adjacency)
    if adjacency.ndim != 2 or adjacency.shape[0] != adjacency.shape[1]:
        raise ValueError(f"adjacency must be square, got shape {adjacency.shape}")
    if not np.array_equal(adjacency, adjacency.T):
        raise ValueError("adjacency must be symmetric (an undirected graph)")
    links = (adjacency != 0) & ~np.eye(len(adjacency), dtype=bool)
    degree = links.sum(axis=1)
    weights = np.where(links, 1.0 / (1.0 + np.maximum.outer(degree, degree)), 0.0)
    weights[np.diag_indices_from(weights)] = 1.0 - weights.sum(axis=1)
    return weights


def mixing_rate(weights: np.ndarray) -> float:
    """Second-largest eigenvalue magnitude of a symmetric mixing matrix (the per-round
    contraction factor of the consensus distance)."""
    eigenvalues = np.sort(np.abs(np.linalg.eigvalsh(weights)))
    return float(eigenvalues[-2])


def consensus_distances(weights: np.ndarray, values: np.ndarray, num_rounds: int) -> np.ndarray:
    """Consensus distance ``||X_t - mean(X_t)||_F`` for t = 0..num_rounds of ``X <- W X``.

    values -- (n,) or (n, d): node i starts with row i
    Returns (num_rounds + 1,).
    """
    x = np.asarray(values, dtype=float).reshape(len(weights), -1)
    distances = np.empty(num_rounds + 1)
    for t in range(num_rounds + 1):
        distances[t] = np.linalg.norm(x - x.mean(axis=0))
        x = weights @ x
    return distances


def decentralized_sgd(
    shards: list[LeastSquares],
    weights: np.ndarray,
    *,
    num_steps: int,
    lr: float,
    batch_size: int = 8,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """D-PSGD: node i steps on its own shard, then ``X <- W X``; all nodes start at zero.

    Returns three arrays (num_steps + 1,), excess losses on all the data: of the nodes'
    average model; of the nodes' own models, averaged over the nodes; and the consensus
    distance ``||X - mean(X)||_F``. With ``weights`` = the all-1/n matrix this is synchronous
    minibatch SGD with batch n * batch_size.
    """
    num_nodes = len(shards)
    if weights.shape != (num_nodes, num_nodes):
        raise ValueError(f"weights must be ({num_nodes}, {num_nodes}), got {weights.shape}")
    full = LeastSquares(
        np.concatenate([s.features for s in shards]), np.concatenate([s.targets for s in shards])
    )
    best = full.loss(full.minimum())
    rng = np.random.default_rng(seed)
    x = np.zeros((num_nodes, full.num_features))
    losses = [full.loss(x.mean(axis=0)) - best]
    node_losses = [losses[0]]
    distances = [0.0]
    for _ in range(num_steps):
        rows = rng.integers(0, len(shards[0].targets), (num_nodes, batch_size))
        grads = np.stack([s.grad(x[i], rows[i]) for i, s in enumerate(shards)])
        x = weights @ (x - lr * grads)
        losses.append(full.loss(x.mean(axis=0)) - best)
        node_losses.append(float(np.mean(full.loss(x))) - best)
        distances.append(np.linalg.norm(x - x.mean(axis=0)))
    return np.array(losses), np.array(node_losses), np.array(distances)
