"""The critical batch size: where larger batches stop cutting the number of steps.

McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training"
(arXiv:1812.06162). To reach a given loss with batch size B (learning rate tuned for each B),

    steps     S(B) = S_min (1 + B_crit / B)
    examples  E(B) = E_min (1 + B / B_crit),       E = B S, B_crit = E_min / S_min.

Below B_crit, doubling the batch nearly halves the steps at almost no extra compute; above
it, the steps approach S_min and the extra examples are wasted. The *simple noise scale*
B_simple = tr(Sigma) / |G|^2, from the mean G and covariance Sigma of per-example gradients,
estimates B_crit (Section 2 of the paper; it equals their B_noise when the Hessian is a
multiple of the identity).

Here the problem is the toy logistic regression of :mod:`distopt.data`, trained by plain
SGD from zero, many runs at once in numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distopt.data import logistic_loss, sigmoid


def steps_model(batch_size, *, min_steps: float, critical_batch: float):
    """S(B) = S_min (1 + B_crit / B): steps to a target loss at batch size B."""
    return min_steps * (1 + critical_batch / np.asarray(batch_size, dtype=float))


def examples_model(batch_size, *, min_examples: float, critical_batch: float):
    """E(B) = E_min (1 + B / B_crit): examples processed to reach the target at batch size B."""
    return min_examples * (1 + np.asarray(batch_size, dtype=float) / critical_batch)


def simple_noise_scale(per_example_grads: np.ndarray) -> float:
    """B_simple = tr(Sigma) / |G|^2 from per-example gradients (num_examples, num_params).

    G is their mean and tr(Sigma) the sum over parameters of their sample variance
    (normalised by num_examples - 1).
    """
    grads = np.asarray(per_example_grads, dtype=float)
    if grads.ndim != 2 or grads.shape[0] < 2:
        raise ValueError("per_example_grads must be (num_examples >= 2, num_params)")
    mean = grads.mean(axis=0)
    trace_sigma = float(np.sum((grads - mean) ** 2) / (grads.shape[0] - 1))
    return trace_sigma / float(mean @ mean)


def fit_steps_model(batch_sizes: Sequence[float], steps: Sequence[float]) -> tuple[float, float]:
    """Fit S = S_min (1 + B_crit / B) to measured steps; returns (S_min, B_crit).

    S = S_min + (S_min B_crit) / B is linear in 1/B; the fit minimises the squared relative
    error, as the steps span decades.
    """
    sizes = np.asarray(batch_sizes, dtype=float)
    measured = np.asarray(steps, dtype=float)
    design = np.stack([np.ones_like(sizes), 1 / sizes], axis=1) / measured[:, None]
    (min_steps, slope), *_ = np.linalg.lstsq(design, np.ones_like(measured), rcond=None)
    return float(min_steps), float(slope / min_steps)


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
