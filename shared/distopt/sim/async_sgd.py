"""Asynchronous SGD on a parameter server, as a seeded discrete-event simulation.

Each worker loops: read the server's current weights (and their version number), compute a
minibatch gradient for a random time, push it. The server applies every gradient the moment
it arrives, ``w <- w - lr(staleness) * g``, where the *staleness* is the number of updates
applied since that worker read the weights: the gradient was computed at an older point
(Recht et al. 2011 "Hogwild!"; Dean et al. 2012 "Downpour SGD"; Lian et al. 2015).

Events are ordered by simulated time, ties by worker index, and every random draw (step
times, minibatches) comes from one generator seeded once, so a run reproduces exactly.
``simulate_sync_sgd`` is the synchronous baseline under the same straggler model: each step
waits for the slowest worker and applies the average of the workers' gradients.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from distopt.problems.least_squares import LeastSquares


@dataclass(frozen=True)
class ServerRun:
    """What a simulation records; times in simulated seconds."""

    times_s: np.ndarray  # (num_evals,) time of each loss evaluation
    updates: np.ndarray  # (num_evals,) number of server updates applied at that time
    excess_loss: np.ndarray  # (num_evals,) f(w) - f(w*); inf once the run has diverged
    staleness: np.ndarray  # (num_updates,) staleness of each applied gradient (0 for sync)
    # The run's trace, what a run on real processes replays (distopt.ranks.async_ranks).
    # Asynchronous: one entry per applied gradient, which worker pushed it, its minibatch rows
    # and its compute time. Synchronous: one entry per step and worker (no ``workers``).
    workers: np.ndarray | None = None  # (num_updates,) worker index 0 .. num_workers - 1
    rows: np.ndarray | None = None  # (num_updates, batch_size); sync (steps, workers, batch)
    compute_s: np.ndarray | None = None  # (num_updates,) simulated s; sync (steps, workers)
    weights: np.ndarray | None = None  # (num_updates + 1, d) w after each update (keep_weights)


def _step_time(rng: np.random.Generator, slowdown: float, base_s: float, delay_s: float) -> float:
    """One compute time: slowdown * (base + Exponential(delay)), in seconds."""
    return slowdown * (base_s + rng.exponential(delay_s))


def _check(num_workers: int, num_updates: int, slowdowns: Sequence[float] | None) -> np.ndarray:
    if num_workers < 1 or num_updates < 1:
        raise ValueError("num_workers and num_updates must be >= 1")
    factors = np.ones(num_workers) if slowdowns is None else np.asarray(slowdowns, float)
    if factors.shape != (num_workers,) or np.any(factors <= 0):
        raise ValueError(f"slowdowns must be {num_workers} positive numbers")
    return factors


def simulate_async_sgd(
    problem: LeastSquares,
    *,
    num_workers: int,
    num_updates: int,
    lr: float | Callable[[int], float],
    batch_size: int = 8,
    slowdowns: Sequence[float] | None = None,
    base_s: float = 1.0,
    mean_delay_s: float = 0.5,
    eval_every: int = 10,
    seed: int = 0,
    keep_weights: bool = False,
) -> ServerRun:
    """Run asynchronous SGD until the server has applied ``num_updates`` gradients.

    lr        -- a step size, or a function staleness -> step size (a staleness-aware rule)
    slowdowns -- per-worker multipliers (num_workers,) of the step time; 1 = nominal speed
    base_s, mean_delay_s -- a step takes slowdown * (base_s + Exponential(mean_delay_s)) s
    eval_every -- record the excess loss every this many updates
    keep_weights -- also return the weights after every update (``ServerRun.weights``)

    With one worker the staleness is always 0 and this is plain SGD.
    """
    factors = _check(num_workers, num_updates, slowdowns)
    lr_of = lr if callable(lr) else (lambda staleness: lr)
    rng = np.random.default_rng(seed)
    best = problem.loss(problem.minimum())
    num_rows = len(problem.targets)
    w = np.zeros(problem.num_features)
    version = 0
    # Each event: (finish time, worker, version read, weights read, step time). A worker has
    # one event pending at a time, so ties in time are broken by the worker, never the arrays.
    events: list[tuple[float, int, int, np.ndarray, float]] = []
    for worker in range(num_workers):
        took = _step_time(rng, factors[worker], base_s, mean_delay_s)
        heapq.heappush(events, (took, worker, version, w.copy(), took))
    times, updates, losses = [0.0], [0], [problem.loss(w) - best]
    staleness = np.zeros(num_updates, dtype=int)
    pushed_by = np.zeros(num_updates, dtype=int)
    all_rows = np.zeros((num_updates, batch_size), dtype=int)
    compute_s = np.zeros(num_updates)
    kept = [w] if keep_weights else []
    while version < num_updates:
        now, worker, read_version, w_read, took = heapq.heappop(events)
        rows = rng.integers(0, num_rows, batch_size)
        tau = version - read_version
        w = w - lr_of(tau) * problem.grad(w_read, rows)
        staleness[version], pushed_by[version], compute_s[version] = tau, worker, took
        all_rows[version] = rows
        version += 1
        if keep_weights:
            kept.append(w)
        if version % eval_every == 0 or version == num_updates:
            times.append(now)
            updates.append(version)
            loss = problem.loss(w) - best
            losses.append(loss if np.isfinite(loss) and loss < 1e12 else np.inf)
            if not np.isfinite(losses[-1]):
                break
        took = _step_time(rng, factors[worker], base_s, mean_delay_s)
        heapq.heappush(events, (now + took, worker, version, w.copy(), took))
    return ServerRun(
        np.array(times),
        np.array(updates),
        np.array(losses),
        staleness[:version],
        workers=pushed_by[:version],
        rows=all_rows[:version],
        compute_s=compute_s[:version],
        weights=np.array(kept) if keep_weights else None,
    )


def simulate_sync_sgd(
    problem: LeastSquares,
    *,
    num_workers: int,
    num_steps: int,
    lr: float,
    batch_size: int = 8,
    slowdowns: Sequence[float] | None = None,
    base_s: float = 1.0,
    mean_delay_s: float = 0.5,
    eval_every: int = 1,
    seed: int = 0,
    keep_weights: bool = False,
) -> ServerRun:
    """Synchronous SGD: each step every worker computes a gradient on ``batch_size`` rows,
    the step lasts as long as the slowest worker, and the server applies the average.
    ``keep_weights``: also return the weights after every step."""
    factors = _check(num_workers, num_steps, slowdowns)
    rng = np.random.default_rng(seed)
    best = problem.loss(problem.minimum())
    num_rows = len(problem.targets)
    w = np.zeros(problem.num_features)
    now = 0.0
    times, updates, losses = [0.0], [0], [problem.loss(w) - best]
    all_rows, compute_s, kept = [], [], [w]
    for step in range(1, num_steps + 1):
        durations = [_step_time(rng, f, base_s, mean_delay_s) for f in factors]
        rows = [rng.integers(0, num_rows, batch_size) for _ in factors]
        grads = [problem.grad(w, r) for r in rows]
        w = w - lr * np.mean(grads, axis=0)
        now += max(durations)
        all_rows.append(rows)
        compute_s.append(durations)
        kept.append(w)
        if step % eval_every == 0 or step == num_steps:
            times.append(now)
            updates.append(step)
            loss = problem.loss(w) - best
            losses.append(loss if np.isfinite(loss) and loss < 1e12 else np.inf)
            if not np.isfinite(losses[-1]):
                break
    return ServerRun(
        np.array(times),
        np.array(updates),
        np.array(losses),
        np.zeros(num_steps, dtype=int),
        rows=np.array(all_rows),
        compute_s=np.array(compute_s),
        weights=np.array(kept) if keep_weights else None,
    )
