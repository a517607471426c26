"""The course's one seeded MLP builder: Linear layers with ReLUs between them.

Every section that trains a small MLP (DDP, ZeRO and FSDP2 in 01-02, local SGD in 05, the
large-batch task of 04) builds it here, so that the same seed gives the same weights
wherever it is built: every rank of a process group, and the single-process baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["build_mlp"]


def build_mlp(
    layer_sizes: Sequence[int], *, seed: int = 0, init_gain: float = 1.0
) -> nn.Sequential:
    """A float32 MLP: ``Linear(layer_sizes[i], layer_sizes[i + 1])`` with ReLUs in between.

    PyTorch's default initialisation, with every weight matrix (not the biases) multiplied
    by ``init_gain``: a gain above 1 gives large initial logits and a sharp start, as in a
    deep network without normalisation layers. The weights depend only on ``seed``.
    """
    if len(layer_sizes) < 2 or any(int(size) < 1 for size in layer_sizes):
        raise ValueError(f"layer_sizes needs >= 2 positive widths, got {tuple(layer_sizes)!r}")
    if init_gain <= 0:
        raise ValueError(f"init_gain must be > 0, got {init_gain!r}")
    widths = [int(size) for size in layer_sizes]
    # A local generator state: building the model must not depend on (or disturb) the
    # global RNG of whoever calls this.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for index in range(len(widths) - 1):
            if index > 0:
                layers.append(nn.ReLU())
            layers.append(nn.Linear(widths[index], widths[index + 1]))
            if init_gain != 1.0:
                with torch.no_grad():
                    layers[-1].weight.mul_(init_gain)
        return nn.Sequential(*layers)
