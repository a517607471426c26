"""distopt.project.failures: the tools of section 07's Part C."""

import math
from dataclasses import replace

import pytest

from distopt.optim.stability import SpikeMonitor
from distopt.project import failures
from distopt.project.loop import batch_at, make_model, make_optimizer, run_steps, train
from tests.project.tiny import TINY

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_raised_rate_jumps_or_rewarms_then_decays_to_zero():
    config = replace(TINY, steps=30, warmup_steps=3, peak_lr=0.01)
    jump = failures.raised_rate(config, at_step=10, new_peak=0.05)
    assert [jump(s) for s in (0, 2, 9)] == pytest.approx([0.01 / 3, 0.01, 0.01])
    assert jump(10) == pytest.approx(0.05) and jump(30) == pytest.approx(0.0, abs=1e-12)
    rewarm = failures.raised_rate(config, at_step=10, new_peak=0.05, rewarm_steps=4)
    assert [rewarm(s) for s in (10, 13)] == pytest.approx([0.02, 0.05])
    assert rewarm(14) == pytest.approx(0.05) and rewarm(22) < 0.05
    with pytest.raises(ValueError, match="at_step"):
        failures.raised_rate(config, at_step=28, new_peak=0.05, rewarm_steps=4)


def test_float16_flushes_tiny_gradients_to_zero_and_loss_scaling_keeps_them():
    tiny = replace(TINY, dtype="float16", loss_multiplier=2.0**-20)
    # in float32 only the rows of tokens absent from the batch get no gradient
    baseline = failures.zero_gradient_fraction(replace(tiny, dtype="float32"))
    assert baseline < 0.05
    assert failures.zero_gradient_fraction(tiny) > 0.5
    assert failures.zero_gradient_fraction(tiny, loss_scaling=True) < baseline + 0.05


def test_the_range_test_and_its_advice():
    history = failures.lr_range_test(TINY, min_lr=1e-4, max_lr=1.0, steps=20)
    assert math.isclose(history["lr"][0], 1e-4) and history["lr"][1] > history["lr"][0]
    # a made-up curve: falls fastest at step 5, lowest at step 12 (smoothed over 5 steps)
    loss = [3.0] * 3 + [3.0, 2.0, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.5, 2.0, 4.0, 6, 8]
    advice = failures.range_test_advice({"loss": loss, "lr": [10.0**-s for s in range(18, 0, -1)]})
    assert advice["lowest"] > advice["steepest"]
    assert advice["suggested"] == pytest.approx(advice["lowest"] / 3)
    with pytest.raises(ValueError, match="too short"):
        failures.range_test_advice({"loss": [1, 2, 3], "lr": [1, 2, 3]})


def test_the_gradient_check_passes_and_one_batch_is_learnt_by_heart():
    assert failures.gradient_check()
    losses = failures.overfit_one_batch(TINY, steps=60, lr=3e-2)
    assert losses[-1] < 0.25 * losses[0]
    # a fresh run on the stream of batches does not get there: the data is not memorised
    assert train(replace(TINY, steps=60))[1]["loss"][-1] > 2 * losses[-1]


def _trained_to(step):
    config = replace(TINY, steps=40)
    model = make_model(config)
    optimizer = make_optimizer(model, config)
    history = run_steps(model, optimizer, config, batch_at(config), stop=step)
    return config, model, optimizer, history


def test_the_monitored_loop_skips_spikes_and_rolls_back_with_a_lower_rate():
    config, model, optimizer, history = _trained_to(20)
    jump = failures.raised_rate(config, at_step=20, new_peak=3.0)  # 300x: it must spike
    events = failures.train_monitored(
        model, optimizer, config, history, lr_at=jump, monitor=SpikeMonitor(), start=20
    )
    verdicts = [verdict for _, verdict in events]
    assert "skip" in verdicts and "rollback" in verdicts, events
    first_rollback = next(step for step, verdict in events if verdict == "rollback")
    # after the rollback the rate is halved, and every step is logged, skipped or not
    assert history["lr"][first_rollback + 1] == pytest.approx(jump(first_rollback + 1) / 2)
    assert history["step"] == list(range(40))
    # a calm run with the same monitor is left alone: the same losses as without it
    config, model, optimizer, calm = _trained_to(20)
    _, plain_model, plain_optimizer, plain = _trained_to(20)
    run_steps(plain_model, plain_optimizer, config, batch_at(config), start=20, history=plain)
    events = failures.train_monitored(
        model, optimizer, config, calm, lr_at=config.lr_at, monitor=SpikeMonitor(), start=20
    )
    assert events == []
    assert calm["loss"] == pytest.approx(plain["loss"], rel=1e-6)


def test_sharpness_at_for_gradient_descent_and_for_adam():
    config, model, optimizer, _ = _trained_to(10)
    tokens = batch_at(config)(10)
    plain = failures.sharpness_at(model, tokens, iters=30)
    adam = failures.sharpness_at(model, tokens, optimizer=optimizer, iters=30)
    assert plain > 0 and adam > 0
    # Adam divides by sqrt(v), far below 1 here: its preconditioned curvature is much larger
    assert adam > 10 * plain
