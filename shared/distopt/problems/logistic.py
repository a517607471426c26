"""Logistic regression: a seeded toy problem small enough to train many times in a second,
and the one implementation of its loss, gradient and minimum that every section uses.

Features are Gaussian with per-feature scales spread over ``condition`` (so the loss is
ill-conditioned the way real problems are, a little), and labels are drawn from a logistic
model, so they are noisy: the loss cannot reach zero and gradients of single examples
disagree, which is what gives SGD its noise.

The loss is the mean logistic (cross-entropy) loss over the examples given,
``mean_i log(1 + exp(x_i . w)) - y_i x_i . w``; every gradient is that of this mean.
"""

from __future__ import annotations

import numpy as np


def gaussian_features(
    rng: np.random.Generator, num_examples: int, num_features: int, *, condition: float
) -> tuple[np.ndarray, np.ndarray]:
    """Features (num_examples, num_features) whose variances spread over ``condition``.

    Returns the features and the per-feature scales (num_features,), from 1 down to
    1/sqrt(condition); the toy problems of several sections draw their inputs this way.
    """
    if num_examples < 1 or num_features < 1:
        raise ValueError("num_examples and num_features must be >= 1")
    if condition < 1:
        raise ValueError(f"condition must be >= 1, got {condition!r}")
    scales = np.logspace(0, -0.5 * np.log10(condition), num_features)
    return rng.standard_normal((num_examples, num_features)) * scales, scales


def make_logistic_data(
    num_examples: int = 2048,
    num_features: int = 8,
    *,
    signal: float = 6.0,
    condition: float = 10.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Features (num_examples, num_features) and 0/1 labels (num_examples,), float64.

    signal    -- norm of the true logit x . w_true, per unit of feature scale: larger means
                 cleaner labels (fewer flipped), so less gradient noise
    condition -- ratio of the largest to the smallest feature variance
    """
    rng = np.random.default_rng(seed)
    features, scales = gaussian_features(rng, num_examples, num_features, condition=condition)
    # True weights with the same logit spread along every direction, whatever its scale.
    w_true = rng.standard_normal(num_features) / scales
    w_true *= signal / np.linalg.norm(w_true * scales)
    labels = (rng.random(num_examples) < sigmoid(features @ w_true)).astype(float)
    return features, labels


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-z)), written with tanh so that it never overflows."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z)))


def logistic_loss(w: np.ndarray, features: np.ndarray, labels: np.ndarray) -> float | np.ndarray:
    """Mean logistic loss. ``w`` is (d,), or (runs, d) for several weight vectors at once.

    Returns a float for (d,) and an array (runs,) for (runs, d).
    """
    w = np.asarray(w)
    logits = features @ np.atleast_2d(w).T  # (num_examples, runs)
    losses = np.mean(np.logaddexp(0.0, logits) - labels[:, None] * logits, axis=0)
    return float(losses[0]) if w.ndim == 1 else losses


def logistic_grad(w: np.ndarray, features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Gradient (d,) of the mean logistic loss over the given examples."""
    residual = sigmoid(features @ w) - labels
    return features.T @ residual / len(labels)


def logistic_per_example_grads(
    w: np.ndarray, features: np.ndarray, labels: np.ndarray
) -> np.ndarray:
    """Gradients of each example's loss, (num_examples, d); their mean is logistic_grad."""
    residual = sigmoid(features @ w) - labels
    return residual[:, None] * features


def logistic_minimum(
    features: np.ndarray, labels: np.ndarray, *, iterations: int = 50
) -> np.ndarray:
    """The weights (d,) that minimise the mean loss, by Newton's method from zero.

    Needs data that are not linearly separable (otherwise the minimum is at infinity and the
    Newton steps never shrink): RuntimeError if no step within ``iterations`` is shorter
    than 1e-10.
    """
    separable = "Newton's method did not converge: are the data linearly separable?"
    w = np.zeros(features.shape[1])
    for _ in range(iterations):
        p = sigmoid(features @ w)
        hessian = (features * (p * (1 - p))[:, None]).T @ features / len(labels)
        try:
            step = np.linalg.solve(hessian, logistic_grad(w, features, labels))
        except np.linalg.LinAlgError:  # every p rounded to 0 or 1: the weights ran off
            raise RuntimeError(separable) from None
        w = w - step
        if np.linalg.norm(step) < 1e-10:
            return w
    raise RuntimeError(separable)
