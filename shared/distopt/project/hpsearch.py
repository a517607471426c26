"""Hyperparameter search on a small proxy: random search with successive halving, and the
width sweep that shows why μP lets the result carry over to a wider model.

* Random search (Bergstra & Bengio 2012): draw the peak learning rate and the weight decay
  log-uniformly; with few trials it covers each important axis better than a grid.
* Successive halving (Jamieson & Talwalkar 2016; the inner loop of Hyperband, Li et al. 2018):
  train all candidates on a small budget, keep the best ``1/eta``, give them ``eta`` times the
  budget, repeat until one is left. Bad settings are stopped early, so most of the compute
  goes to the promising ones. Here each rung retrains its survivors from scratch with the
  longer budget, so every loss comes from a complete warm-up + cosine schedule.
* Width sweep: the final loss over (width, learning rate) under the standard
  parameterisation and under μP (Yang et al. 2022, Tensor Programs V, Fig. 1): under the
  former the best rate falls as the model widens, under μP it stays put.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from distopt.project.loop import TrainConfig, train

__all__ = [
    "SearchResult",
    "promote",
    "random_candidates",
    "successive_halving",
    "proxy_loss",
    "width_sweep",
]


def promote(losses: Sequence[float], eta: int) -> list[int]:
    """Indices of the candidates that go on to the next rung, best (lowest loss) first.

    Keeps ``max(1, len(losses) // eta)`` of them; a loss that is not finite (a diverged run)
    counts as worse than any finite one; ties keep the earlier candidate first.
    """
    if eta < 2:
        raise ValueError(f"eta must be >= 2, got {eta!r}")
    if not losses:
        raise ValueError("no candidates")
    keep = max(1, len(losses) // eta)
    key = [(0, x) if math.isfinite(x) else (1, 0.0) for x in losses]
    return sorted(range(len(losses)), key=lambda i: key[i])[:keep]


def random_candidates(
    num: int,
    *,
    lr_range: tuple[float, float] = (1e-4, 1e-1),
    weight_decay_range: tuple[float, float] = (1e-3, 1.0),
    seed: int = 0,
) -> list[dict[str, float]]:
    """``num`` settings ``{"peak_lr": ..., "weight_decay": ...}``, each log-uniform."""
    if num < 1:
        raise ValueError(f"num must be >= 1, got {num}")
    for low, high in (lr_range, weight_decay_range):
        if not 0 < low < high:
            raise ValueError(f"a range must satisfy 0 < low < high, got {(low, high)}")
    rng = np.random.default_rng(seed)

    def draw(low: float, high: float) -> float:
        return float(np.exp(rng.uniform(np.log(low), np.log(high))))

    return [
        {"peak_lr": draw(*lr_range), "weight_decay": draw(*weight_decay_range)} for _ in range(num)
    ]


@dataclass
class SearchResult:
    """What successive halving did."""

    candidates: list[dict[str, float]]
    rungs: list[dict]  # per rung: {"steps": int, "ids": [candidate index], "losses": [float]}

    @property
    def best(self) -> dict[str, float]:
        last = self.rungs[-1]
        return self.candidates[last["ids"][promote(last["losses"], 2)[0]]]


def successive_halving(
    candidates: Sequence[dict[str, float]],
    evaluate: Callable[[dict[str, float], int], float],
    *,
    min_steps: int,
    eta: int = 3,
    processes: int | None = 1,
) -> SearchResult:
    """Run successive halving; ``evaluate(candidate, steps)`` returns a loss to minimise.

    Rung r trains the survivors for ``min_steps * eta**r`` steps; it stops when one
    candidate is left (it has then been evaluated on the largest budget). ``processes``: as
    :func:`width_sweep`'s (a rung's candidates share the cores).
    """
    if min_steps < 1:
        raise ValueError(f"min_steps must be >= 1, got {min_steps}")
    ids = list(range(len(candidates)))
    rungs = []
    steps = min_steps
    while True:
        losses = _each([(candidates[i], steps) for i in ids], lambda job: evaluate(*job), processes)
        rungs.append({"steps": steps, "ids": list(ids), "losses": losses})
        if len(ids) == 1:
            return SearchResult(list(candidates), rungs)
        ids = [ids[j] for j in promote(losses, eta)]
        steps *= eta


def proxy_loss(base: TrainConfig) -> Callable[[dict[str, float], int], float]:
    """An ``evaluate`` for :func:`successive_halving`: train ``base`` with the candidate's
    values for ``steps`` steps (warm-up 10 %), return the final validation loss (nats)."""

    def evaluate(candidate: dict[str, float], steps: int) -> float:
        return _final_val_loss(replace(
            base, **candidate, steps=steps, warmup_steps=max(1, steps // 10), eval_every=steps
        ))  # fmt: skip

    return evaluate


def width_sweep(
    base: TrainConfig,
    widths: Sequence[int],
    lrs: Sequence[float],
    *,
    mup: bool,
    processes: int | None = 1,
) -> np.ndarray:
    """Final validation loss (nats) for each width and peak rate: array (len(widths), len(lrs)).

    ``mup``: μP with base width ``widths[0]``; else the standard parameterisation. A run that
    diverges scores ``inf``. ``processes``: 1 trains the runs here, one after another; None
    (or a number) shares them among processes, one per core (:func:`distopt.launch_map`),
    with the same losses where this process trains with one torch thread.
    """
    configs = [
        replace(base, model=replace(base.model, d_model=width,
                                    mup_base_width=widths[0] if mup else None),
                peak_lr=lr, eval_every=base.steps)
        for width in widths for lr in lrs
    ]  # fmt: skip
    losses = _each(configs, _final_val_loss, processes)
    return np.array(losses, dtype=float).reshape(len(widths), len(lrs))


def _each(jobs: list, run: Callable, processes: int | None) -> list:
    """``[run(job) for job in jobs]``: here if ``processes == 1``, else shared among processes."""
    if processes == 1:
        return [run(job) for job in jobs]
    from distopt.engine.launcher import launch_map

    return launch_map(run, jobs, processes=processes)


def _final_val_loss(config: TrainConfig) -> float:
    """The run's last validation loss, or inf if it stopped early (diverged)."""
    history = train(config)[1]
    finished = history["val_loss"] and len(history["step"]) == config.steps
    return history["val_loss"][-1] if finished else math.inf
