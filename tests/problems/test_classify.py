"""Tests of distopt.problems.classify: the seeded toy problem, its batches, its training loop
and the guarded loop that skips and rolls back bad batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distopt.optim import stability
from distopt.problems import classify, guarded


@pytest.fixture(scope="module")
def data():
    return classify.make_classification_data(1024, 256, num_features=6, num_classes=3, seed=1)


def test_data_is_seeded_and_shaped(data):
    assert data.train_x.shape == (1024, 6) and data.test_y.shape == (256,)
    assert data.num_classes == 3
    again = classify.make_classification_data(1024, 256, num_features=6, num_classes=3, seed=1)
    assert torch.equal(data.train_x, again.train_x) and torch.equal(data.train_y, again.train_y)


def test_batches_cover_each_epoch_without_repeats():
    batches = list(classify.batch_indices(10, 3, 7, seed=0))
    assert len(batches) == 7 and all(len(b) == 3 for b in batches)
    for epoch in (batches[0:3], batches[3:6]):
        flat = np.concatenate(epoch)
        assert len(set(flat.tolist())) == 9
    with pytest.raises(ValueError):
        next(classify.batch_indices(10, 11, 1))


def test_training_learns_and_repeats_exactly(data):
    def run():
        model = classify.make_mlp(6, 3, hidden=16, seed=2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return classify.train(
            model, opt, data, batch_size=64, num_steps=80, eval_every_examples=1024
        )

    first, second = run(), run()
    assert first.test_loss == second.test_loss and first.train_loss == second.train_loss
    assert first.test_loss[-1] < 0.8 * first.test_loss[0]
    assert first.examples_seen == [0, 1024, 2048, 3072, 4096, 5120]
    assert not first.diverged


def test_divergence_is_reported(data):
    model = classify.make_mlp(6, 3, hidden=16)
    opt = torch.optim.SGD(model.parameters(), lr=1e6)
    history = classify.train(model, opt, data, batch_size=256, num_steps=20)
    assert history.diverged and history.final_test_loss == float("inf")


def test_guard_protects_against_bad_batches():
    data = classify.make_classification_data(2048, 512, num_features=6, num_classes=3)
    bad = guarded.bad_batches([40, 70, 71, 72], feature_scale=5.0, num_classes=3)

    def run(monitor):
        model = classify.make_mlp(6, 3, hidden=16)
        opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
        history = guarded.train_guarded(
            model, opt, data, batch_size=64, num_steps=100, lr_at=lambda s: 0.2,
            monitor=monitor, corrupt=bad, checkpoint_every=10,
        )  # fmt: skip
        return history, classify.evaluate(model, data.test_x, data.test_y)[0]

    plain, plain_loss = run(None)
    watched, guarded_loss = run(stability.SpikeMonitor())
    assert plain.events == []
    assert watched.events == [(40, "skip"), (70, "skip"), (71, "skip"), (72, "rollback")]
    assert watched.rolled_back_to == [69]
    assert watched.rollback_shift == [0.0]  # the skipped steps had left the weights alone
    assert watched.lr[-1] == pytest.approx(0.1)
    assert guarded_loss < plain_loss


def test_steps_to_loss_counts_to_the_target_and_gives_up(data):
    def steps(lr, target, max_steps=200):
        model = classify.make_mlp(6, 3, hidden=16, seed=2)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        return classify.steps_to_loss(
            model, opt, data, batch_size=64, target_loss=target, max_steps=max_steps,
            eval_every_examples=128,
        )  # fmt: skip

    start = classify.evaluate(classify.make_mlp(6, 3, hidden=16, seed=2), data.test_x, data.test_y)
    reached = steps(0.1, 0.8 * start[0])
    assert reached is not None and reached % 2 == 0  # measured every 128 // 64 = 2 steps
    assert steps(0.1, 0.8 * start[0]) == reached  # seeded: the same count again
    assert steps(0.1, 0.8 * start[0], max_steps=reached - 1) is None
    assert steps(0.1, 0.0) is None  # a loss of zero is out of reach
    assert steps(1e6, 0.8 * start[0]) is None  # diverges


def test_dead_units_counts_relus_that_never_fire():
    model = classify.make_mlp(3, 2, hidden=4, depth=2)
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model[0].bias[:2] = -1e3  # two units of the first ReLU never fire
        model[2].weight[1:] = 0.0
        model[2].bias[1:] = -1.0  # three of the second never fire
        model[2].weight[0] = 0.0
        model[2].bias[0] = 1.0  # and the fourth always does
    assert classify.dead_units(model, x) == [2, 3]


def test_rollback_undoes_a_bad_update(data):
    """One step at 100 times the rate damages the weights; skipping alone cannot undo it."""

    def run(monitor):
        model = classify.make_mlp(6, 3, hidden=16)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        history = guarded.train_guarded(
            model, opt, data, batch_size=64, num_steps=60, monitor=monitor,
            lr_at=lambda s: 5.0 if s == 40 else 0.05, checkpoint_every=10,
        )  # fmt: skip
        return history, classify.evaluate(model, data.test_x, data.test_y)[0]

    skipping, skipping_loss = run(stability.SpikeMonitor(max_spikes=10**9))
    watched, guarded_loss = run(stability.SpikeMonitor())
    assert watched.rolled_back_to == [39] and watched.rollback_shift[0] > 0.1
    assert len(skipping.steps("skip")) > 10 and guarded_loss < skipping_loss


@pytest.mark.parametrize("depth", [1, 3])
def test_gradient_noise_equals_the_per_example_gradients(data, depth):
    """Per-example norms from one backward equal B_simple of the explicit per-example gradients."""
    from distopt.costs import critical_batch

    model = classify.make_mlp(6, 3, hidden=8, depth=depth, seed=4)
    x, y = data.train_x[:50], data.train_y[:50]
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double().numpy())
    per_example = np.stack(rows)
    got = classify.gradient_noise(model, x, y)
    mean = per_example.mean(axis=0)
    assert got["grad_sq"] == pytest.approx(float(mean @ mean), rel=1e-5)
    assert got["noise_scale"] == pytest.approx(
        critical_batch.simple_noise_scale(per_example), rel=1e-4
    )
    assert got["trace_sigma"] == pytest.approx(got["noise_scale"] * got["grad_sq"], rel=1e-12)
    with pytest.raises(ValueError):
        classify.gradient_noise(model, x[:1], y[:1])
    with pytest.raises(TypeError):
        classify.gradient_noise(torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.Tanh()), x, y)
