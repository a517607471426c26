"""Tests of distopt.optim.stability: the spike monitor, the global norm, checkpoints, the
sharpness (power iteration on Hessian-vector products) and the heavy-ball stability bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from distopt.optim import stability
from distopt.problems import classify


def test_grad_norm_is_global():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0, 0.0])
    assert stability.global_grad_norm([a, b]) == pytest.approx(5.0)


def test_monitor_skips_spikes_and_rolls_back_on_repeats():
    monitor = stability.SpikeMonitor(min_history=3, max_spikes=2, window=5)
    assert [monitor.check(s, 1.0, 1.0) for s in range(3)] == ["ok"] * 3
    assert monitor.check(3, 1.9, 1.0) == "ok"  # under twice the average
    assert monitor.check(4, 5.0, 1.0) == "skip"
    assert not monitor.calm(4)
    assert monitor.check(20, 1.0, 10.0) == "skip"  # gradient spike; the old one expired
    assert monitor.check(21, math.nan, 1.0) == "rollback"
    assert monitor.calm(26)


def test_checkpoint_round_trip():
    model = classify.make_mlp(3, 2, hidden=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    ckpt = stability.save_checkpoint(model, opt, 7)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    stability.restore_checkpoint(ckpt, model, opt)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert ckpt.step == 7


def test_sharpness_finds_the_top_eigenvalue_of_a_quadratic():
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    eigenvalues = np.array([5.0, 2.0, 1.0, 0.5, 0.1, 0.0])
    a = torch.tensor(q @ np.diag(eigenvalues) @ q.T)
    w = torch.tensor(rng.standard_normal(6), requires_grad=True)
    value, vector = stability.sharpness(lambda: 0.5 * w @ a @ w, [w], iters=200)
    assert value == pytest.approx(5.0, rel=1e-6)
    assert abs(float(vector[0] @ torch.tensor(q[:, 0]))) == pytest.approx(1.0, rel=1e-6)


def test_sharpness_matches_the_full_hessian_of_a_small_mlp():
    model = classify.make_mlp(3, 2, hidden=4).double()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(20, 3, dtype=torch.float64, generator=generator)
    y = torch.randint(0, 2, (20,), generator=generator)
    params = list(model.parameters())

    def loss():
        return torch.nn.functional.cross_entropy(model(x), y)

    flat = torch.cat([p.detach().reshape(-1) for p in params])

    names = [name for name, _ in model.named_parameters()]

    def loss_of(vector):
        chunks, start = {}, 0
        for name, p in zip(names, params, strict=True):
            chunks[name] = vector[start : start + p.numel()].reshape(p.shape)
            start += p.numel()
        logits = torch.func.functional_call(model, chunks, (x,))
        return torch.nn.functional.cross_entropy(logits, y)

    eigenvalues = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss_of, flat))
    top = eigenvalues[eigenvalues.abs().argmax()]
    value, _ = stability.sharpness(loss, params, iters=150)
    assert value == pytest.approx(float(top), rel=1e-4)


def test_heavy_ball_bound_separates_convergence_from_divergence():
    assert stability.heavy_ball_max_lr(2.0) == pytest.approx(1.0)
    assert stability.heavy_ball_max_lr(2.0, 0.9) == pytest.approx(1.9)
    curvature, momentum = 3.0, 0.9
    bound = stability.heavy_ball_max_lr(curvature, momentum)
    for factor, converges in [(0.99, True), (1.01, False)]:
        w, v = 1.0, 0.0
        for _ in range(5000):
            v = momentum * v + curvature * w  # PyTorch SGD: buffer of gradients
            w -= factor * bound * v
        assert (abs(w) < 1e-3) == converges, (factor, w)
    with pytest.raises(ValueError):
        stability.heavy_ball_max_lr(0.0)
    with pytest.raises(ValueError):
        stability.heavy_ball_max_lr(1.0, 1.0)


def test_preconditioned_sharpness_is_the_top_eigenvalue_of_p_inverse_h():
    # lambda_max(D A) for a diagonal D > 0 and a symmetric A: not A's top eigenvalue
    rng = np.random.default_rng(5)
    q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    a = q @ np.diag([4.0, 2.0, 1.0, 0.5, 0.0]) @ q.T
    d = rng.uniform(0.1, 10.0, size=5)
    expected = max(np.linalg.eigvals(np.diag(d) @ a).real)
    w = torch.tensor(rng.standard_normal(5), requires_grad=True)
    at = torch.tensor(a)
    value, _ = stability.sharpness(
        lambda: 0.5 * w @ at @ w, [w], iters=300, preconditioner=[torch.tensor(d)]
    )
    assert value == pytest.approx(expected, rel=1e-6)
    assert abs(value - 4.0) > 0.1  # the preconditioner is used


def test_adam_preconditioner_is_adams_denominator():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = torch.optim.AdamW([w], lr=0.1, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    squares = torch.zeros(3)
    for _ in range(3):
        opt.zero_grad()
        (w**2 * torch.tensor([1.0, 10.0, 100.0])).sum().backward()
        squares = 0.95 * squares + 0.05 * w.grad.detach() ** 2
        opt.step()
    (d,) = stability.adam_preconditioner(opt, [w])
    expected = 1 / ((1 - 0.9**3) * ((squares / (1 - 0.95**3)).sqrt() + 1e-8))
    torch.testing.assert_close(d, expected)


def test_adams_threshold_is_38_over_the_rate_for_beta1_09():
    assert stability.adam_max_preconditioned_sharpness(0.01) == pytest.approx(3800)
    assert stability.adam_max_preconditioned_sharpness(0.01, beta1=0.0) == pytest.approx(200)
    with pytest.raises(ValueError):
        stability.adam_max_preconditioned_sharpness(0.0)
