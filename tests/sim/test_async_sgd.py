"""Tests of distopt.sim.async_sgd: the event simulator against plain SGD and its own rules."""

import numpy as np
import pytest

from distopt.problems.least_squares import make_least_squares
from distopt.sim.async_sgd import simulate_async_sgd, simulate_sync_sgd

PROBLEM = make_least_squares(256, 5, seed=0)


def plain_sgd(num_steps, lr, batch_size, seed):
    """Single-process SGD drawing the same random numbers as one asynchronous worker."""
    rng = np.random.default_rng(seed)
    rng.exponential(0.5)  # the first step time
    w = np.zeros(5)
    for _ in range(num_steps):
        rows = rng.integers(0, 256, batch_size)
        w = w - lr * PROBLEM.grad(w, rows)
        rng.exponential(0.5)  # the next step time
    return PROBLEM.loss(w) - PROBLEM.loss(PROBLEM.minimum())


def test_one_worker_is_plain_sgd():
    run = simulate_async_sgd(PROBLEM, num_workers=1, num_updates=50, lr=0.1, eval_every=50)
    assert np.all(run.staleness == 0)
    assert abs(run.excess_loss[-1] - plain_sgd(50, 0.1, 8, 0)) < 1e-12


def test_staleness_of_equal_workers_is_about_num_workers_minus_one():
    run = simulate_async_sgd(PROBLEM, num_workers=8, num_updates=2000, lr=0.02)
    assert run.staleness[:8].tolist() == list(range(8))  # all read version 0
    assert abs(run.staleness.mean() - 7) < 0.2
    assert run.excess_loss[-1] < 0.01 * run.excess_loss[0]


def test_large_delay_and_step_diverge_and_a_staleness_aware_step_fixes_it():
    kwargs = dict(num_workers=32, num_updates=1000)
    assert np.isinf(simulate_async_sgd(PROBLEM, lr=0.4, **kwargs).excess_loss[-1])
    aware = simulate_async_sgd(PROBLEM, lr=lambda tau: 0.4 / max(1, tau), **kwargs)
    assert aware.excess_loss[-1] < 0.05 * aware.excess_loss[0]


def test_reproducible_and_sync_baseline():
    a = simulate_async_sgd(PROBLEM, num_workers=4, num_updates=100, lr=0.05, seed=3)
    b = simulate_async_sgd(PROBLEM, num_workers=4, num_updates=100, lr=0.05, seed=3)
    assert np.array_equal(a.excess_loss, b.excess_loss) and np.array_equal(a.times_s, b.times_s)
    sync = simulate_sync_sgd(PROBLEM, num_workers=4, num_steps=100, lr=0.1)
    # Each step lasts at least the base time, and SGD makes progress.
    assert np.all(np.diff(sync.times_s) >= 1.0) and sync.excess_loss[-1] < sync.excess_loss[0]
    with pytest.raises(ValueError, match="slowdowns"):
        simulate_async_sgd(PROBLEM, num_workers=2, num_updates=1, lr=0.1, slowdowns=[1.0])


def test_the_trace_replays_the_run():
    """Each update is w - lr * grad(the weights at the version read, its recorded rows)."""
    run = simulate_async_sgd(
        PROBLEM, num_workers=3, num_updates=40, lr=0.1, seed=2, keep_weights=True
    )
    read = np.arange(40) - run.staleness
    for t in range(40):
        expected = run.weights[t] - 0.1 * PROBLEM.grad(run.weights[read[t]], run.rows[t])
        assert np.array_equal(run.weights[t + 1], expected)
    assert sorted(set(run.workers.tolist())) == [0, 1, 2] and run.compute_s.min() >= 1.0
    assert simulate_async_sgd(PROBLEM, num_workers=3, num_updates=5, lr=0.1).weights is None
    sync = simulate_sync_sgd(PROBLEM, num_workers=3, num_steps=6, lr=0.2, keep_weights=True)
    for t in range(6):
        grads = [PROBLEM.grad(sync.weights[t], rows) for rows in sync.rows[t]]
        assert np.array_equal(sync.weights[t + 1], sync.weights[t] - 0.2 * np.mean(grads, axis=0))
    assert np.allclose(np.diff(sync.times_s), sync.compute_s.max(axis=1))
