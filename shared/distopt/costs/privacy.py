"""The privacy DP-FedAvg buys: (epsilon, delta) from Opacus's RDP accountant.

One round of DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent
Language Models") is a *sampled Gaussian mechanism*: each client takes part with probability
q (the sample rate), its clipped update moves the sum by at most S, and Gaussian noise of std
sigma * S is added to the sum (sigma, the noise multiplier). The Renyi-DP of that mechanism,
composed over the rounds and converted to (epsilon, delta)-DP, is what a privacy accountant
tracks (Mironov 2017, "Renyi Differential Privacy"; Mironov, Talwar, Zhang 2019, "Renyi
Differential Privacy of the Sampled Gaussian Mechanism"). Nothing here re-derives it: every
number comes from Opacus's maintained ``RDPAccountant`` (its ``compute_rdp`` and
``get_privacy_spent``, which converts with Balle et al. 2020, "Hypothesis Testing
Interpretations and Renyi Differential Privacy", Theorem 21).

What the bound assumes: each client joins a round independently with probability q (Poisson
sampling) and the protected unit is a whole client (add or remove one client's data). A
simulator that picks exactly m of N clients per round is accounted at q = m / N, the usual
approximation. The RDP orders searched are Opacus's defaults (1.1 to 63) plus five larger
ones up to 256, so that a large noise multiplier, whose best order is above 63, still gets a
tight bound.

Opacus (and with it torch) is imported on the first call, not with this module: it takes
a few seconds, which a notebook that imports the module at the top but never asks for a
privacy figure should not pay. The rest of :mod:`distopt.costs` is plain Python.
"""

from __future__ import annotations

import functools
import math

import numpy as np

_LARGER_ORDERS = (80, 96, 128, 192, 256)  # for a large noise multiplier (see above)


@functools.cache
def orders() -> tuple[float, ...]:
    """The RDP orders every figure here is searched over: Opacus's defaults, then larger ones."""
    from opacus.accountants import RDPAccountant

    return tuple(RDPAccountant.DEFAULT_ALPHAS) + _LARGER_ORDERS


def _check(noise_multiplier: float, sample_rate: float, rounds: int, delta: float) -> None:
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 1:
        raise ValueError(f"rounds must be a whole number >= 1, got {rounds}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def epsilon(noise_multiplier: float, sample_rate: float, rounds: int, delta: float = 1e-5) -> float:
    """The epsilon of ``rounds`` rounds of the sampled Gaussian mechanism, at ``delta``.

    noise_multiplier -- sigma: noise std / clip norm (0 means no noise: epsilon is inf)
    sample_rate      -- q in (0, 1]: each client's chance of taking part in a round
    rounds           -- how many rounds were run (the mechanism's steps)
    delta            -- the delta of the (epsilon, delta) guarantee

    Opacus's ``RDPAccountant`` with the history [(sigma, q, rounds)], orders ``orders()``.
    """
    _check(noise_multiplier, sample_rate, rounds, delta)
    if noise_multiplier == 0:
        return math.inf
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(float(noise_multiplier), float(sample_rate), int(rounds))]
    return float(accountant.get_epsilon(delta=delta, alphas=list(orders())))


def epsilon_curve(
    noise_multiplier: float, sample_rate: float, rounds: int, delta: float = 1e-5
) -> np.ndarray:
    """epsilon after 1, 2, ..., ``rounds`` rounds, shape (rounds,); entry r - 1 is
    ``epsilon(noise_multiplier, sample_rate, r, delta)``.

    The per-round RDP is computed once with Opacus's ``compute_rdp`` (RDP composes by
    addition, so r rounds have r times it, as the accountant adds its history) and each
    total is converted by Opacus's ``get_privacy_spent``.
    """
    _check(noise_multiplier, sample_rate, rounds, delta)
    if noise_multiplier == 0:
        return np.full(int(rounds), math.inf)
    from opacus.accountants.analysis import rdp as rdp_analysis

    searched = list(orders())
    per_round = np.asarray(
        rdp_analysis.compute_rdp(
            q=float(sample_rate), noise_multiplier=float(noise_multiplier), steps=1, orders=searched
        )
    )
    totals = [r * per_round for r in range(1, int(rounds) + 1)]  # RDP adds up over rounds
    spent = rdp_analysis.get_privacy_spent
    return np.array([float(spent(orders=searched, rdp=t, delta=delta)[0]) for t in totals])


def noise_for_epsilon(
    target_epsilon: float,
    sample_rate: float,
    rounds: int,
    delta: float = 1e-5,
    *,
    tolerance: float = 0.01,
) -> float:
    """The noise multiplier that spends at most ``target_epsilon`` in ``rounds`` rounds.

    Opacus's ``get_noise_multiplier`` (a bisection on the RDP accountant, orders ``orders()``):
    the returned sigma has ``target_epsilon - tolerance <= epsilon(sigma, ...) <=
    target_epsilon``.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be a finite number > 0, got {target_epsilon}")
    if not 0 < tolerance < target_epsilon:
        raise ValueError(f"tolerance must be in (0, target_epsilon), got {tolerance}")
    _check(1.0, sample_rate, rounds, delta)
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=float(target_epsilon),
            target_delta=float(delta),
            sample_rate=float(sample_rate),
            steps=int(rounds),
            accountant="rdp",
            epsilon_tolerance=float(tolerance),
            alphas=list(orders()),
        )
    )
