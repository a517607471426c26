"""distopt.project.loop: the recipe loop in one process, its history, schedule and stops."""

import math
from dataclasses import replace

import pytest

from distopt.project.loop import train
from tests.project.tiny import HISTORY_KEYS, TINY

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_history_format_schedule_and_learning():
    _, history = train(TINY)
    assert set(history) == HISTORY_KEYS
    assert history["step"] == list(range(30)) and history["val_step"] == [9, 19, 29]
    assert math.isclose(history["lr"][2], 1e-2) and math.isclose(
        history["lr"][-1], 1e-3, rel_tol=0.05
    )
    assert history["val_loss"][-1] < history["val_loss"][0] < math.log(8) + 0.2


def test_runs_reproduce_exactly_in_bfloat16():
    config = replace(TINY, steps=10, dtype="bfloat16")
    a, b = train(config)[1], train(config)[1]
    assert a["loss"] == b["loss"] and a["val_loss"] == b["val_loss"]


def test_clipping_bounds_the_update_but_logs_the_norm_before():
    history = train(replace(TINY, steps=5, clip_norm=1e-3))[1]
    assert min(history["grad_norm"]) > 1e-3  # logged before clipping


def test_a_loss_multiplier_leaves_the_float32_run_as_it_was():
    # the gradients are divided by it again before clipping: the same update up to rounding
    plain = train(replace(TINY, steps=8))[1]["loss"]
    shrunk = train(replace(TINY, steps=8, loss_multiplier=2.0**-12))[1]["loss"]
    assert shrunk == pytest.approx(plain, rel=1e-5)


def test_float16_underflows_without_loss_scaling_and_not_with_it():
    config = replace(TINY, steps=12, dtype="float16", loss_multiplier=2.0**-20)
    underflowed = train(config)[1]["loss"]
    scaled = train(replace(config, loss_scaling=True))[1]["loss"]
    reference = train(replace(TINY, steps=12))[1]["loss"]
    # with 2**16 loss scaling the float16 run follows float32; without it, it does not
    assert abs(scaled[-1] - reference[-1]) < 0.05
    assert abs(underflowed[-1] - reference[-1]) > 0.1


def test_nonfinite_loss_stops_the_run():
    history = train(replace(TINY, peak_lr=1e30, warmup_steps=0, clip_norm=None))[1]
    assert len(history["step"]) < 30 and not math.isfinite(history["loss"][-1])


def test_bad_config_raises():
    with pytest.raises(ValueError, match="dtype"):
        replace(TINY, dtype="float8")
    with pytest.raises(ValueError, match="warmup"):
        replace(TINY, warmup_steps=31)
