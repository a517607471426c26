"""Learning-rate scaling with batch size, and the warm-up + cosine schedule.

Linear scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD", sec. 2.1): when the
batch grows k-fold, multiply the SGD learning rate by k, ``lr = base_lr * batch / base_batch``
(their ResNet-50 rule: 0.1 per 256 examples). It holds up to roughly the critical batch size
(McCandlish et al. 2018), beyond which a larger batch no longer buys a proportionally
larger step.

For Adam the matching rule is the square root (Malladi, Lyu, Panigrahi & Arora 2022, "On
the SDEs and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS, Definition 4.2): for
a batch kappa times larger, multiply the rate by sqrt(kappa), multiply 1 - beta1 and
1 - beta2 by kappa and divide eps by sqrt(kappa) (``sqrt_scaled_adam``).

Warm-up (Goyal et al. sec. 2.2) ramps the rate linearly from near zero to its peak over the
first steps, when the weights change fastest and a large rate is unstable; cosine decay
(Loshchilov & Hutter 2017, SGDR, eq. 5, one cycle) then lowers it to ``final_lr``.
"""

from __future__ import annotations

import math

__all__ = ["linear_scaled_lr", "sqrt_scaled_adam", "warmup_cosine_lr"]


def linear_scaled_lr(batch_size: float, base_lr: float = 0.1, base_batch: float = 256) -> float:
    """``base_lr * batch_size / base_batch`` (Goyal et al. 2017): 0.1 per 256 examples."""
    if batch_size <= 0 or base_batch <= 0:
        raise ValueError("batch_size and base_batch must be positive")
    if base_lr < 0:
        raise ValueError(f"base_lr must be >= 0, got {base_lr!r}")
    return base_lr * batch_size / base_batch


def sqrt_scaled_adam(
    batch_size: float,
    base_batch: float,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> dict:
    """Adam's hyperparameters for batch_size, from those tuned at base_batch (Malladi et al.
    2022, the square-root scaling rule): with kappa = batch_size / base_batch,

        lr * sqrt(kappa),  1 - kappa (1 - beta_i) for both betas,  eps / sqrt(kappa).

    Returns dict(lr=, betas=, eps=) for ``torch.optim.Adam``. The rule is derived for kappa
    not too large: ValueError if a scaled beta would not be in [0, 1).
    """
    if batch_size <= 0 or base_batch <= 0:
        raise ValueError("batch_size and base_batch must be positive")
    kappa = batch_size / base_batch
    scaled = tuple(1 - kappa * (1 - beta) for beta in betas)
    if not all(0 <= beta < 1 for beta in scaled):
        raise ValueError(f"batch ratio {kappa:g} is too large for betas {betas}: got {scaled}")
    return dict(lr=lr * math.sqrt(kappa), betas=scaled, eps=eps / math.sqrt(kappa))


def warmup_cosine_lr(
    step: int, *, peak_lr: float, warmup_steps: int, total_steps: int, final_lr: float = 0.0
) -> float:
    """Learning rate at ``step`` (0-based) of a linear warm-up then a cosine decay.

    - ``step < warmup_steps``: ``peak_lr * (step + 1) / warmup_steps`` (the last warm-up
      step reaches the peak; no step runs at rate 0);
    - ``warmup_steps <= step < total_steps``: with
      ``progress = (step - warmup_steps) / (total_steps - warmup_steps)``,
      ``final_lr + (peak_lr - final_lr) * (1 + cos(pi * progress)) / 2``;
    - ``step >= total_steps``: ``final_lr``.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if not 0 <= warmup_steps <= total_steps or total_steps < 1:
        raise ValueError("need 0 <= warmup_steps <= total_steps and total_steps >= 1")
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return final_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return final_lr + (peak_lr - final_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
