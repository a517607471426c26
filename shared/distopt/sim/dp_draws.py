"""DP-FedAvg over many draws of its noise at once: a statistic, not one draw.

A run of DP-FedAvg is one draw of its Gaussian noise, and at a large noise multiplier two
draws can end a whole nat apart (section 06). So every DP number of that section is the
mean over ``DRAWS`` draws, with their range. Simulating them one by one would cost ``DRAWS``
times a run; here the draws share what does not depend on the noise, the clients sampled
and the minibatches they draw (from the problem's generators, exactly as
:func:`distopt.sim.federated.run_federated` draws them), and only the models differ: one per
draw, all trained in one vectorized pass over the round's clients. Each draw's noise comes
from a generator of its own, ``np.random.default_rng(first_seed + d)``, never from the
problem's, so that adding draws does not change the minibatches of the others.

Seeded noise is for teaching only: anyone who knows the seed can subtract it again. A
deployment draws privacy noise from a cryptographically secure generator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from distopt.problems.logistic import logistic_loss, sigmoid
from distopt.sim.federated import FederatedProblem, dp_mean

DRAWS = 10  # noise draws behind every DP number of section 06: enough for a mean and a range


@dataclass
class DrawsRun:
    """The result of ``run_fedavg_draws``: one model per aggregate."""

    w: np.ndarray  # (runs, dim) the global models after the last round
    loss: np.ndarray  # (runs, rounds) global loss of each model after each round


def noise_draws(
    private_mean: Callable = dp_mean,
    *,
    clip_norm: float,
    noise_multiplier: float,
    draws: int = DRAWS,
    first_seed: int = 0,
) -> list[Callable[[np.ndarray], np.ndarray]]:
    """One aggregate per draw: ``private_mean`` (the signature of ``federated.dp_mean``)
    with its own noise generator ``np.random.default_rng(first_seed + d)``."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    return [
        functools.partial(
            private_mean,
            clip_norm=clip_norm,
            noise_multiplier=noise_multiplier,
            rng=np.random.default_rng(first_seed + d),
        )
        for d in range(draws)
    ]


def run_fedavg_draws(
    problem: FederatedProblem,
    *,
    aggregates: Sequence[Callable[[np.ndarray], np.ndarray]],
    local_steps: int,
    rounds: int,
    lr: float = 0.1,
    batch_size: int = 32,
    clients_per_round: int | None = None,
) -> DrawsRun:
    """FedAvg from w = 0 with one global model per aggregate, all on the same draws.

    Run r is ``run_federated(problem, local_steps=..., rounds=..., lr=..., batch_size=...,
    clients_per_round=..., aggregate=aggregates[r])`` on a fresh copy of the problem (to
    rounding: the gradients are summed in another order), provided the aggregates draw
    nothing from ``problem.rng``: each round the clients are sampled and their minibatches
    drawn once, in ``run_federated``'s order, and every model takes its local steps on
    them; then model r moves by ``aggregates[r](updates_r)``, updates_r being its clients'
    models minus it, shape (clients that round, dim).
    """
    if local_steps < 1 or rounds < 1 or batch_size < 1 or not aggregates:
        raise ValueError("need local_steps, rounds, batch_size >= 1 and at least one aggregate")
    rng, n = problem.rng, problem.num_clients
    batch_rngs = problem.client_rngs or [rng] * n
    W = np.zeros((len(aggregates), problem.dim))
    losses = np.zeros((len(aggregates), rounds))
    pooled_X, pooled_y = problem.pooled
    for r in range(rounds):
        if clients_per_round is None:
            chosen = range(n)
        else:
            chosen = np.sort(rng.choice(n, clients_per_round, replace=False))
        # (clients, steps, batch, dim) and (clients, steps, batch): one draw per local step,
        # client after client, as run_federated draws them
        X_steps, y_steps = [], []
        for k in chosen:
            X, y = problem.clients[k]
            idx = np.array(
                [batch_rngs[k].integers(0, len(y), batch_size) for _ in range(local_steps)]
            )
            X_steps.append(X[idx])
            y_steps.append(y[idx])
        X_steps, y_steps = np.array(X_steps), np.array(y_steps)
        local = np.repeat(W[:, None, :], len(X_steps), axis=1)  # (runs, clients, dim)
        for s in range(local_steps):
            X_s = X_steps[:, s]  # (clients, batch, dim)
            residual = (
                sigmoid(np.einsum("cbd,rcd->rcb", X_s, local, optimize=True)) - y_steps[None, :, s]
            )
            local -= lr * np.einsum("cbd,rcb->rcd", X_s, residual, optimize=True) / batch_size
        updates = local - W[:, None, :]
        for run, aggregate in enumerate(aggregates):
            W[run] = W[run] + aggregate(updates[run])
        losses[:, r] = logistic_loss(W, pooled_X, pooled_y)
    return DrawsRun(W, losses)


def spread(values: Sequence[float], digits: int = 3) -> str:
    """'mean (min to max)' of a statistic over draws, e.g. '0.364 (0.308 to 0.445)'."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        raise ValueError("no values")
    return f"{values.mean():.{digits}f} ({values.min():.{digits}f} to {values.max():.{digits}f})"
