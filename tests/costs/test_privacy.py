"""Tests of distopt.costs.privacy: epsilon from Opacus's RDP accountant, and its inverse."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from distopt.costs import privacy


def _balle_epsilon(rdp: np.ndarray, orders: np.ndarray, delta: float) -> float:
    """RDP -> (eps, delta), Balle et al. 2020 Theorem 21 (the conversion Opacus 1.6 uses)."""
    eps = rdp + np.log1p(-1 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
    return float(np.min(eps))


def test_the_lessons_sigma_8_at_100_30_and_10_of_100_clients():
    # The accountant's numbers the notebook prints (30 rounds, delta 1e-5).
    got = [privacy.epsilon(8.0, k / 100, 30, 1e-5) for k in (100, 30, 10)]
    assert got == pytest.approx([3.0754, 0.8491, 0.2612], abs=1e-4)


@pytest.mark.parametrize(
    ("sigma", "rounds", "delta"),
    [(8.0, 30, 1e-5), (1.0, 1, 1e-3), (0.7, 200, 1e-6), (30.0, 10, 1e-5)],
)
def test_without_sampling_it_is_the_composed_gaussian_mechanism(sigma, rounds, delta):
    # Every client in every round: the Gaussian mechanism's RDP a / (2 sigma^2) per round
    # (Mironov 2017, Proposition 7), times the rounds, converted as Opacus does.
    orders = np.array(privacy.orders(), dtype=float)
    expected = _balle_epsilon(rounds * orders / (2 * sigma**2), orders, delta)
    assert privacy.epsilon(sigma, 1.0, rounds, delta) == pytest.approx(expected, rel=1e-12)
    # ... which is tighter than Mironov's original conversion rdp + log(1/delta) / (a - 1).
    mironov = np.min(rounds * orders / (2 * sigma**2) + math.log(1 / delta) / (orders - 1))
    assert privacy.epsilon(sigma, 1.0, rounds, delta) < mironov


def _sampled_gaussian_rdp(q: float, sigma: float, order: int) -> float:
    """Mironov, Talwar, Zhang 2019, Theorem 9 (integer orders): the sampled Gaussian's RDP."""
    i = np.arange(order + 1)
    log_terms = (
        np.log(special.comb(order, i))
        + i * math.log(q)
        + (order - i) * math.log1p(-q)
        + (i * i - i) / (2 * sigma**2)
    )
    return float(special.logsumexp(log_terms) / (order - 1))


@pytest.mark.parametrize(
    ("sigma", "q", "rounds"), [(8.0, 0.1, 30), (2.0, 0.3, 50), (1.1, 0.01, 1000)]
)
def test_sampling_matches_an_independent_integer_order_bound(sigma, q, rounds):
    # Integer orders only (a subset of the accountant's): a bound at least as large, and
    # close, since the best order's neighbours are in the set.
    orders = np.array([a for a in privacy.orders() if float(a).is_integer() and a >= 2], float)
    rdp = np.array([rounds * _sampled_gaussian_rdp(q, sigma, int(a)) for a in orders])
    integer_bound = _balle_epsilon(rdp, orders, 1e-5)
    got = privacy.epsilon(sigma, q, rounds, 1e-5)
    assert got <= integer_bound * (1 + 1e-9)
    assert got == pytest.approx(integer_bound, rel=0.1)


def test_epsilon_is_monotonic_in_every_argument():
    base = dict(noise_multiplier=4.0, sample_rate=0.3, rounds=30, delta=1e-5)
    eps = privacy.epsilon(**base)
    assert privacy.epsilon(**{**base, "noise_multiplier": 6.0}) < eps  # more noise
    assert privacy.epsilon(**{**base, "sample_rate": 0.6}) > eps  # sampled more often
    assert privacy.epsilon(**{**base, "rounds": 60}) > eps  # more rounds
    assert privacy.epsilon(**{**base, "delta": 1e-7}) > eps  # a smaller failure chance
    assert math.isinf(privacy.epsilon(0.0, 0.3, 30))  # no noise, no privacy


def test_the_curve_is_epsilon_after_each_round():
    curve = privacy.epsilon_curve(8.0, 0.3, 12, 1e-5)
    assert curve.shape == (12,)
    expected = [privacy.epsilon(8.0, 0.3, r, 1e-5) for r in range(1, 13)]
    np.testing.assert_allclose(curve, expected, rtol=1e-12)
    assert np.all(np.diff(curve) > 0)
    assert np.all(np.isinf(privacy.epsilon_curve(0.0, 0.3, 3)))


@pytest.mark.parametrize(
    ("target", "q", "rounds"), [(1.0, 0.1, 30), (1.0, 1.0, 30), (3.0, 0.3, 30), (0.5, 0.05, 100)]
)
def test_noise_for_epsilon_spends_just_under_the_target(target, q, rounds):
    sigma = privacy.noise_for_epsilon(target, q, rounds, 1e-5)
    spent = privacy.epsilon(sigma, q, rounds, 1e-5)
    assert target - 0.01 <= spent <= target
    assert privacy.noise_for_epsilon(target / 2, q, rounds, 1e-5) > sigma


@pytest.mark.parametrize(
    "call",
    [
        lambda: privacy.epsilon(-1.0, 0.3, 30),
        lambda: privacy.epsilon(math.nan, 0.3, 30),
        lambda: privacy.epsilon(1.0, 0.0, 30),
        lambda: privacy.epsilon(1.0, 1.5, 30),
        lambda: privacy.epsilon(1.0, 0.3, 0),
        lambda: privacy.epsilon(1.0, 0.3, 2.5),
        lambda: privacy.epsilon(1.0, 0.3, 30, delta=0.0),
        lambda: privacy.epsilon(1.0, 0.3, 30, delta=1.0),
        lambda: privacy.epsilon_curve(1.0, 0.3, -3),
        lambda: privacy.noise_for_epsilon(0.0, 0.3, 30),
        lambda: privacy.noise_for_epsilon(math.inf, 0.3, 30),
        lambda: privacy.noise_for_epsilon(1.0, 0.3, 30, tolerance=2.0),
        lambda: privacy.noise_for_epsilon(1.0, 0.0, 30),
    ],
)
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()
