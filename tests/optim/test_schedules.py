"""Tests of distopt.optim.schedules: linear scaling and the warm-up + cosine schedule."""

from __future__ import annotations

import math

import pytest

from distopt.optim import schedules


def test_linear_scaling_is_goyal_rule():
    assert schedules.linear_scaled_lr(256) == pytest.approx(0.1)
    assert schedules.linear_scaled_lr(8192) == pytest.approx(3.2)
    assert schedules.linear_scaled_lr(64, base_lr=0.4, base_batch=128) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        schedules.linear_scaled_lr(0)


def test_warmup_ramps_then_cosine_decays_to_final():
    kw = dict(peak_lr=2.0, warmup_steps=10, total_steps=110, final_lr=0.2)
    lrs = [schedules.warmup_cosine_lr(s, **kw) for s in range(130)]
    assert lrs[0] == pytest.approx(0.2) and lrs[9] == pytest.approx(2.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10], strict=True))
    assert lrs[10] == pytest.approx(2.0)
    assert lrs[60] == pytest.approx(1.1)  # half-way through the decay: the mean of peak, final
    assert all(a >= b for a, b in zip(lrs[10:110], lrs[11:111], strict=True))
    assert all(lr == 0.2 for lr in lrs[110:])


def test_no_warmup_starts_at_peak():
    lr = schedules.warmup_cosine_lr(0, peak_lr=1.0, warmup_steps=0, total_steps=4)
    assert lr == 1.0
    lr = schedules.warmup_cosine_lr(2, peak_lr=1.0, warmup_steps=0, total_steps=4)
    assert math.isclose(lr, 0.5)


@pytest.mark.parametrize(
    ("step", "warmup", "total"), [(-1, 0, 10), (0, 11, 10), (0, -1, 10), (0, 0, 0)]
)
def test_bad_arguments_raise(step, warmup, total):
    with pytest.raises(ValueError):
        schedules.warmup_cosine_lr(step, peak_lr=1.0, warmup_steps=warmup, total_steps=total)


def test_sqrt_scaled_adam_follows_malladi_et_al():
    same = schedules.sqrt_scaled_adam(256, 256, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    assert same["lr"] == 1e-3 and same["betas"] == pytest.approx((0.9, 0.999))
    four = schedules.sqrt_scaled_adam(1024, 256, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    assert four["lr"] == pytest.approx(2e-3)  # sqrt(4) times, where the linear rule says 4
    assert four["betas"] == pytest.approx((0.6, 0.996))
    assert four["eps"] == pytest.approx(5e-9)
    smaller = schedules.sqrt_scaled_adam(64, 256, lr=1e-3)
    assert smaller["lr"] == pytest.approx(5e-4) and smaller["betas"][0] == pytest.approx(0.975)
    with pytest.raises(ValueError):
        schedules.sqrt_scaled_adam(4096, 256, lr=1e-3)  # 1 - 16 * 0.1 < 0
    with pytest.raises(ValueError):
        schedules.sqrt_scaled_adam(0, 256, lr=1e-3)
