"""Learning-rate scaling with batch size, and the warm-up + cosine schedule.

Linear scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD", sec. 2.1): when the
batch grows k-fold, multiply the SGD learning rate by k, ``lr = base_lr * batch / base_batch``
(their ResNet-50 rule: 0.1 per 256 examples). It holds up to roughly the critical batch size
(McCandlish et al. 2018), beyond which a larger batch no longer buys a proportionally
larger step.

Warm-up (Goyal et al. sec. 2.2) ramps the rate linearly from near zero to its peak over the
first steps, when the weights change fastest and a large rate is unstable; cosine decay
(Loshchilov & Hutter 2017, SGDR, eq. 5, one cycle) then lowers it to ``final_lr``.
"""

from __future__ import annotations

import math

__all__ = ["linear_scaled_lr", "warmup_cosine_lr"]


def linear_scaled_lr(batch_size: float, base_lr: float = 0.1, base_batch: float = 256) -> float:
    """``base_lr * batch_size / base_batch`` (Goyal et al. 2017): 0.1 per 256 examples."""
    if batch_size <= 0 or base_batch <= 0:
        raise ValueError("batch_size and base_batch must be positive")
    if base_lr < 0:
        raise ValueError(f"base_lr must be >= 0, got {base_lr!r}")
    return base_lr * batch_size / base_batch


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
