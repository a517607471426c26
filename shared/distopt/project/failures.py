"""Tools for section 07's Part C: cause a training failure on purpose, then check the cure.

* :func:`raised_rate`: a schedule whose rate is raised in the middle of a run (a resumed run
  whose schedule restarts at a higher peak, or a rate scaled up with the batch), at once or
  over a re-warm-up: the loss-spike demo and its cure;
* :func:`zero_gradient_fraction`: the share of gradient entries that come out exactly zero
  from one backward pass, to see float16's underflow (and loss scaling's cure) directly;
* :func:`lr_range_test` and :func:`range_test_advice`: Smith's learning-rate range test and
  the peak rate it suggests;
* :func:`gradient_check` and :func:`overfit_one_batch`: the two checks of a small model
  that tell a bug from a bad setting (analytic against numerical gradients; one batch
  learnt by heart).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from distopt.project.gpt import GPT, GPTConfig
from distopt.project.loop import (
    DTYPES,
    TrainConfig,
    batch_loss,
    build_data,
    make_model,
    make_optimizer,
    train,
    train_step,
)

__all__ = [
    "gradient_check",
    "lr_range_test",
    "overfit_one_batch",
    "raised_rate",
    "range_test_advice",
    "zero_gradient_fraction",
]


def raised_rate(
    config: TrainConfig, *, at_step: int, new_peak: float, rewarm_steps: int = 0
) -> Callable[[int], float]:
    """``config``'s warm-up to its peak, held until ``at_step``; then the rate goes to
    ``new_peak`` (in one step, or linearly over ``rewarm_steps``) and decays to 0 at
    ``config.steps`` along a half cosine."""
    if not 0 < at_step < config.steps - rewarm_steps:
        raise ValueError(f"need 0 < at_step < steps - rewarm_steps, got {at_step}")
    peak, warmup = config.peak_lr, max(1, config.warmup_steps)

    def lr_at(step: int) -> float:
        if step < at_step:
            return peak * min(1.0, (step + 1) / warmup)
        if step < at_step + rewarm_steps:
            return peak + (new_peak - peak) * (step - at_step + 1) / rewarm_steps
        progress = (step - at_step - rewarm_steps) / (config.steps - at_step - rewarm_steps)
        return new_peak * (1 + math.cos(math.pi * min(1.0, progress))) / 2

    return lr_at


def zero_gradient_fraction(config: TrainConfig, *, loss_scaling: bool = False) -> float:
    """Share of the gradient entries that one backward pass of a fresh model on the first
    batch leaves exactly 0, under ``config.dtype`` and ``config.loss_multiplier`` (with the
    loss multiplied by float16's usual starting scale, 2**16, if ``loss_scaling``)."""
    model = make_model(config)
    tokens = build_data(config).batch(0, config.batch_size)
    with torch.autocast("cpu", dtype=DTYPES[config.dtype], enabled=config.dtype != "float32"):
        loss = batch_loss(model, tokens)
    (loss * config.loss_multiplier * (2.0**16 if loss_scaling else 1.0)).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return float((grads == 0).double().mean())


def lr_range_test(
    config: TrainConfig, *, min_lr: float = 1e-5, max_lr: float = 1.0, steps: int = 100
) -> dict[str, list]:
    """Smith 2017's learning-rate range test: the rate grows exponentially from ``min_lr`` to
    ``max_lr`` over ``steps`` steps of one run; stops once the loss exceeds 1.5 x ln(vocab).

    Returns the history; plot ``loss`` against ``lr``, or read :func:`range_test_advice`.
    """
    if not 0 < min_lr < max_lr or steps < 2:
        raise ValueError("need 0 < min_lr < max_lr and steps >= 2")
    ratio = max_lr / min_lr
    cfg = replace(config, steps=steps, warmup_steps=0, eval_every=steps)
    initial = math.log(config.model.vocab_size)
    return train(
        cfg, lr_at=lambda step: min_lr * ratio ** (step / (steps - 1)), stop_loss=1.5 * initial
    )[1]


def range_test_advice(history: dict[str, list], *, window: int = 5, below: float = 3.0) -> dict:
    """What a range test says, read from the loss smoothed over ``window`` steps.

    ``"steepest"``: the rate where the smoothed loss fell fastest (where the useful range
    starts); ``"lowest"``: the rate of the lowest smoothed loss (past it, steps are too big
    for the loss to keep falling); ``"suggested"``: ``lowest / below``, a peak rate safely
    inside the range, as Smith advises (a factor of 3 to 10 below the point where the
    loss stops falling).
    """
    loss, lr = np.asarray(history["loss"], float), np.asarray(history["lr"], float)
    if len(loss) < 2 * window:
        raise ValueError(f"a range test of {len(loss)} steps is too short to read")
    smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
    centre = window // 2  # smooth[i] is centred on step i + centre
    steepest = int(np.argmin(np.diff(smooth))) + centre + 1
    lowest = int(np.argmin(smooth)) + centre
    return {"steepest": lr[steepest], "lowest": lr[lowest], "suggested": lr[lowest] / below}


def gradient_check(seed: int = 0) -> bool:
    """``torch.autograd.gradcheck`` of the GPT's loss on a tiny float64 copy (1 layer, width 8):
    the backward pass's gradients against finite differences of the forward pass."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=5, seq_len=4, n_layer=1, n_head=2, d_model=8)).double()
    tokens = torch.randint(0, 5, (2, 5), generator=torch.Generator().manual_seed(seed))
    names = [name for name, _ in model.named_parameters()]

    def loss(*params: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, dict(zip(names, params, strict=True)), (tokens[:, :-1],))
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    return torch.autograd.gradcheck(loss, params, eps=1e-6, atol=1e-6)


def overfit_one_batch(config: TrainConfig, *, steps: int, lr: float) -> list[float]:
    """Train a fresh model on the first batch only, ``steps`` times at rate ``lr``; the
    losses. A model and loop without bugs learn one batch by heart (loss near 0)."""
    model, tokens = make_model(config), build_data(config).batch(0, config.batch_size)
    optimizer = make_optimizer(model, config)
    return [
        train_step(model, optimizer, tokens, lr=lr, clip_norm=config.clip_norm, dtype=config.dtype)[
            0
        ]
        for _ in range(steps)
    ]
