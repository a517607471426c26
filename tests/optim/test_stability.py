"""Tests of distopt.optim.stability: the spike monitor, the global norm, checkpoints."""

from __future__ import annotations

import math

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
