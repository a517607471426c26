"""Tests of distopt.sim.local_sgd: numpy local SGD and DiLoCo, bytes counted."""

import numpy as np
import torch

from distopt.problems.least_squares import make_least_squares
from distopt.ranks.local_sgd_ranks import LocalSGDConfig
from distopt.sim.local_sgd import heterogeneous_shards, nesterov_outer_step, simulate_local_sgd

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


def test_heterogeneous_shards_make_fewer_averages_cost_at_equal_compute():
    shards = heterogeneous_shards(8, 128, seed=0)
    assert len(shards) == 8 and shards[0].features.shape == (128, 10)
    # Each shard has its own optimum, away from the others'.
    optima = np.stack([s.minimum() for s in shards])
    assert np.linalg.norm(optima - optima.mean(axis=0), axis=1).min() > 0.3
    # 1000 local steps per worker: averaging every step beats averaging every 100 steps
    # by more than 10x on these shards, while on i.i.d. shards they end alike.
    every_step = simulate_local_sgd(shards, num_rounds=1000, local_steps=1, lr=0.1)
    every_100 = simulate_local_sgd(shards, num_rounds=10, local_steps=100, lr=0.1)
    assert every_100.excess_loss[-1] > 10 * every_step.excess_loss[-1]
    iid = make_least_squares(1024, 10, seed=0).shards(8)
    iid_every_step = simulate_local_sgd(iid, num_rounds=1000, local_steps=1, lr=0.1)
    iid_every_100 = simulate_local_sgd(iid, num_rounds=10, local_steps=100, lr=0.1)
    assert iid_every_100.excess_loss[-1] < 2 * iid_every_step.excess_loss[-1]
    # No shift and no skew: the shards' optima agree up to the target noise.
    alike = np.stack(
        [
            s.minimum()
            for s in heterogeneous_shards(4, 2000, 10, input_shift=0.0, target_skew=0.0, seed=1)
        ]
    )
    assert np.abs(alike - alike.mean(axis=0)).max() < 0.1
