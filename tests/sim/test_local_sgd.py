"""Tests of distopt.sim.local_sgd: numpy local SGD and DiLoCo, bytes counted."""

import numpy as np
import torch

from distopt.dist.local_sgd_ranks import (
    LocalSGDConfig,
)
from distopt.problems.least_squares import make_least_squares
from distopt.sim.local_sgd import nesterov_outer_step, simulate_local_sgd

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
