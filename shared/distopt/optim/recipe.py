"""The training project's optimizer recipe: AdamW parameter groups and the learning-rate
schedules of a large language-model run.

The recipe (used by GPT-3, Brown et al. 2020, appendix B; Chinchilla, Hoffmann et al. 2022;
LLaMA, Touvron et al. 2023): AdamW (Loshchilov & Hutter 2019) with beta1 = 0.9,
beta2 = 0.95, weight decay 0.1 on the weight *matrices* only (biases and normalization gains
are not decayed: shrinking them towards zero only fights the normalization), gradient
clipping at global norm 1.0, a linear warm-up then cosine decay to 10 % of the peak, or a
constant rate ended by a short cool-down (warmup-stable-decay, Hägele et al. 2024).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from distopt.optim.schedules import warmup_cosine_lr

__all__ = [
    "ADAMW_BETAS",
    "CLIP_NORM",
    "adamw",
    "adamw_param_groups",
    "cosine_schedule",
    "wsd_schedule",
]

ADAMW_BETAS = (0.9, 0.95)
CLIP_NORM = 1.0


def adamw_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW parameter groups: matrices (``ndim >= 2``) decayed, everything else not.

    Returns ``[{"params": [...], "weight_decay": weight_decay},
    {"params": [...], "weight_decay": 0.0}]`` in the model's parameter order; parameters
    with ``requires_grad=False`` are left out.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def adamw(
    model: nn.Module, *, lr: float, weight_decay: float = 0.1, betas: Iterable[float] = ADAMW_BETAS
) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over :func:`adamw_param_groups` with the recipe's betas."""
    return torch.optim.AdamW(
        adamw_param_groups(model, weight_decay), lr=lr, betas=tuple(betas), weight_decay=0.0
    )


def cosine_schedule(
    step: int, *, peak_lr: float, warmup_steps: int, total_steps: int, final_ratio: float = 0.1
) -> float:
    """Linear warm-up to ``peak_lr``, then cosine decay to ``final_ratio * peak_lr``.

    The same curve as :func:`distopt.optim.schedules.warmup_cosine_lr` with
    ``final_lr = final_ratio * peak_lr``.
    """
    if not 0 <= final_ratio <= 1:
        raise ValueError(f"final_ratio must be in [0, 1], got {final_ratio!r}")
    return warmup_cosine_lr(
        step,
        peak_lr=peak_lr,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        final_lr=final_ratio * peak_lr,
    )


def wsd_schedule(
    step: int, *, peak_lr: float, warmup_steps: int, total_steps: int, cooldown_steps: int
) -> float:
    """Warm-up, stable, decay: linear warm-up, constant ``peak_lr``, then a linear cool-down
    to 0 over the last ``cooldown_steps`` steps (0 from ``total_steps`` on)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if not 0 <= warmup_steps <= total_steps - cooldown_steps or cooldown_steps < 0:
        raise ValueError("need 0 <= warmup_steps <= total_steps - cooldown_steps, cooldown >= 0")
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return 0.0
    cooldown_start = total_steps - cooldown_steps
    if step < cooldown_start:
        return peak_lr
    return peak_lr * (total_steps - step) / cooldown_steps
