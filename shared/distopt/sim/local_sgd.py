"""Local SGD and DiLoCo: communicate every H steps instead of every step.

*Local SGD* (Stich 2019, "Local SGD converges fast and communicates little"): each of N
workers takes H SGD steps on its own data from the common model, then the workers average
their models with one all-reduce. H = 1 is synchronous data parallelism.

*DiLoCo* (Douillard et al. 2023, "DiLoCo: distributed low-communication training of language
models", Algorithm 1): the H local steps use an *inner* optimizer (AdamW in the paper, Adam
here) whose state stays on the worker; the averaged change of the parameters,
``outer_grad = theta - mean_i(theta_i)``, is then treated as a gradient by an *outer*
optimizer, SGD with Nesterov momentum (outer lr 0.7, momentum 0.9 in the paper).

Here ``simulate_local_sgd`` runs them in numpy, N workers in one process, on the
least-squares problem, with the bytes each worker sends in ring all-reduces counted.
``heterogeneous_shards`` gives the workers data that differ from worker to worker: with
i.i.d. shards the local models hardly drift apart between averages and the cost of fewer
averages stays invisible (Woodworth et al. 2020, "Minibatch vs local SGD for heterogeneous
distributed learning"). The same algorithms on real processes with torch.distributed are in
:mod:`distopt.ranks.local_sgd_ranks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distopt.costs.comm import ring_allreduce_bytes_sent
from distopt.problems.least_squares import LeastSquares
from distopt.problems.logistic import gaussian_features

__all__ = [
    "LocalRun",
    "heterogeneous_shards",
    "nesterov_outer_step",
    "simulate_local_sgd",
]

BYTES_PER_FLOAT32 = 4
# Adam's constants (Kingma & Ba 2015), for the inner optimizer of the numpy simulation.
_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8


def nesterov_outer_step(
    params: np.ndarray, outer_grad: np.ndarray, velocity: np.ndarray, *, lr: float, momentum: float
) -> tuple[np.ndarray, np.ndarray]:
    """One SGD step with Nesterov momentum, as ``torch.optim.SGD(nesterov=True)`` takes it:
    ``v <- momentum * v + g``; ``params <- params - lr * (g + momentum * v)``.

    Returns (new params, new velocity); the inputs are not modified.
    """
    velocity = momentum * velocity + outer_grad
    return params - lr * (outer_grad + momentum * velocity), velocity


def heterogeneous_shards(
    num_shards: int,
    examples_per_shard: int,
    num_features: int = 10,
    *,
    input_shift: float = 0.5,
    target_skew: float = 0.5,
    noise: float = 0.5,
    condition: float = 10.0,
    seed: int = 0,
) -> list[LeastSquares]:
    """Least-squares shards that differ from worker to worker, float64.

    Draws from ``np.random.default_rng(seed)``, in this order: ``w_true`` (d,), then for each
    shard its input shift (d,) with std ``input_shift``, its own weights ``w_true +
    target_skew * N(0, I)``, its features (``gaussian_features``, variances spread over
    ``condition``, plus the shift) and its target noise (std ``noise``). The shift gives each
    shard its own curvature ``E[x x^T]``, the skewed weights its own optimum, so a worker
    that steps alone drifts towards a minimum that is not the global one (the federated
    clients of section 06 differ the same two ways). 0 and 0 give i.i.d. shards.
    """
    if num_shards < 1 or examples_per_shard < 1:
        raise ValueError("num_shards and examples_per_shard must be >= 1")
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(num_features)
    shards = []
    for _ in range(num_shards):
        shift = rng.normal(0.0, input_shift, num_features)
        w_shard = w_true + target_skew * rng.standard_normal(num_features)
        features, _ = gaussian_features(rng, examples_per_shard, num_features, condition=condition)
        features = features + shift
        targets = features @ w_shard + noise * rng.standard_normal(examples_per_shard)
        shards.append(LeastSquares(features, targets))
    return shards


@dataclass(frozen=True)
class LocalRun:
    """One simulated run, recorded after every averaging round."""

    steps: np.ndarray  # (num_rounds + 1,) local steps each worker has taken
    bytes_sent: np.ndarray  # (num_rounds + 1,) bytes each worker has sent (ring all-reduce)
    excess_loss: np.ndarray  # (num_rounds + 1,) f(average model) - f(w*) on all the data


def simulate_local_sgd(
    shards: list[LeastSquares],
    *,
    num_rounds: int,
    local_steps: int,
    lr: float,
    batch_size: int = 8,
    inner: str = "sgd",
    outer_lr: float = 1.0,
    outer_momentum: float = 0.0,
    seed: int = 0,
) -> LocalRun:
    """Local SGD (``inner="sgd"``, outer_lr 1, momentum 0) or DiLoCo (``inner="adam"``,
    outer_lr 0.7, momentum 0.9) with ``len(shards)`` workers, starting from zero.

    Each round: every worker takes ``local_steps`` inner steps on minibatches of its shard,
    then one all-reduce of the d float32 parameter changes, then the outer Nesterov step.
    """
    if inner not in ("sgd", "adam"):
        raise ValueError(f"inner must be 'sgd' or 'adam', got {inner!r}")
    if num_rounds < 0 or local_steps < 1:
        raise ValueError("num_rounds must be >= 0 and local_steps >= 1")
    num_workers = len(shards)
    full = LeastSquares(
        np.concatenate([s.features for s in shards]), np.concatenate([s.targets for s in shards])
    )
    best = full.loss(full.minimum())
    dim = full.num_features
    rng = np.random.default_rng(seed)
    round_bytes = ring_allreduce_bytes_sent(dim * BYTES_PER_FLOAT32, num_workers)
    global_w = np.zeros(dim)
    velocity = np.zeros(dim)
    m = np.zeros((num_workers, dim))  # Adam moments, per worker, kept across rounds
    v = np.zeros((num_workers, dim))
    adam_steps = 0
    losses = [full.loss(global_w) - best]
    for _ in range(num_rounds):
        local = np.tile(global_w, (num_workers, 1))
        for _ in range(local_steps):
            rows = rng.integers(0, len(shards[0].targets), (num_workers, batch_size))
            grads = np.stack([s.grad(local[i], rows[i]) for i, s in enumerate(shards)])
            if inner == "sgd":
                local -= lr * grads
            else:
                adam_steps += 1
                m = _BETA1 * m + (1 - _BETA1) * grads
                v = _BETA2 * v + (1 - _BETA2) * grads**2
                m_hat = m / (1 - _BETA1**adam_steps)
                v_hat = v / (1 - _BETA2**adam_steps)
                local -= lr * m_hat / (np.sqrt(v_hat) + _EPS)
        outer_grad = global_w - local.mean(axis=0)  # the all-reduce
        global_w, velocity = nesterov_outer_step(
            global_w, outer_grad, velocity, lr=outer_lr, momentum=outer_momentum
        )
        loss = full.loss(global_w) - best
        losses.append(loss if np.isfinite(loss) else np.inf)
    rounds = np.arange(num_rounds + 1)
    return LocalRun(rounds * local_steps, rounds * round_bytes, np.array(losses))
