"""The gradient noise scale of the small GPT, measured the way data-parallel runs measure it.

McCandlish et al. 2018 (appendix A) estimate B_simple = tr(Sigma) / |G|^2 without per-example
gradients, from the squared norms of gradients over two batch sizes: in expectation
|G_b|^2 = |G|^2 + tr(Sigma) / b, so two sizes give both unknowns. (Section 01's
``gradient_noise_scale`` uses per-example gradients and the squared norm of their mean, which
overstates |G|^2 by tr(Sigma)/n: its estimate cannot exceed about n, the examples it saw.)
Here an "example" is one training sequence.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from distopt.project.loop import batch_loss

__all__ = ["noise_scale"]


def _grad_sq(model: nn.Module, tokens: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    batch_loss(model, tokens).backward()
    return float(sum(p.grad.double().pow(2).sum() for p in model.parameters()))


def noise_scale(model: nn.Module, tokens: torch.Tensor, *, small: int) -> dict[str, float]:
    """B_simple (in sequences) of ``model`` on the (batch, seq + 1) ``tokens``.

    The gradient of the whole batch (B = len(tokens)) and the mean squared norm of the
    gradients of its ``len(tokens) // small`` slices of ``small`` sequences give
    ``grad_sq`` (|G|^2), ``trace_sigma`` (tr Sigma, per sequence) and ``noise_scale``.
    """
    big = len(tokens)
    if not 1 <= small < big or big % small:
        raise ValueError(f"small must divide the batch of {big} and be smaller, got {small}")
    g_big = _grad_sq(model, tokens)
    g_small = float(np.mean([_grad_sq(model, part) for part in tokens.split(small)]))
    grad_sq = (big * g_big - small * g_small) / (big - small)
    trace_sigma = (g_small - g_big) / (1 / small - 1 / big)
    model.zero_grad(set_to_none=True)
    return {"grad_sq": grad_sq, "trace_sigma": trace_sigma, "noise_scale": trace_sigma / grad_sq}
