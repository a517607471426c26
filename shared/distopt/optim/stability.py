"""Keeping a long run alive: gradient-norm and loss monitoring, skipped steps, checkpoints
and rollback.

At scale a rare bad batch, or a rate too high for the current sharpness, makes the loss
jump; one such step can undo days of training. Large runs therefore watch every step's loss
and gradient norm against their running averages, *skip* a step that looks wrong (its
update is never applied), and after repeated trouble *roll back* to the last checkpoint and
go on with a lower learning rate and fresh data (Chowdhery et al. 2022, PaLM, sec. 5.1:
restart about 100 steps before the spike and skip 200-500 batches; Zhang et al. 2022, OPT
logbook: lower the rate and restart from the last checkpoint).

``sharpness`` measures the largest Hessian eigenvalue lambda_max by power iteration on
Hessian-vector products, and ``heavy_ball_max_lr`` turns it into the largest stable rate of
SGD with momentum. Adam's stability is decided by the *preconditioned* sharpness instead,
lambda_max(P^-1 H) with P Adam's denominator (``adam_preconditioner``; ``sharpness(...,
preconditioner=...)``): Cohen et al. 2022 ("Adaptive gradient methods at the edge of
stability") show it rises until it hovers at (2 + 2 beta1) / ((1 - beta1) lr), 38 / lr for
beta1 = 0.9 (``adam_max_preconditioned_sharpness``). ``SpikeMonitor`` decides per step;
``save_checkpoint`` / ``restore_checkpoint`` copy the model and optimizer state in memory.
Nothing here knows the task: section 04's guarded loop (``distopt.problems.guarded.
train_guarded``) and the training project use them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = [
    "Checkpoint",
    "SpikeMonitor",
    "adam_max_preconditioned_sharpness",
    "adam_preconditioner",
    "global_grad_norm",
    "heavy_ball_max_lr",
    "restore_checkpoint",
    "save_checkpoint",
    "sharpness",
]


def global_grad_norm(params: Iterable[torch.Tensor]) -> float:
    """sqrt of the sum over all parameters of their squared gradient entries (float)."""
    squares = [p.grad.detach().double().pow(2).sum() for p in params if p.grad is not None]
    return math.sqrt(float(sum(squares))) if squares else 0.0


def heavy_ball_max_lr(sharpness: float, momentum: float = 0.0) -> float:
    """Largest stable rate of gradient descent with heavy-ball momentum: 2 (1 + mu) / lambda_max.

    On a quadratic with largest curvature lambda_max, the iteration
    v <- mu v + g, w <- w - lr v (PyTorch's SGD) converges iff 0 < lr < 2 (1 + mu) / lambda
    for every curvature lambda (Polyak 1964; Goh 2017, "Why momentum really works", sec. 2);
    momentum = 0 gives plain gradient descent's 2 / lambda_max. sharpness must be > 0 and
    0 <= momentum < 1.
    """
    if not sharpness > 0 or not 0 <= momentum < 1:
        raise ValueError(f"need sharpness > 0 and 0 <= momentum < 1, got {sharpness}, {momentum}")
    return 2 * (1 + momentum) / sharpness


def sharpness(
    loss_fn: Callable[[], torch.Tensor],
    params: Sequence[torch.Tensor],
    *,
    iters: int = 20,
    seed: int = 0,
    start: list[torch.Tensor] | None = None,
    preconditioner: Sequence[torch.Tensor] | None = None,
) -> tuple[float, list[torch.Tensor]]:
    """Largest-magnitude Hessian eigenvalue of ``loss_fn()`` in ``params``, by power iteration.

    With ``preconditioner`` (tensors d > 0 shaped like params, the inverse of a diagonal
    preconditioner P: d = 1 / diag(P)) it is the largest eigenvalue of P^-1 H instead, computed
    as that of the symmetric D^1/2 H D^1/2, which has the same eigenvalues; v is then that
    matrix's eigenvector.

    Each iteration is one Hessian-vector product H v, by double backward (Pearlmutter 1994):
    the gradient of (grad L . v). loss_fn -- recomputes the loss (the same batch every call);
    start -- a vector to begin from (e.g. the previous measurement's, which converges in
    fewer iterations along a run), else a seeded random one. Returns (lambda, v) with v of
    unit norm, as tensors shaped like params; lambda is the Rayleigh quotient v.Hv.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    params = list(params)
    loss = loss_fn()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    if start is None:
        generator = torch.Generator().manual_seed(seed)
        start = [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in params]
    vector = [v.detach().clone() for v in start]
    roots = None if preconditioner is None else [d.detach().sqrt() for d in preconditioner]
    value = 0.0
    for _ in range(iters):
        norm = torch.sqrt(sum((v * v).sum() for v in vector))
        vector = [v / norm for v in vector]
        scaled = vector if roots is None else [r * v for r, v in zip(roots, vector, strict=True)]
        product = torch.autograd.grad(grads, params, grad_outputs=scaled, retain_graph=True)
        if roots is not None:
            product = [r * h for r, h in zip(roots, product, strict=True)]
        value = float(sum((h * v).sum() for h, v in zip(product, vector, strict=True)))
        vector = [h.detach() for h in product]
    norm = torch.sqrt(sum((v * v).sum() for v in vector))
    return value, [v / norm for v in vector]


def adam_preconditioner(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """1 / diag(P) for each of ``params`` from a torch Adam/AdamW's state after its last step:
    P = (1 - beta1^t) (sqrt(v / (1 - beta2^t)) + eps), the matrix the update divides by
    (Cohen et al. 2022, sec. 2), so that ``sharpness(..., preconditioner=...)`` gives
    lambda_max(P^-1 H). The group's learning rate is not part of P."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    out = []
    for p in params:
        state, group = optimizer.state[p], group_of[id(p)]
        beta1, beta2 = group["betas"]
        t = float(state["step"])
        denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt() + group["eps"]
        out.append(1 / ((1 - beta1**t) * denom))
    return out


def adam_max_preconditioned_sharpness(lr: float, beta1: float = 0.9) -> float:
    """(2 + 2 beta1) / ((1 - beta1) lr): Adam's stability threshold for lambda_max(P^-1 H), the
    heavy-ball bound with momentum beta1 applied to the preconditioned problem (38 / lr for
    beta1 = 0.9; Cohen et al. 2022)."""
    if not lr > 0 or not 0 <= beta1 < 1:
        raise ValueError(f"need lr > 0 and 0 <= beta1 < 1, got {lr}, {beta1}")
    return (2 + 2 * beta1) / ((1 - beta1) * lr)


@dataclass
class SpikeMonitor:
    """Flags a step whose loss or gradient norm jumps far above its running average.

    Averages are exponential moving averages over the accepted steps only, so a spike never
    raises the bar for the next one.
    """

    loss_factor: float = 2.0  # a loss above this times its running average is a spike
    grad_factor: float = 5.0  # likewise for the gradient norm (before clipping)
    decay: float = 0.9  # weight of the old average in the moving averages, per step
    min_history: int = 10  # accepted steps before checking (the loss falls fast at first)
    max_spikes: int = 3  # this many spikes within `window` steps trigger a rollback
    window: int = 20  # steps
    mean_loss: float = 0.0  # running average of accepted losses (nats)
    mean_grad_norm: float = 0.0  # running average of accepted gradient norms
    num_accepted: int = 0
    spike_steps: list[int] = field(default_factory=list)  # recent spikes, within `window`

    def check(self, step: int, loss: float, grad_norm: float) -> str:
        """Return "ok" (and update the averages), "skip" or "rollback" for this step."""
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        armed = self.num_accepted >= self.min_history
        if not finite or (
            armed
            and (
                loss > self.loss_factor * self.mean_loss
                or grad_norm > self.grad_factor * self.mean_grad_norm
            )
        ):
            self.spike_steps = [s for s in self.spike_steps if s > step - self.window] + [step]
            return "rollback" if len(self.spike_steps) >= self.max_spikes else "skip"
        if self.num_accepted == 0:
            self.mean_loss, self.mean_grad_norm = loss, grad_norm
        else:
            self.mean_loss = self.decay * self.mean_loss + (1 - self.decay) * loss
            self.mean_grad_norm = self.decay * self.mean_grad_norm + (1 - self.decay) * grad_norm
        self.num_accepted += 1
        return "ok"

    def calm(self, step: int) -> bool:
        """No spike within the last `window` steps: a good moment for a checkpoint."""
        return all(s <= step - self.window for s in self.spike_steps)


@dataclass(frozen=True)
class Checkpoint:
    """In-memory copy of what a restart needs."""

    step: int  # the step after which it was taken (-1: before training)
    model_state: dict
    optimizer_state: dict


def save_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> Checkpoint:
    """Deep copies of the model's and the optimizer's state dicts."""
    return Checkpoint(
        step, copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    )


def restore_checkpoint(
    checkpoint: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load the checkpoint back into ``model`` and ``optimizer`` (the checkpoint is kept)."""
    model.load_state_dict(copy.deepcopy(checkpoint.model_state))
    optimizer.load_state_dict(copy.deepcopy(checkpoint.optimizer_state))
