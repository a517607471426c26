"""Tests of distopt.sim.stragglers: sampled step times against the closed forms."""

import math

import numpy as np
import pytest

from distopt.sim.stragglers import expected_max_pareto_delay, sample_step_times, sync_step_times


@pytest.mark.parametrize("num_workers", [1, 4, 32])
def test_mean_of_the_maximum_matches_the_closed_forms(num_workers):
    exp = sample_step_times(num_workers, 40_000, base_s=1.0, mean_delay_s=0.5, seed=1)
    harmonic = sum(1 / k for k in range(1, num_workers + 1))
    assert math.isclose(exp.max(axis=1).mean(), 1.0 + 0.5 * harmonic, rel_tol=0.01)
    par = sample_step_times(
        num_workers, 40_000, base_s=0.0, mean_delay_s=0.5, distribution="pareto", seed=2
    )
    expected = expected_max_pareto_delay(num_workers, mean_delay_s=0.5, alpha=2.5)
    assert math.isclose(par.max(axis=1).mean(), expected, rel_tol=0.05)


def test_backup_workers_take_the_kth_fastest():
    times = np.array([[3.0, 1.0, 2.0, 5.0]])
    assert sync_step_times(times)[0] == 5.0
    assert sync_step_times(times, num_backup=1)[0] == 3.0
    assert sync_step_times(times, num_backup=3)[0] == 1.0
    with pytest.raises(ValueError):
        sync_step_times(times, num_backup=4)


def test_seeded_and_validated():
    a = sample_step_times(3, 5, seed=4)
    assert np.array_equal(a, sample_step_times(3, 5, seed=4)) and a.shape == (5, 3)
    with pytest.raises(ValueError, match="distribution"):
        sample_step_times(2, 2, distribution="normal")
    with pytest.raises(ValueError, match="alpha"):
        sample_step_times(2, 2, distribution="pareto", alpha=1.0)
