"""A small seeded least-squares problem, split into shards, for the section on asynchronous,
decentralized and local optimization.

The loss is ``f(w) = 1/(2m) * ||A w - b||^2`` over the ``m`` rows of ``A``; minibatch gradients
of a few rows are noisy estimates of the full gradient, which is what SGD and its
asynchronous and local variants work with. The optimum has a closed form, so every
simulation can report its *excess* loss ``f(w) - f(w*)``, which goes to zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distopt.problems.logistic import gaussian_features


@dataclass(frozen=True)
class LeastSquares:
    """Features ``(m, d)`` and targets ``(m,)``; float64."""

    features: np.ndarray
    targets: np.ndarray

    @property
    def num_features(self) -> int:
        return self.features.shape[1]

    def loss(self, w: np.ndarray) -> float | np.ndarray:
        """Mean half squared error: a float for ``w`` (d,), an array (runs,) for (runs, d)."""
        w = np.asarray(w, dtype=float)
        residual = np.atleast_2d(w) @ self.features.T - self.targets  # (runs, m)
        losses = 0.5 * np.mean(residual**2, axis=1)
        return float(losses[0]) if w.ndim == 1 else losses

    def grad(self, w: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Gradient (d,) of the mean loss over ``rows`` (all rows if None)."""
        a = self.features if rows is None else self.features[rows]
        b = self.targets if rows is None else self.targets[rows]
        return a.T @ (a @ w - b) / len(b)

    def minimum(self) -> np.ndarray:
        """The minimiser ``w*`` (d,), by least squares."""
        return np.linalg.lstsq(self.features, self.targets, rcond=None)[0]

    def smoothness(self) -> float:
        """L = largest eigenvalue of A^T A / m: plain gradient descent is stable for lr < 2/L."""
        return float(np.linalg.eigvalsh(self.features.T @ self.features / len(self.targets))[-1])

    def shards(self, num_shards: int) -> list[LeastSquares]:
        """Split the rows into ``num_shards`` contiguous equal parts (one per worker)."""
        if num_shards < 1 or len(self.targets) % num_shards:
            raise ValueError(f"{len(self.targets)} rows do not split into {num_shards} shards")
        return [
            LeastSquares(f, t)
            for f, t in zip(
                np.split(self.features, num_shards),
                np.split(self.targets, num_shards),
                strict=True,
            )
        ]


def make_least_squares(
    num_examples: int = 1024,
    num_features: int = 10,
    *,
    noise: float = 0.5,
    condition: float = 10.0,
    seed: int = 0,
) -> LeastSquares:
    """Gaussian features with variances spread over ``condition``; targets ``A w_true + noise``.

    noise     -- standard deviation of the target noise (so the minimum loss is about noise^2/2)
    condition -- ratio of the largest to the smallest feature variance
    """
    rng = np.random.default_rng(seed)
    features, _ = gaussian_features(rng, num_examples, num_features, condition=condition)
    w_true = rng.standard_normal(num_features)
    targets = features @ w_true + noise * rng.standard_normal(num_examples)
    return LeastSquares(features, targets)
