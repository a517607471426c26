"""distopt.project.loop: the recipe loop in one process, its history, schedule and stops."""

import math
from contextlib import contextmanager
from dataclasses import replace

import pytest

from distopt.project.loop import batch_at, make_model, make_optimizer, train, train_step
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


def test_gradient_accumulation_is_the_whole_batch_at_once():
    # 4 micro-batches of 2 sequences: the same mean gradient in another order of sums
    whole = train(replace(TINY, steps=6))[1]
    accumulated = train(replace(TINY, steps=6, micro_batches=4))[1]
    assert accumulated["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert accumulated["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)


def test_each_micro_batch_runs_forward_and_only_the_last_one_communicates():
    model, config = make_model(TINY), replace(TINY, micro_batches=4)
    sizes, quiet = [], []
    model.register_forward_hook(lambda module, args, out: sizes.append(args[0].shape[0]))

    @contextmanager
    def no_sync():  # records which micro-batches a wrapper would keep quiet
        quiet.append(len(sizes))
        yield

    tokens = batch_at(config)(0)
    train_step(model, make_optimizer(model, config), tokens, lr=1e-3, clip_norm=1.0,
               dtype="float32", micro_batches=4, no_sync=no_sync)  # fmt: skip
    assert sizes == [2, 2, 2, 2] and quiet == [0, 1, 2]


def test_bad_config_raises():
    with pytest.raises(ValueError, match="dtype"):
        replace(TINY, dtype="float8")
    with pytest.raises(ValueError, match="warmup"):
        replace(TINY, warmup_steps=31)
    with pytest.raises(ValueError, match="micro_batches"):
        replace(TINY, micro_batches=0)
    with pytest.raises(ValueError, match="3 micro-batches"):
        train(replace(TINY, micro_batches=3))  # 8 sequences do not cut into 3


def test_z_loss_adds_its_gradient_and_leaves_the_logged_loss_the_cross_entropy():
    import torch
    import torch.nn.functional as F

    tokens = batch_at(TINY)(0)
    grads, losses = {}, {}
    for z_loss in (0.0, 0.5):
        model = make_model(TINY)
        losses[z_loss] = train_step(
            model, torch.optim.SGD(model.parameters(), lr=0.0), tokens, lr=0.0,
            clip_norm=None, dtype="float32", z_loss=z_loss,
        )[0]  # fmt: skip
        grads[z_loss] = [p.grad.clone() for p in model.parameters()]
    model = make_model(TINY)
    logits = model(tokens[:, :-1]).flatten(0, 1)
    objective = F.cross_entropy(logits, tokens[:, 1:].flatten())
    (objective + 0.5 * torch.logsumexp(logits, -1).square().mean()).backward()
    assert losses[0.5] == pytest.approx(losses[0.0], rel=1e-6)
    assert losses[0.0] == pytest.approx(objective.item(), rel=1e-6)
    for got, want in zip(grads[0.5], model.parameters(), strict=True):
        torch.testing.assert_close(got, want.grad, rtol=1e-4, atol=1e-6)
    assert any(not torch.allclose(a, b) for a, b in zip(grads[0.5], grads[0.0], strict=True))
