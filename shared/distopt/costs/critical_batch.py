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

These are the model's closed forms and its fit; :mod:`distopt.sim.sgd_steps` measures the
steps S(B) it is fitted to, on the toy logistic regression of
:mod:`distopt.problems.logistic`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
