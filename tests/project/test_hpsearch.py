"""distopt.project.hpsearch: promotion rule, random candidates, successive halving, width sweep."""

import math
from dataclasses import replace

import numpy as np
import pytest

from distopt.project.gpt import GPTConfig
from distopt.project.hpsearch import (
    promote,
    proxy_loss,
    random_candidates,
    successive_halving,
    width_sweep,
)
from distopt.project.loop import TrainConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_promote_keeps_the_best_third_and_ranks_nan_last():
    assert promote([3.0, 1.0, 2.0, 0.5, 5.0, 4.0], 3) == [3, 1]
    assert promote([math.nan, 2.0, math.inf, 1.0], 2) == [3, 1]
    assert promote([2.0, 1.0], 3) == [1]  # at least one goes on
    with pytest.raises(ValueError):
        promote([1.0], 1)


def test_random_candidates_are_log_uniform_in_range():
    cands = random_candidates(400, lr_range=(1e-4, 1e-1), seed=1)
    lrs = np.array([c["peak_lr"] for c in cands])
    assert lrs.min() >= 1e-4 and lrs.max() <= 1e-1
    assert abs(np.median(np.log10(lrs)) + 2.5) < 0.2  # the log-midpoint
    assert cands == random_candidates(400, lr_range=(1e-4, 1e-1), seed=1)


def test_successive_halving_budgets_and_winner():
    calls = []

    def evaluate(candidate, steps):
        calls.append(steps)
        return (math.log10(candidate["peak_lr"]) + 2) ** 2 + 1 / steps

    cands = [{"peak_lr": 10.0**e, "weight_decay": 0.1} for e in np.linspace(-4, 0, 9)]
    result = successive_halving(cands, evaluate, min_steps=10, eta=3)
    assert [r["steps"] for r in result.rungs] == [10, 30, 90]
    assert [len(r["ids"]) for r in result.rungs] == [9, 3, 1]
    assert calls == [10] * 9 + [30] * 3 + [90]
    assert result.best["peak_lr"] == pytest.approx(1e-2)
    shared = successive_halving(cands, evaluate, min_steps=10, eta=3, processes=2)
    assert shared.rungs == result.rungs  # each rung's candidates shared among two processes


TINY = TrainConfig(
    model=GPTConfig(vocab_size=8, seq_len=8, n_layer=1, n_head=2, d_model=8),
    order=1,
    branching=2,
    train_tokens=2048,
    batch_size=4,
    steps=6,
    warmup_steps=1,
    eval_batches=1,
)


def test_proxy_loss_and_width_sweep_run():
    loss = proxy_loss(TINY)({"peak_lr": 1e-2, "weight_decay": 0.1}, 5)
    assert 0 < loss < math.log(8) + 0.5
    grid = width_sweep(TINY, [8, 16], [1e-3, 1e-2], mup=True)
    assert grid.shape == (2, 2) and np.isfinite(grid).all()
    assert width_sweep(replace(TINY, clip_norm=None), [8], [1e30], mup=False)[0, 0] == math.inf


def test_a_width_sweep_shared_among_processes_gives_the_same_losses(one_torch_thread):
    """One process per core, each with one torch thread: the grid of one process, bit for bit
    (the diverged run's inf included)."""
    widths, lrs = [8, 16], [1e-3, 1e-2, 1e30]
    config = replace(TINY, clip_norm=None)
    here = width_sweep(config, widths, lrs, mup=False)
    shared = width_sweep(config, widths, lrs, mup=False, processes=2)
    assert np.array_equal(here, shared), f"one process {here.tolist()}, two {shared.tolist()}"
    assert math.isinf(here[0, 2]) and np.isfinite(here[:, :2]).all()
