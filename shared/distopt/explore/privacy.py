"""Section 06's privacy explorer: noise, clients per round and rounds against epsilon and loss.

The run is the notebook's DP-FedAvg: the population of 100 heterogeneous clients
(``make_problem(seed=6, num_clients=100, examples_per_client=50, shift_std=2.0,
label_skew=0.5)``), 5 local steps, updates clipped to norm 0.3 and the sum noised by the
private mean (the student's ``private_mean`` where it is written, else
:func:`distopt.sim.federated.dp_mean`). As every DP number of the notebook, it is shown over
``dp_draws.DRAWS`` draws of the noise (generators seeded 0, 1, ...; the client samples and
minibatches are the fresh problem's in every draw), all trained at once by
:func:`distopt.sim.dp_draws.run_fedavg_draws`: the readout gives the final loss's mean and
range, the figure the mean curve in a band from the lowest to the highest draw. The whole
set takes well under a second, so every move runs it live; the non-private run it is compared
with is cached per (clients, rounds). The epsilon is :func:`distopt.costs.privacy.epsilon`,
Opacus's RDP bound for Poisson sampling at q = clients / 100 (the simulator picks exactly that
many clients, the usual approximation).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import ipywidgets as widgets
import numpy as np
from matplotlib.figure import Figure

from distopt.costs import privacy
from distopt.explore.panel import Answer, Panel, View
from distopt.sim import dp_draws, federated

DEFAULTS: dict[str, object] = {"noise_multiplier": 8.0, "clients_per_round": 30, "rounds": 30}
POPULATION = dict(num_clients=100, examples_per_client=50, shift_std=2.0, label_skew=0.5)
SEED, LOCAL_STEPS, CLIP_NORM, DELTA = 6, 5, 0.3, 1e-5
CLIENT_CHOICES = (3, 10, 30, 60, 100)
MAX_ROUNDS, MAX_NOISE = 60, 100.0


def _problem() -> federated.FederatedProblem:
    return federated.make_problem(seed=SEED, **POPULATION)


@functools.lru_cache(maxsize=1)
def best_loss() -> float:
    """The lowest global loss of the population (the pooled data's minimizer)."""
    problem = _problem()
    return federated.global_loss(problem, federated.minimize_global_loss(problem))


@functools.lru_cache(maxsize=32)
def plain_losses(clients_per_round: int, rounds: int) -> tuple[float, ...]:
    """Global loss after each round of FedAvg without clipping or noise (cached)."""
    run = federated.run_federated(
        _problem(), local_steps=LOCAL_STEPS, rounds=rounds, clients_per_round=clients_per_round
    )
    return tuple(float(x) for x in run.loss)


def private_runs(
    noise_multiplier: float,
    clients_per_round: int,
    rounds: int,
    *,
    private_mean: Callable | None = None,
) -> dp_draws.DrawsRun:
    """The notebook's DP-FedAvg runs: a fresh problem, one run per noise draw (seeds 0, 1,
    ...; without noise every draw is the same, so one run)."""
    draws = dp_draws.DRAWS if noise_multiplier > 0 else 1
    aggregates = dp_draws.noise_draws(
        federated.dp_mean if private_mean is None else private_mean,
        clip_norm=CLIP_NORM,
        noise_multiplier=noise_multiplier,
        draws=draws,
    )
    return dp_draws.run_fedavg_draws(
        _problem(),
        aggregates=aggregates,
        local_steps=LOCAL_STEPS,
        rounds=rounds,
        clients_per_round=clients_per_round,
    )


def _settings(settings: dict) -> tuple[float, int, int]:
    sigma = float(settings["noise_multiplier"])
    clients, rounds = settings["clients_per_round"], settings["rounds"]
    if not (math.isfinite(sigma) and 0 <= sigma <= MAX_NOISE):
        raise ValueError(f"the noise multiplier must be between 0 and {MAX_NOISE:g}, got {sigma}")
    total = POPULATION["num_clients"]
    if isinstance(clients, bool) or int(clients) != clients or not 1 <= clients <= total:
        raise ValueError(f"clients per round must be a whole number from 1 to {total}")
    if isinstance(rounds, bool) or int(rounds) != rounds or not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"rounds must be a whole number from 1 to {MAX_ROUNDS}, got {rounds}")
    return sigma, int(clients), int(rounds)


def _eps(value: float) -> str:
    return "inf (no noise: no privacy)" if math.isinf(value) else f"{value:.3f}"


def view(settings: dict, *, private_mean: Callable | None = None) -> View:
    """epsilon from the accountant, the private run's loss against the non-private one."""
    sigma, clients, rounds = _settings(settings)
    total = POPULATION["num_clients"]
    rate = clients / total
    curve = privacy.epsilon_curve(sigma, rate, rounds, DELTA)
    runs = private_runs(sigma, clients, rounds, private_mean=private_mean)
    final = runs.loss[:, -1]
    if len(final) > 1:
        private = (
            f"{final.mean():.3f} on average over {len(final)} noise draws "
            f"(lowest {final.min():.3f}, highest {final.max():.3f})"
        )
        label = f"DP-FedAvg, σ = {sigma:g}: mean of {len(final)} draws (band: their range)"
    else:
        private = f"{final[0]:.3f} (no noise: one run)"
        label = "DP-FedAvg, σ = 0 (clipping only)"
    plain = np.array(plain_losses(clients, rounds))
    best = best_loss()
    lines = [
        f"epsilon = {_eps(curve[-1])} at delta = {DELTA:g} after {rounds} rounds "
        f"(Opacus RDP bound, Poisson sampling at q = {clients}/{total} = {rate:.2f})",
        f"noise multiplier {sigma:g}, clip norm {CLIP_NORM:g}: noise std in the averaged "
        f"update {sigma * CLIP_NORM / clients:.4f} per coordinate",
        f"DP-FedAvg, {clients} clients per round, {rounds} rounds: global loss {private}",
        f"FedAvg without clipping or noise, same clients and rounds: global loss {plain[-1]:.3f}",
        f"cost of clipping and noise {final.mean() - plain[-1]:+.3f} nats per example on "
        f"average (best possible loss {best:.3f})",
    ]
    fig = Figure(figsize=(9, 4.4), layout="constrained")
    ax, ax_eps = fig.subplots(1, 2)
    axis = np.arange(1, rounds + 1)
    ax.plot(axis, plain, label="FedAvg, no clipping or noise")
    mean = runs.loss.mean(axis=0)
    (line,) = ax.plot(axis, mean, label=label)
    if len(final) > 1:
        low, high = runs.loss.min(axis=0), runs.loss.max(axis=0)
        ax.fill_between(axis, low, high, color=line.get_color(), alpha=0.25, linewidth=0)
    ax.axhline(best, color="black", linestyle="--", label="best possible")
    ax.set(
        xlabel="communication round",
        ylabel="global loss (nats per example)",
        title=f"{clients} of {total} clients per round",
    )
    # below the axes: a wide noise band reaches every corner of the plot
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    if math.isinf(curve[-1]):
        ax_eps.text(
            0.5,
            0.5,
            "no noise: epsilon is infinite",
            ha="center",
            va="center",
            transform=ax_eps.transAxes,
        )
    else:
        ax_eps.plot(axis, curve, color="tab:red")
    ax_eps.set(
        xlabel="communication round",
        ylabel=f"epsilon at delta = {DELTA:g}",
        title="privacy spent so far (RDP accountant)",
        ylim=(0, None),
    )
    return View(lines, fig)


def explorer(private_mean: Callable | None = None) -> Panel:
    """The panel; ``private_mean`` is the student's answer to section 7's exercise, "clip and
    add noise" (None: the package's :func:`distopt.sim.federated.dp_mean`)."""
    style = {"description_width": "initial"}
    controls = {
        "noise_multiplier": widgets.BoundedFloatText(
            value=DEFAULTS["noise_multiplier"],
            min=0.0,
            max=MAX_NOISE,
            step=0.5,
            description="noise multiplier σ",
            style=style,
        ),
        "clients_per_round": widgets.ToggleButtons(
            options=[(str(m), m) for m in CLIENT_CHOICES],
            value=DEFAULTS["clients_per_round"],
            description="clients per round (of 100)",
            style=style,
        ),
        "rounds": widgets.BoundedIntText(
            value=DEFAULTS["rounds"],
            min=1,
            max=MAX_ROUNDS,
            description="rounds",
            style=style,
        ),
    }
    answer = Answer(
        "private_mean", private_mean, federated.dp_mean, "distopt.sim.federated.dp_mean"
    )
    return Panel(
        "privacy",
        "DP-FedAvg: noise, clients per round and rounds against epsilon and loss",
        controls,
        lambda s: view(s, private_mean=answer),
        answers=(answer,),
    )
