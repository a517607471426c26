"""Layer-wise adaptive optimizers for very large batches: LARS and LAMB (reference versions).

Both treat every parameter tensor as one *layer* (a weight matrix and its bias are two
layers) and rescale that layer's step by a *trust ratio*, so that the step is a set fraction
of the layer's weight norm whatever the scale of its gradient:

- LARS (You, Gitman & Ginsburg 2017, "Large Batch Training of Convolutional Networks",
  Algorithm 1): local rate ``eta * ||w|| / (||g|| + wd * ||w||)`` on SGD with momentum,
  ``v <- m * v + lr * local * (g + wd * w)``, ``w <- w - v``.
- LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2, with
  phi = identity): the bias-corrected Adam direction plus decoupled weight decay,
  ``u = m_hat / (sqrt(v_hat) + eps) + wd * w``, step ``w <- w - lr * (||w|| / ||u||) * u``.

Where a norm in a ratio is zero (a zero-initialised bias, a zero gradient) the ratio is 1.
Unlike the papers' setups (and most implementations since), which leave biases and
normalisation parameters out of the trust ratio and the weight decay, these classes adapt
every tensor they are given, biases included; pass biases in a separate plain optimizer to
follow You et al. The updates run in the parameter's dtype, in place, under ``torch.no_grad``.
``step_update_ratios`` measures ``||delta w|| / ||w||`` per layer for any optimizer;
``weights_after_steps`` runs an optimizer on one numpy layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import nn

__all__ = [
    "LAMB",
    "LARS",
    "lamb_update_",
    "lars_update_",
    "step_update_ratios",
    "trust_ratio",
    "weights_after_steps",
]


def trust_ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` where both are positive, else 1 (0-dim tensors)."""
    ok = (numerator > 0) & (denominator > 0)
    return torch.where(ok, numerator / torch.where(ok, denominator, 1.0), 1.0)


@torch.no_grad()
def lars_update_(
    param: torch.Tensor,
    grad: torch.Tensor,
    velocity: torch.Tensor,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    trust_coefficient: float,
) -> None:
    """One LARS step for one layer, in place on ``param`` and ``velocity`` (same shape)."""
    w_norm = param.norm()
    local = trust_coefficient * trust_ratio(w_norm, grad.norm() + weight_decay * w_norm)
    velocity.mul_(momentum).add_(lr * local * (grad + weight_decay * param))
    param.sub_(velocity)


@torch.no_grad()
def lamb_update_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> None:
    """One LAMB step (``step`` = 1, 2, ... for bias correction) for one layer, in place."""
    beta1, beta2 = betas
    exp_avg.mul_(beta1).add_((1 - beta1) * grad)
    exp_avg_sq.mul_(beta2).add_((1 - beta2) * grad * grad)
    m_hat = exp_avg / (1 - beta1**step)
    v_hat = exp_avg_sq / (1 - beta2**step)
    update = m_hat / (v_hat.sqrt() + eps) + weight_decay * param
    param.sub_(lr * trust_ratio(param.norm(), update.norm()) * update)


def _check(lr: float, weight_decay: float) -> None:
    if lr < 0 or weight_decay < 0:
        raise ValueError(f"lr and weight_decay must be >= 0, got {lr!r} and {weight_decay!r}")


class _LayerwiseOptimizer(torch.optim.Optimizer):
    """torch's optimizer protocol (closure, parameter groups, per-parameter state) around a
    per-layer update: subclasses write ``_update(param, state, group)`` only."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, self.state[p], group)
        return loss

    def _update(self, param: torch.Tensor, state: dict, group: dict) -> None:
        raise NotImplementedError


class LARS(_LayerwiseOptimizer):
    """SGD with momentum and a per-layer trust ratio (You et al. 2017, Algorithm 1).

    lr -- global rate (the paper's gamma); trust_coefficient -- eta, typically 1e-3.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1.0,
        momentum: float = 0.9,
        *,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
    ) -> None:
        _check(lr, weight_decay)
        if not 0 <= momentum < 1 or trust_coefficient <= 0:
            raise ValueError("need 0 <= momentum < 1 and trust_coefficient > 0")
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay, trust_coefficient=trust_coefficient
        )
        super().__init__(params, defaults)

    def _update(self, param: torch.Tensor, state: dict, group: dict) -> None:
        if "velocity" not in state:
            state["velocity"] = torch.zeros_like(param)
        lars_update_(
            param,
            param.grad,
            state["velocity"],
            lr=group["lr"],
            momentum=group["momentum"],
            weight_decay=group["weight_decay"],
            trust_coefficient=group["trust_coefficient"],
        )


class LAMB(_LayerwiseOptimizer):
    """Adam direction with decoupled weight decay and a per-layer trust ratio (You et al. 2020)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        *,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        _check(lr, weight_decay)
        if not all(0 <= b < 1 for b in betas) or eps <= 0:
            raise ValueError("need 0 <= betas < 1 and eps > 0")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _update(self, param: torch.Tensor, state: dict, group: dict) -> None:
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        state["step"] += 1
        lamb_update_(
            param,
            param.grad,
            state["exp_avg"],
            state["exp_avg_sq"],
            state["step"],
            lr=group["lr"],
            betas=group["betas"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
        )


def step_update_ratios(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Call ``optimizer.step()`` and return ``||w_after - w_before|| / ||w_before||`` per
    named parameter (gradients must already be in ``.grad``)."""
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer.step()
    ratios = {}
    for name, p in model.named_parameters():
        w_norm = before[name].norm().item()
        delta = (p.detach() - before[name]).norm().item()
        ratios[name] = delta / w_norm if w_norm > 0 else float("inf")
    return ratios


def weights_after_steps(
    optimizer_cls: type[torch.optim.Optimizer],
    w0: np.ndarray,
    grads: Iterable[np.ndarray],
    **hyper: float,
) -> list[np.ndarray]:
    """The weights after each step of ``optimizer_cls(**hyper)`` on one float64 layer that
    starts at ``w0`` and is given the gradients ``grads`` in turn (numpy in, numpy out): what
    the exercises' one-layer numpy updates are compared with."""
    p = nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    optimizer = optimizer_cls([p], **hyper)
    weights = []
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
        weights.append(p.detach().numpy().copy())
    return weights
