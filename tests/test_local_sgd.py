"""Tests of distopt.local_sgd: numpy local SGD / DiLoCo, and the real multi-process runs
against the single-process baseline."""

import numpy as np
import pytest
import torch

from distopt import launch
from distopt.least_squares import make_least_squares
from distopt.local_sgd import (
    LocalSGDConfig,
    nesterov_outer_step,
    simulate_local_sgd,
    train_local_sgd_single_process,
    train_local_sgd_variants,
)

# float32: the all-reduce sums in another order than the single process's mean.
TOLERANCE = 1e-6
CONFIGS = [
    LocalSGDConfig(variant="ddp", num_steps=8, local_steps=1),
    LocalSGDConfig(variant="local", num_steps=8, local_steps=4),
    LocalSGDConfig(variant="diloco", num_steps=8, local_steps=4, lr=0.01),
]


def test_nesterov_outer_step_matches_torch():
    rng = np.random.default_rng(0)
    params, velocity = rng.standard_normal(5), np.zeros(5)
    tensor = torch.tensor(params, requires_grad=True)
    optimizer = torch.optim.SGD([tensor], lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(3):
        grad = rng.standard_normal(5)
        params, velocity = nesterov_outer_step(params, grad, velocity, lr=0.7, momentum=0.9)
        tensor.grad = torch.tensor(grad)
        optimizer.step()
    assert np.allclose(params, tensor.detach().numpy(), atol=1e-12)


def test_local_sgd_with_one_local_step_is_minibatch_sgd_and_bytes_are_counted():
    shards = make_least_squares(256, 4, seed=0).shards(4)
    run = simulate_local_sgd(shards, num_rounds=5, local_steps=1, lr=0.1)
    rng = np.random.default_rng(0)
    w = np.zeros(4)
    for _ in range(5):
        rows = rng.integers(0, 64, (4, 8))
        w = w - 0.1 * np.mean([s.grad(w, rows[i]) for i, s in enumerate(shards)], axis=0)
    full = make_least_squares(256, 4, seed=0)
    assert abs(run.excess_loss[-1] - (full.loss(w) - full.loss(full.minimum()))) < 1e-12
    # Ring all-reduce of 4 float32 values on 4 workers: 2 * 3/4 * 16 bytes per round.
    assert run.bytes_sent.tolist() == [0, 24, 48, 72, 96, 120]
    diloco = simulate_local_sgd(
        shards,
        num_rounds=20,
        local_steps=10,
        lr=0.01,
        inner="adam",
        outer_lr=0.7,
        outer_momentum=0.9,
    )
    assert diloco.excess_loss[-1] < 0.05 * diloco.excess_loss[0]


@pytest.fixture(scope="module")
def per_rank():
    """One launch on 2 ranks for all variants (spawning is slow)."""
    return launch(train_local_sgd_variants, 2, CONFIGS)


def test_multi_process_runs_match_the_single_process_baseline(per_rank):
    for index, config in enumerate(CONFIGS):
        reference = train_local_sgd_single_process(config, 2)
        for report in (per_rank[0][index], per_rank[1][index]):
            for got, expected in zip(report["weights"], reference["weights"], strict=True):
                assert np.abs(got - expected).max() < TOLERANCE, config.variant
            assert abs(report["loss"] - reference["loss"]) < 1e-5


def test_bytes_all_reduced_are_ddp_divided_by_h(per_rank):
    param_bytes = 4 * sum(p.size for p in per_rank[0][0]["weights"])
    ddp, local, diloco = per_rank[0]
    assert ddp["bytes_all_reduced"] == 8 * param_bytes
    assert local["bytes_all_reduced"] == diloco["bytes_all_reduced"] == 2 * param_bytes
    assert local["num_all_reduces"] == 2


def test_bad_config():
    with pytest.raises(ValueError, match="multiple"):
        train_local_sgd_single_process(LocalSGDConfig(num_steps=10, local_steps=4), 2)
