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
