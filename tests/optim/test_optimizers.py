"""Tests of distopt.optim.optimizers: LARS and LAMB against float64 numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distopt.optim import optimizers


def _np_lars(w, g, v, *, lr, momentum, weight_decay, eta):
    wn, gn = np.linalg.norm(w), np.linalg.norm(g)
    ratio = wn / (gn + weight_decay * wn) if wn > 0 and gn + weight_decay * wn > 0 else 1.0
    v = momentum * v + lr * eta * ratio * (g + weight_decay * w)
    return w - v, v


def _np_lamb(w, g, m, v, t, *, lr, b1, b2, eps, weight_decay):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + weight_decay * w
    wn, un = np.linalg.norm(w), np.linalg.norm(u)
    ratio = wn / un if wn > 0 and un > 0 else 1.0
    return w - lr * ratio * u, m, v


def _run(opt_cls, shapes, grads_per_step, **kw):
    rng = np.random.default_rng(0)
    params = [torch.nn.Parameter(torch.tensor(rng.standard_normal(s))) for s in shapes]
    with torch.no_grad():
        params[-1].zero_()  # a zero-initialised "bias": its ratio falls back to 1
    start = [p.detach().numpy().copy() for p in params]
    opt = opt_cls(params, **kw)
    for grads in grads_per_step:
        for p, g in zip(params, grads, strict=True):
            p.grad = torch.tensor(g)
        opt.step()
    return start, [p.detach().numpy() for p in params]


def test_lars_matches_numpy_reference():
    shapes = [(5, 3), (7,), (4,)]
    rng = np.random.default_rng(1)
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(4)]
    kw = dict(lr=3.0, momentum=0.9, weight_decay=1e-2, trust_coefficient=0.01)
    start, got = _run(optimizers.LARS, shapes, grads, **kw)
    for i in range(len(shapes)):
        w, v = start[i], np.zeros(shapes[i])
        for step in grads:
            w, v = _np_lars(w, step[i], v, lr=3.0, momentum=0.9, weight_decay=1e-2, eta=0.01)
        np.testing.assert_allclose(got[i], w, rtol=1e-12, atol=1e-14)


def test_lamb_matches_numpy_reference():
    shapes = [(6, 2), (3,)]
    rng = np.random.default_rng(2)
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(5)]
    kw = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    start, got = _run(optimizers.LAMB, shapes, grads, **kw)
    for i in range(len(shapes)):
        w, m, v = start[i], np.zeros(shapes[i]), np.zeros(shapes[i])
        for t, step in enumerate(grads, start=1):
            w, m, v = _np_lamb(
                w, step[i], m, v, t, lr=0.05, b1=0.9, b2=0.99, eps=1e-6, weight_decay=0.1
            )
        np.testing.assert_allclose(got[i], w, rtol=1e-12, atol=1e-14)


def test_first_steps_are_a_fixed_fraction_of_each_layer():
    """Without weight decay, LARS moves every layer by lr*eta of its norm, LAMB by lr."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))
    for cls, kw, expected in [
        (optimizers.LARS, dict(lr=2.0, trust_coefficient=0.01), 0.02),
        (optimizers.LAMB, dict(lr=0.03), 0.03),
    ]:
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 100.0  # gradient scale must not matter
        ratios = optimizers.step_update_ratios(model, cls(model.parameters(), **kw))
        assert ratios == pytest.approx(dict.fromkeys(ratios, expected), rel=1e-4)


def test_bad_hyperparameters_raise():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError):
        optimizers.LARS(p, lr=-1.0)
    with pytest.raises(ValueError):
        optimizers.LAMB(p, betas=(1.0, 0.9))


def test_weights_after_steps_follow_the_numpy_update_and_copy_each_step():
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((3, 2))
    grads = [rng.standard_normal((3, 2)) for _ in range(3)]
    got = optimizers.weights_after_steps(optimizers.LARS, w0, grads, lr=2.0, trust_coefficient=0.1)
    w, v = w0, np.zeros_like(w0)
    for k, g in enumerate(grads):
        w, v = _np_lars(w, g, v, lr=2.0, momentum=0.9, weight_decay=0.0, eta=0.1)
        np.testing.assert_allclose(got[k], w, rtol=1e-12, atol=1e-14)
    assert not np.array_equal(got[0], got[1]), "each step's weights are a copy"
    assert np.array_equal(w0, np.random.default_rng(3).standard_normal((3, 2))), "w0 is left alone"
