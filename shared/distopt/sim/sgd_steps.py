"""Steps to a target loss at a given batch size: many seeded SGD runs at once, in numpy.

The measurement behind the critical-batch model of :mod:`distopt.costs.critical_batch`
(McCandlish et al. 2018): for each batch size, the learning rate is tuned and the steps plain
SGD from zero needs to reach a target loss are counted, on the toy logistic regression of
:mod:`distopt.problems.logistic`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distopt.problems.logistic import logistic_loss, sigmoid

__all__ = ["sgd_steps_to_loss"]


def sgd_steps_to_loss(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    batch_size: int,
    learning_rates: Sequence[float],
    target_loss: float,
    num_seeds: int = 5,
    max_steps: int = 10_000,
    seed: int = 0,
) -> tuple[int, float]:
    """Fewest SGD steps to reach ``target_loss`` at this batch size, over the learning rates.

    For every learning rate, ``num_seeds`` runs start from w = 0 and draw batches of
    ``batch_size`` examples with replacement; a learning rate's count is the median over
    its runs of the first step at which the full-data loss is <= ``target_loss``. Returns
    (steps, learning rate) of the best learning rate: the learning rate is tuned per batch
    size, as the model assumes. All runs advance together, and stop as soon as one learning
    rate's median is known, which is then the smallest. Raises RuntimeError if no learning
    rate gets there within ``max_steps``.
    """
    if num_seeds < 1 or num_seeds % 2 == 0:
        raise ValueError(f"num_seeds must be odd, so that the median is a run, got {num_seeds}")
    rates = np.repeat(np.asarray(learning_rates, dtype=float), num_seeds)
    rng = np.random.default_rng([seed, batch_size])
    weights = np.zeros((len(rates), features.shape[1]))
    reached_at = np.zeros(len(rates), dtype=int)  # 0: not yet
    needed = num_seeds // 2 + 1  # runs of one learning rate that must arrive for its median
    for step in range(1, max_steps + 1):
        batch = rng.integers(len(labels), size=(len(rates), batch_size))
        x, y = features[batch], labels[batch]  # (runs, batch, d), (runs, batch)
        residual = sigmoid(np.einsum("rbd,rd->rb", x, weights)) - y
        weights -= rates[:, None] * np.einsum("rbd,rb->rd", x, residual) / batch_size
        with np.errstate(over="ignore", invalid="ignore"):  # diverging runs just never arrive
            arrived = logistic_loss(weights, features, labels) <= target_loss
        reached_at[arrived & (reached_at == 0)] = step
        per_rate = (reached_at > 0).reshape(-1, num_seeds).sum(axis=1)
        if per_rate.max() >= needed:
            best = int(np.argmax(per_rate))
            return step, float(learning_rates[best])
    raise RuntimeError(f"no learning rate reached loss {target_loss} in {max_steps} steps")
