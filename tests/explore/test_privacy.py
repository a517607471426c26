"""Section 06's privacy explorer: epsilon from the accountant, the live DP-FedAvg runs."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from matplotlib.figure import Figure
from opacus.accountants import RDPAccountant

from distopt.explore import privacy
from distopt.explore.panel import PROMPT
from distopt.sim import dp_draws, federated

POPULATION = dict(num_clients=100, examples_per_client=50, shift_std=2.0, label_skew=0.5)


def _dp_losses(sigma, clients, rounds, mean=federated.dp_mean, draws=dp_draws.DRAWS):
    """The notebook's DP runs written out one by one: a fresh problem for each draw, the
    noise of draw d from np.random.default_rng(d); shape (draws, rounds)."""
    runs = []
    for draw in range(draws):
        noise = np.random.default_rng(draw)
        aggregate = functools.partial(mean, clip_norm=0.3, noise_multiplier=sigma, rng=noise)
        runs.append(
            federated.run_federated(
                federated.make_problem(seed=6, **POPULATION),
                local_steps=5,
                rounds=rounds,
                clients_per_round=clients,
                aggregate=aggregate,
            ).loss
        )
    return np.array(runs)


def _shown(losses):
    final = losses[:, -1]
    return (
        f"global loss {final.mean():.3f} on average over {len(final)} noise draws "
        f"(lowest {final.min():.3f}, highest {final.max():.3f})"
    )


def _plain_loss(clients, rounds):
    p = federated.make_problem(seed=6, **POPULATION)
    return federated.run_federated(p, local_steps=5, rounds=rounds, clients_per_round=clients).loss


def test_the_notebooks_default_sigma_8_with_30_of_100_clients():
    shown = privacy.view(privacy.DEFAULTS)
    accountant = RDPAccountant()  # opacus directly, with its own default orders
    accountant.history = [(8.0, 0.3, 30)]
    assert f"epsilon = {accountant.get_epsilon(delta=1e-5):.3f} at delta = 1e-05" in shown.lines[0]
    assert "epsilon = 0.849" in shown.lines[0] and "q = 30/100 = 0.30" in shown.lines[0]
    assert "update 0.0800 per coordinate" in shown.lines[1]  # 8 * 0.3 / 30
    # the notebook's table (and the reviewers' own ten draws): sigma 8, 30 clients per round
    assert shown.lines[2].endswith(
        "global loss 0.364 on average over 10 noise draws (lowest 0.308, highest 0.445)"
    )
    runs = dp_draws.run_fedavg_draws(
        federated.make_problem(seed=6, **POPULATION),
        aggregates=dp_draws.noise_draws(clip_norm=0.3, noise_multiplier=8.0),
        local_steps=5,
        rounds=30,
        clients_per_round=30,
    )
    plain = _plain_loss(30, 30)[-1]
    assert shown.lines[3].endswith(f"global loss {plain:.3f}")
    assert f"{runs.loss[:, -1].mean() - plain:+.3f} nats" in shown.lines[4]
    assert isinstance(shown.figure, Figure)
    loss_axes, eps_axes = shown.figure.axes
    np.testing.assert_allclose(loss_axes.lines[1].get_ydata(), runs.loss.mean(axis=0))
    (band,) = loss_axes.collections  # the range of the draws, round by round
    edge = band.get_paths()[0].vertices[:, 1]
    assert edge.min() == pytest.approx(runs.loss.min())
    assert edge.max() == pytest.approx(runs.loss.max())
    assert eps_axes.lines[0].get_ydata()[-1] == pytest.approx(0.8491, abs=1e-4)


def test_all_clients_every_round_and_no_noise():
    shown = privacy.view({"noise_multiplier": 8.0, "clients_per_round": 100, "rounds": 10})
    accountant = RDPAccountant()
    accountant.history = [(8.0, 1.0, 10)]
    assert f"epsilon = {accountant.get_epsilon(delta=1e-5):.3f}" in shown.lines[0]
    assert "update 0.0240 per coordinate" in shown.lines[1]
    shown = privacy.view({"noise_multiplier": 8.0, "clients_per_round": 100, "rounds": 3})
    assert shown.lines[2].endswith(_shown(_dp_losses(8.0, 100, 3)))  # ten runs, one by one
    silent = privacy.view({"noise_multiplier": 0.0, "clients_per_round": 10, "rounds": 5})
    assert "epsilon = inf (no noise: no privacy)" in silent.lines[0]
    clip_only = _dp_losses(0.0, 10, 5, draws=1)[0, -1]
    assert silent.lines[2].endswith(f"global loss {clip_only:.3f} (no noise: one run)")
    assert not silent.figure.axes[0].collections  # no noise, no band


@pytest.mark.parametrize(
    "bad",
    [
        {"noise_multiplier": -1.0},
        {"noise_multiplier": float("nan")},
        {"clients_per_round": 0},
        {"clients_per_round": 101},
        {"rounds": 0},
        {"rounds": privacy.MAX_ROUNDS + 1},
    ],
)
def test_settings_the_run_rejects_raise_a_value_error(bad):
    with pytest.raises(ValueError):
        privacy.view({**privacy.DEFAULTS, **bad})


def test_the_panel_starts_at_the_defaults_and_redraws_on_a_move():
    panel = privacy.explorer()
    assert panel.settings() == privacy.DEFAULTS
    assert PROMPT in panel.readout.value and panel.last is None  # nothing computed yet
    panel.controls["clients_per_round"].value = 10
    expected = privacy.view({**privacy.DEFAULTS, "clients_per_round": 10})
    assert panel.last.lines == expected.lines
    assert "epsilon = 0.261" in panel.last.lines[0]
    assert "the package's distopt.sim.federated.dp_mean" in panel.note.value


def _blank(updates, *, clip_norm, noise_multiplier, rng):
    raise NotImplementedError


def _no_clipping(updates, *, clip_norm, noise_multiplier, rng):  # a plausible wrong answer
    noise = rng.normal(0.0, noise_multiplier * clip_norm, updates.shape[1])
    return (updates.sum(axis=0) + noise) / len(updates)


def test_a_blank_exercise_falls_back_and_says_so():
    panel = privacy.explorer(private_mean=_blank)
    panel.controls["rounds"].value = 5
    assert panel.last.lines == privacy.view({**privacy.DEFAULTS, "rounds": 5}).lines
    assert "your private_mean is still blank" in panel.note.value


def test_the_students_function_is_the_one_used():
    panel = privacy.explorer(private_mean=_no_clipping)
    panel.controls["rounds"].value = 5
    expected = _dp_losses(8.0, 30, 5, mean=_no_clipping)
    assert panel.last.lines[2].endswith(_shown(expected))
    assert _shown(expected) != _shown(_dp_losses(8.0, 30, 5))  # it shows
    assert "your private_mean" in panel.note.value
