"""Tools for section 07's Part C: cause a training failure on purpose, then check the cure.

* :func:`raised_rate`: a schedule whose rate is raised in the middle of a run (a resumed run
  whose schedule restarts at a higher peak, or a rate scaled up with the batch), at once or
  over a re-warm-up: the loss-spike demo and its cure;
* :func:`train_monitored`: the loop with section 04's ``SpikeMonitor`` in it, as large runs
  keep it: a step whose loss or gradient norm jumps is skipped, and repeated spikes roll the
  run back to its last checkpoint with the rate lowered;
* :func:`sharpness_at`: the curvature a step must stay under, lambda_max(H) for gradient
  descent (2 / lr) or lambda_max(P^-1 H) for Adam's preconditioner P (38 / lr, Cohen et al.
  2022);
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
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from distopt.optim.stability import (
    SpikeMonitor,
    adam_preconditioner,
    restore_checkpoint,
    save_checkpoint,
    sharpness,
)
from distopt.project.gpt import GPT, GPTConfig
from distopt.project.history import log
from distopt.project.loop import (
    DTYPES,
    TrainConfig,
    _autocast,
    batch_at,
    batch_loss,
    build_data,
    evaluate,
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
    "sharpness_at",
    "train_monitored",
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


def train_monitored(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    history: dict[str, list],
    *,
    lr_at: Callable[[int], float],
    monitor: SpikeMonitor,
    start: int,
    checkpoint_every: int = 10,
    lr_backoff: float = 0.5,
    val_batches: list[torch.Tensor] | None = None,
) -> list[tuple[int, str]]:
    """Steps ``start`` .. ``config.steps - 1`` of a run whose first ``start`` steps are in
    ``history``, with ``monitor`` (section 04's ``SpikeMonitor``) asked before every update.

    The monitor first reads the steps already in ``history`` (its running averages), and the
    state at ``start`` is the first checkpoint. Each step computes the loss and the gradient
    norm (logged whatever the verdict); "ok": clip and step, and every ``checkpoint_every``
    steps keep a checkpoint if the monitor is calm; "skip": the update is dropped;
    "rollback": the last checkpoint is restored and the rate multiplied by ``lr_backoff``
    from then on (PaLM's and OPT's practice). The data go on by step number, so the batches
    around a spike are not seen again. Appends to ``history``; returns the (step, verdict)
    events that were not "ok".
    """
    if checkpoint_every < 1 or not 0 < lr_backoff <= 1:
        raise ValueError("need checkpoint_every >= 1 and 0 < lr_backoff <= 1")
    for step, loss, norm in zip(
        history["step"], history["loss"], history["grad_norm"], strict=True
    ):
        monitor.check(step, loss, norm)
    batches, checkpoint = batch_at(config), save_checkpoint(model, optimizer, start - 1)
    scale, events = 1.0, []
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(start, config.steps):
        begin, lr = time.perf_counter(), lr_at(step) * scale
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        optimizer.zero_grad(set_to_none=True)
        with _autocast(config.dtype):
            loss = batch_loss(model, batches(step))
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params, config.clip_norm or math.inf))
        verdict = monitor.check(step, loss.item(), norm)
        if verdict == "ok":
            optimizer.step()
            if (step + 1) % checkpoint_every == 0 and monitor.calm(step):
                checkpoint = save_checkpoint(model, optimizer, step)
        else:
            events.append((step, verdict))
            if verdict == "rollback":
                restore_checkpoint(checkpoint, model, optimizer)
                scale *= lr_backoff
        log(history, step=step, loss=loss.item(), grad_norm=norm, lr=lr,
            step_time=time.perf_counter() - begin)  # fmt: skip
        if val_batches is not None and (
            (step + 1) % config.eval_every == 0 or step + 1 == config.steps
        ):
            log(history, val_step=step, val_loss=evaluate(model, val_batches, config.dtype))
    return events


def sharpness_at(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    iters: int = 10,
) -> float:
    """The loss's curvature on ``tokens`` that a step must stay under, by power iteration on
    Hessian-vector products (``distopt.optim.stability.sharpness``): lambda_max(H), what
    gradient descent's bound 2 / lr is about; or, given the Adam(W) ``optimizer`` after its
    last step, lambda_max(P^-1 H) with P Adam's denominator
    (``distopt.optim.stability.adam_preconditioner``), what Adam's bound 38 / lr (beta1 = 0.9)
    is about (Cohen et al. 2022). Attention runs in PyTorch's plain ("math") kernel, the one
    with a second derivative."""
    params = [p for p in model.parameters() if p.requires_grad]
    scale = None if optimizer is None else adam_preconditioner(optimizer, params)
    with sdpa_kernel(SDPBackend.MATH):
        value, _ = sharpness(
            lambda: batch_loss(model, tokens), params, iters=iters, preconditioner=scale
        )
    return value
