"""Straggler models: random worker step times, and what a synchronous step waits for.

A worker's step takes ``base_s`` seconds of work plus a random delay (interference, garbage
collection, a slow link). Two delay laws:

* ``"exponential"``: delay ~ Exponential(mean ``mean_delay_s``). The expected maximum over
  N workers has a closed form, ``base_s + mean_delay_s * H_N`` (H_N the N-th harmonic
  number), so it grows like log N.
* ``"pareto"``: delay ~ Pareto with tail index ``alpha`` (a heavy tail: P(delay > x) falls
  like x^-alpha), scaled to the same mean. The expected maximum grows like N^(1/alpha).

A synchronous step ends when the slowest worker is done; with ``num_backup`` spare workers
(Chen et al. 2016, "Revisiting distributed synchronous SGD") it ends when the fastest
``N`` of ``N + num_backup`` are done, and the stragglers' gradients are dropped.
"""

from __future__ import annotations

import math

import numpy as np

DISTRIBUTIONS = ("exponential", "pareto")


def sample_step_times(
    num_workers: int,
    num_steps: int,
    *,
    base_s: float = 1.0,
    mean_delay_s: float = 0.5,
    distribution: str = "exponential",
    alpha: float = 2.5,
    seed: int = 0,
) -> np.ndarray:
    """Step times in seconds, shape (num_steps, num_workers), independent across both axes.

    alpha -- tail index of the Pareto law (> 1 so that the mean exists); ignored otherwise
    """
    if num_workers < 1 or num_steps < 1:
        raise ValueError("num_workers and num_steps must be >= 1")
    if base_s < 0 or mean_delay_s < 0:
        raise ValueError("base_s and mean_delay_s must be >= 0")
    rng = np.random.default_rng(seed)
    shape = (num_steps, num_workers)
    if distribution == "exponential":
        delays = rng.exponential(mean_delay_s, shape)
    elif distribution == "pareto":
        if alpha <= 1:
            raise ValueError(f"alpha must be > 1 for a finite mean, got {alpha!r}")
        # Lomax (Pareto II) draws have mean 1 / (alpha - 1); rescale to mean_delay_s.
        delays = rng.pareto(alpha, shape) * (alpha - 1) * mean_delay_s
    else:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    return base_s + delays


def sync_step_times(step_times: np.ndarray, num_backup: int = 0) -> np.ndarray:
    """Duration (num_steps,) of each synchronous step over the columns of ``step_times``.

    ``step_times`` is (num_steps, num_workers + num_backup); a step waits for the fastest
    ``num_workers`` of them, i.e. the (num_workers)-th smallest time.
    """
    step_times = np.asarray(step_times, dtype=float)
    total = step_times.shape[1]
    if not 0 <= num_backup < total:
        raise ValueError(f"num_backup must be in [0, {total}), got {num_backup!r}")
    return np.sort(step_times, axis=1)[:, total - num_backup - 1]


def expected_max_pareto_delay(num_workers: int, *, mean_delay_s: float, alpha: float) -> float:
    """E[max of N Pareto delays] with the scaling of ``sample_step_times``, in seconds.

    For Lomax draws X (scale 1), max = (1 - U_(N))^(-1/alpha) - 1 with U_(N) ~ Beta(N, 1), so
    E[max] = N * B(N, 1 - 1/alpha) - 1, B the Beta function.
    """
    if num_workers < 1 or alpha <= 1:
        raise ValueError("num_workers must be >= 1 and alpha > 1")
    log_beta = math.lgamma(num_workers) + math.lgamma(1 - 1 / alpha)
    log_beta -= math.lgamma(num_workers + 1 - 1 / alpha)
    return (num_workers * math.exp(log_beta) - 1) * (alpha - 1) * mean_delay_s
