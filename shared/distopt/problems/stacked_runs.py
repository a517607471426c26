"""Many runs of the classification task at once: K MLPs stacked along a leading axis.

Measuring the steps to a target loss at the best learning rate (McCandlish et al. 2018)
takes many short runs per batch size, and a statistic over seeds multiplies them again. A
step of the task's tiny MLP at a small batch costs far more in per-operation overhead than
in arithmetic, so K runs done by one batched matrix product (``torch.baddbmm`` over a
leading run axis) cost little more than one run. Each run keeps its own seed (its initial
weights from :func:`distopt.problems.mlp.build_mlp`, its batch order from
:func:`distopt.problems.classify.batch_indices`), rate, linear warm-up and optimizer
settings, and does the arithmetic of :func:`distopt.problems.classify.steps_to_loss` with
``torch.optim.SGD`` (momentum) or ``torch.optim.Adam``, to float rounding (the tests compare
the two). At large batches the runs are limited by arithmetic and stacking saves nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distopt.problems.classify import ClassificationData, batch_indices, make_mlp

__all__ = ["RunResult", "RunSpec", "mean_steps", "steps_to_loss"]


@dataclass(frozen=True)
class RunSpec:
    """One run of a stack: its seed, rate and optimizer."""

    lr: float  # the rate after warm-up (constant from then on)
    seed: int = 0  # initial weights and batch order
    warmup_steps: int = 0  # rate lr * (s + 1) / warmup_steps at step s < warmup_steps
    momentum: float = 0.9  # SGD's heavy-ball momentum (ignored with betas)
    betas: tuple[float, float] | None = None  # Adam's betas; None: SGD with momentum
    eps: float = 1e-8  # Adam's epsilon


@dataclass
class RunResult:
    """What one run of a stack reached."""

    steps: int | None  # steps until the test loss first reached the target; None: not reached
    test_loss: list[float] = field(default_factory=list)  # nats, at each evaluation
    diverged: bool = False  # a minibatch loss became inf or nan and the run stopped


def _stack(runs: Sequence[RunSpec], num_features: int, num_classes: int, hidden: int, depth: int):
    """Each Linear's weights as (K, in, out) and biases as (K, 1, out), leaves of autograd."""
    layers = [
        [
            m
            for m in make_mlp(num_features, num_classes, hidden=hidden, depth=depth, seed=r.seed)
            if isinstance(m, nn.Linear)
        ]
        for r in runs
    ]
    weights = [
        torch.stack([ls[i].weight.detach().T for ls in layers]) for i in range(len(layers[0]))
    ]
    biases = [
        torch.stack([ls[i].bias.detach()[None] for ls in layers]) for i in range(len(layers[0]))
    ]
    return [p.contiguous().requires_grad_() for p in weights + biases]


def _logits(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The stacked MLP on x: (K, n, features) per run, or (n, features) shared by all runs."""
    half = len(params) // 2
    h = x
    for i, (w, b) in enumerate(zip(params[:half], params[half:], strict=True)):
        h = torch.baddbmm(b, h, w) if h.dim() == 3 else torch.matmul(h, w) + b
        if i < half - 1:
            h = torch.relu(h)
    return h


def _mean_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each run: logits (K, n, classes), labels (K, n) -> (K,)."""
    k, n, c = logits.shape
    return (
        F.cross_entropy(logits.reshape(k * n, c), y.reshape(k * n), reduction="none")
        .view(k, n)
        .mean(1)
    )


def steps_to_loss(
    data: ClassificationData,
    runs: Sequence[RunSpec],
    *,
    batch_size: int,
    target_loss: float,
    max_steps: int,
    eval_every_examples: int = 512,
    give_up_mean: float | None = None,
    hidden: int = 64,
    depth: int = 2,
) -> list[RunResult]:
    """Steps until each run's test loss first reaches ``target_loss`` (nats), all runs at once.

    Every ``max(1, eval_every_examples // batch_size)`` steps the test loss of every running
    run is measured (as in ``classify.steps_to_loss``); a run stops at the target, at
    ``max_steps``, or at a non-finite minibatch loss. ``give_up_mean`` stops the whole stack
    as soon as the mean steps over its runs can no longer be below it (a run diverged, or
    the finished runs' steps plus the current step for every unfinished run reach it): a
    search for the fewest mean steps over seeds needs no more. Unfinished runs then have
    ``steps`` None. All runs use SGD with momentum, or all use Adam (``betas`` set).
    """
    if not runs:
        raise ValueError("need at least one run")
    if len({r.betas is None for r in runs}) > 1:
        raise ValueError("a stack holds SGD runs or Adam runs, not both")
    adam = runs[0].betas is not None
    num = len(runs)
    params = _stack(runs, data.num_features, data.num_classes, hidden, depth)
    state = [[torch.zeros_like(p) for p in params] for _ in range(2 if adam else 1)]

    def column(values) -> torch.Tensor:  # one float64 value per run, as a (K, 1, 1) tensor
        return torch.tensor(values, dtype=torch.float64).view(-1, 1, 1)

    # Rates and bias corrections in float64, as torch's optimizers compute their scalars.
    peak = column([r.lr for r in runs])
    warmup = column([max(1, r.warmup_steps) for r in runs])
    if adam:
        beta1, beta2 = column([r.betas[0] for r in runs]), column([r.betas[1] for r in runs])
        eps = column([r.eps for r in runs]).float()
    else:
        momentum = column([r.momentum for r in runs]).float()
    orders = [
        batch_indices(data.train_x.shape[0], batch_size, max_steps, seed=r.seed) for r in runs
    ]
    every = max(1, eval_every_examples // batch_size)
    results = [RunResult(None) for _ in runs]
    active = np.arange(num)  # the runs still going, in stack order
    for step in range(max_steps):
        idx = torch.as_tensor(np.stack([next(order) for order in orders]))[active]
        losses = _mean_losses(_logits(params, data.train_x[idx]), data.train_y[idx])
        finite = torch.isfinite(losses.detach())
        grads = torch.autograd.grad(losses[finite].sum(), params, allow_unused=True)
        keep = finite.numpy().copy()
        with torch.no_grad():
            rate = peak[active] * torch.clamp((step + 1) / warmup[active], max=1.0)
            if adam:
                b1, b2 = beta1[active], beta2[active]
                step_size = (rate / (1 - b1 ** (step + 1))).float()
                root_correction = torch.sqrt(1 - b2 ** (step + 1)).float()
                b1, b2 = b1.float(), b2.float()
            for p, g, *buffers in zip(params, grads, *state, strict=True):
                if adam:
                    # torch.optim.Adam: m / (1 - b1^t) over sqrt(v / (1 - b2^t)) + eps
                    m, v = buffers
                    m.mul_(b1).add_((1 - b1) * g)
                    v.mul_(b2).add_((1 - b2) * g * g)
                    p.sub_(step_size * m / (v.sqrt() / root_correction + eps[active]))
                else:
                    (velocity,) = buffers
                    velocity.mul_(momentum[active]).add_(g)
                    p.sub_(rate.float() * velocity)
            for k in np.flatnonzero(~keep):
                results[active[k]].diverged = True
            if (step + 1) % every == 0:
                test = _logits(params, data.test_x)
                test_losses = _mean_losses(test, data.test_y.expand(len(active), -1)).tolist()
                for k, loss in enumerate(test_losses):
                    if keep[k]:
                        results[active[k]].test_loss.append(loss)
                        if loss <= target_loss:
                            results[active[k]].steps = step + 1
                            keep[k] = False
        if give_up_mean is not None:
            done = [r.steps for r in results if r.steps is not None]
            unfinished = num - len(done)
            if any(r.diverged for r in results) or (
                unfinished and (sum(done) + (step + 1) * unfinished) / num >= give_up_mean
            ):
                break
        if not keep.all():
            active = active[keep]
            if len(active) == 0:
                break
            params = [p.detach()[keep].clone().requires_grad_() for p in params]
            state = [[b[keep].clone() for b in buffers] for buffers in state]
    return results


def mean_steps(results: Sequence[RunResult]) -> float:
    """The mean steps over runs that all reached their target; inf if one did not."""
    steps = [r.steps for r in results]
    return math.inf if None in steps else float(np.mean(steps))
