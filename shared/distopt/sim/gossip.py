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

Decentralized SGD: every node takes a gradient step on its own data and averages with its
neighbours once per step. Lian et al. 2017 ("Can decentralized algorithms outperform
centralized algorithms?", D-PSGD, Algorithm 1) average the old models while the step is
taken, ``X <- W X - eta G``; Koloskova et al. 2020 ("A unified theory of decentralized SGD
with changing topology and local updates", Algorithm 1) step first and average the result,
``X <- W (X - eta G)``, the form simulated here and run on real ranks by
:mod:`distopt.ranks.gossip_ranks`. Both take ``G``'s row i at node i's own model.
While they train, the nodes never agree: :func:`predicted_consensus_distance` says where the
consensus distance settles, from the shards' gradient noise and heterogeneity and the spectra
of W and of the Hessian.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def ring_weights(num_nodes: int) -> np.ndarray:
    """Mixing matrix (n, n) of one ring gossip round: node i keeps 1/3 of its vector and takes
    1/3 from each of its neighbours i - 1 and i + 1 (mod n), ``W = (I + P + P^T) / 3`` with P
    the cyclic shift. n >= 2.

    For n >= 3 this is ``metropolis_weights(ring(n))`` (every node has degree 2, so each edge
    gets 1 / (1 + 2)). At n = 2 both neighbours are the same node: the ring is two nodes
    joined by two parallel edges, each node of degree 2 as Metropolis-Hastings counts it, so
    the other node's vector arrives twice and ``W = [[1/3, 2/3], [2/3, 1/3]]`` (eigenvalues 1
    and -1/3: the mixing rate is 1/3, not the 0 of the plain one-edge graph's 1/2-1/2 average).
    """
    if num_nodes < 2:
        raise ValueError(f"a gossip ring needs at least 2 nodes, got {num_nodes}")
    shift = np.roll(np.eye(num_nodes), 1, axis=1)
    return (np.eye(num_nodes) + shift + shift.T) / 3


def mixing_rate(weights: np.ndarray) -> float:
    """Second-largest eigenvalue magnitude of a symmetric mixing matrix (the per-round
    contraction factor of the consensus distance)."""
    eigenvalues = np.sort(np.abs(np.linalg.eigvalsh(weights)))
    return float(eigenvalues[-2])


def circulant_mixing_rate(weights: np.ndarray, grid: tuple[int, ...]) -> float:
    """:func:`mixing_rate` of a mixing matrix that every node sees the same way: the nodes sit
    on a cyclic grid (ring and circulant graphs such as the exponential graph: ``(n,)``; a
    k x l torus: ``(k, l)``, node ``r * l + c``) and ``W[i, j]`` depends only on ``j - i``
    around the grid. Such a (block-)circulant matrix is diagonalised by the discrete Fourier
    transform, so its eigenvalues are the DFT of its first row (Gray 2006, "Toeplitz and
    circulant matrices: a review", Sec. 3.1): O(n log n) work instead of ``eigvalsh``'s
    O(n^3), which matters at n = 1024. Raises ValueError if W is not of that kind."""
    weights = np.asarray(weights, dtype=float)
    n = int(np.prod(grid))
    if weights.shape != (n, n):
        raise ValueError(f"weights must be ({n}, {n}) for grid {grid}, got {weights.shape}")
    first = weights[0].reshape(grid)
    # Row i must be the first row shifted to node i (checked on a few rows).
    for i in {1, n // 3, n - 1} - {0}:
        shift = np.unravel_index(i, grid)
        if not np.allclose(weights[i].reshape(grid), np.roll(first, shift, axis=range(len(grid)))):
            raise ValueError(f"row {i} is not row 0 shifted: W is not circulant on grid {grid}")
    eigenvalues = np.fft.fftn(first).real  # a symmetric W has real eigenvalues
    return float(np.sort(np.abs(eigenvalues.ravel()))[-2])


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


def minibatch_rows(
    num_nodes: int, shard_size: int, *, batch_size: int, num_steps: int, seed: int = 0
) -> np.ndarray:
    """The rows each node samples at each step of :func:`decentralized_sgd`, drawn in its
    order: an int array (num_steps, num_nodes, batch_size) of indices into a node's shard
    (with replacement). Node i's rows at step t are ``[t, i]``: what a rank needs to take
    exactly the simulator's steps."""
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, shard_size, (num_nodes, batch_size)) for _ in range(num_steps)]
    return np.array(rows, dtype=np.int64).reshape(num_steps, num_nodes, batch_size)


def decentralized_sgd_trajectory(
    shards: list[LeastSquares],
    weights: np.ndarray,
    *,
    rows: np.ndarray,
    lr: float,
    start: np.ndarray | None = None,
) -> np.ndarray:
    """The models of ``X <- W (X - lr G)`` (Koloskova et al. 2020, Algorithm 1) at every step.

    shards -- node i's data; G's row i is shards[i]'s minibatch gradient at node i's model
    rows   -- (num_steps, n, batch) indices into the shards (:func:`minibatch_rows`)
    start  -- (n, d) the nodes' first models; zeros if None
    Returns X (num_steps + 1, n, d), float64: [t, i] is node i's model after t steps.
    """
    num_nodes = len(shards)
    if weights.shape != (num_nodes, num_nodes):
        raise ValueError(f"weights must be ({num_nodes}, {num_nodes}), got {weights.shape}")
    rows = np.asarray(rows)
    if rows.ndim != 3 or rows.shape[1] != num_nodes:
        raise ValueError(f"rows must be (steps, {num_nodes}, batch), got {rows.shape}")
    d = shards[0].num_features
    x = np.zeros((num_nodes, d)) if start is None else np.array(start, dtype=float)
    if x.shape != (num_nodes, d):
        raise ValueError(f"start must be ({num_nodes}, {d}), got {x.shape}")
    models = [x]
    for step_rows in rows:
        grads = np.stack([s.grad(x[i], step_rows[i]) for i, s in enumerate(shards)])
        x = weights @ (x - lr * grads)
        models.append(x)
    return np.stack(models)


def decentralized_sgd(
    shards: list[LeastSquares],
    weights: np.ndarray,
    *,
    num_steps: int,
    lr: float,
    batch_size: int = 8,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decentralized SGD, ``X <- W (X - lr G)``, from zero; node i steps on shards[i].

    Returns three arrays (num_steps + 1,), excess losses on all the data: of the nodes'
    average model; of the nodes' own models, averaged over the nodes; and the consensus
    distance ``||X - mean(X)||_F``. With ``weights`` = the all-1/n matrix this is synchronous
    minibatch SGD with batch n * batch_size. The minibatches are :func:`minibatch_rows`'s.
    """
    num_nodes = len(shards)
    full = LeastSquares(
        np.concatenate([s.features for s in shards]), np.concatenate([s.targets for s in shards])
    )
    best = full.loss(full.minimum())
    rows = minibatch_rows(
        num_nodes, len(shards[0].targets), batch_size=batch_size, num_steps=num_steps, seed=seed
    )
    models = decentralized_sgd_trajectory(shards, weights, rows=rows, lr=lr)
    losses = np.array([full.loss(x.mean(axis=0)) - best for x in models])
    node_losses = np.array([float(np.mean(full.loss(x))) - best for x in models])
    distances = np.array([np.linalg.norm(x - x.mean(axis=0)) for x in models])
    node_losses[0] = losses[0]  # all nodes start at the same model: one loss, as it was
    return losses, node_losses, distances


@dataclass(frozen=True)
class ConsensusPrediction:
    """The stationary consensus distance of :func:`decentralized_sgd`, predicted.

    distance      -- sqrt(E ||X - mean(X)||_F^2) in the linear model, all modes summed
    heterogeneity -- the part of ``distance`` from the shards' different gradients at x*
    noise         -- the part from the minibatch noise (distance^2 = heterogeneity^2 + noise^2)
    bound         -- the same model with the curvature dropped and every mode at lambda:
                     ``lr * lambda * sqrt((n-1) sigma2 / (1-lambda^2) + n zeta2 / (1-lambda)^2)``
    rate          -- lambda, :func:`mixing_rate` of the weights
    sigma2        -- mean over nodes of the minibatch noise's variance at x*, ``E||xi_i||^2``
    zeta2         -- mean over nodes of ``||grad f_i(x*)||^2``, the shards' heterogeneity
    """

    distance: float
    heterogeneity: float
    noise: float
    bound: float
    rate: float
    sigma2: float
    zeta2: float


def predicted_consensus_distance(
    shards: list[LeastSquares], weights: np.ndarray, *, lr: float, batch_size: int = 8
) -> ConsensusPrediction:
    """Where the consensus distance of ``X <- W (X - lr G)`` settles, from the spectra of W
    and of the Hessian (the consensus part of Koloskova et al. 2020's analysis, made exact
    for a linear model).

    The model: near the optimum x* of all the data, node i's minibatch gradient is
    ``grad f_i(x*) + H (x_i - x*) + xi_i``, with H the Hessian of all the data (shared by the
    nodes: exact when the shards' Hessians agree, an approximation otherwise) and xi_i the
    noise of a ``batch_size``-row minibatch drawn with replacement from shard i at x*
    (independent across nodes and steps; its dependence on x_i is dropped). Shards must be
    of equal size, so that the grad f_i(x*) sum to zero. Then ``Delta = X - mean(X)`` follows
    ``Delta <- W Delta (I - lr H) - lr W (Z + Xi)``, which the eigenvectors u_k of W
    (k >= 2, the average's mode left out) and v_j of H decouple: with
    ``a = lambda_k (1 - lr h_j)``, mode (k, j) settles at the mean
    ``-lr lambda_k z_kj / (1 - a)`` (``z_kj = u_k^T Z v_j``) and fluctuates with variance
    ``lr^2 lambda_k^2 s_kj / (1 - a^2)`` (``s_kj = sum_i u_ki^2 v_j^T C_i v_j``, C_i the
    noise covariance). The sum of the squares over all modes is ``distance^2``.
    """
    weights = np.asarray(weights, dtype=float)
    num_nodes = len(shards)
    if weights.shape != (num_nodes, num_nodes) or not np.allclose(weights, weights.T):
        raise ValueError(f"weights must be a symmetric ({num_nodes}, {num_nodes}) matrix")
    if not np.allclose(weights.sum(axis=1), 1):
        raise ValueError("weights must be doubly stochastic (rows summing to 1)")
    if len({len(s.targets) for s in shards}) != 1:
        raise ValueError("the shards must have equal sizes")
    full = LeastSquares(
        np.concatenate([s.features for s in shards]), np.concatenate([s.targets for s in shards])
    )
    optimum = full.minimum()
    curvatures, directions = np.linalg.eigh(full.features.T @ full.features / len(full.targets))
    eigenvalues, vectors = np.linalg.eigh(weights)
    average_mode = np.argmax(np.abs(vectors.T @ np.ones(num_nodes)))
    keep = np.arange(num_nodes) != average_mode
    eigenvalues, vectors = eigenvalues[keep], vectors[:, keep]
    gradients = np.stack([s.grad(optimum) for s in shards])  # Z, rows summing to zero
    covariances = []
    for s in shards:
        per_row = s.features * (s.features @ optimum - s.targets)[:, None]
        centred = per_row - per_row.mean(axis=0)
        covariances.append(centred.T @ centred / len(per_row) / batch_size)
    covariances = np.stack(covariances)  # (n, d, d): C_i
    along = np.einsum("dj,nde,ej->nj", directions, covariances, directions)  # v_j^T C_i v_j
    noise_var = (vectors**2).T @ along  # s_kj
    z = vectors.T @ gradients @ directions  # z_kj
    lam = eigenvalues[:, None]
    a = lam * (1 - lr * curvatures[None, :])
    if np.any(np.abs(a) >= 1):
        raise ValueError("lr too large: some mode does not contract (|lambda_k (1 - lr h_j)| >= 1)")
    heterogeneity = float(np.sqrt(np.sum((lr * lam * z / (1 - a)) ** 2)))
    noise = float(np.sqrt(np.sum(lr**2 * lam**2 * noise_var / (1 - a**2))))
    rate = float(np.max(np.abs(eigenvalues))) if num_nodes > 1 else 0.0
    sigma2 = float(np.mean(np.trace(covariances, axis1=1, axis2=2)))
    zeta2 = float(np.mean(np.sum(gradients**2, axis=1)))
    bound = (
        lr
        * rate
        * np.sqrt((num_nodes - 1) * sigma2 / (1 - rate**2) + num_nodes * zeta2 / (1 - rate) ** 2)
    )
    return ConsensusPrediction(
        distance=float(np.hypot(heterogeneity, noise)),
        heterogeneity=heterogeneity,
        noise=noise,
        bound=float(bound),
        rate=rate,
        sigma2=sigma2,
        zeta2=zeta2,
    )
