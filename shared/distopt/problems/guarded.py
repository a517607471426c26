"""Section 04's guarded training loop on the classification task: skip spikes, roll back.

:func:`train_guarded` runs :mod:`distopt.problems.classify`'s task with the generic
:class:`distopt.optim.stability.SpikeMonitor` watching every step: a step whose loss or
gradient norm jumps is skipped, repeated spikes restore the last checkpoint at a lower rate.
:func:`bad_batches` spoils chosen batches (mislabelled, mis-normalised) to set it off.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distopt.optim.stability import (
    SpikeMonitor,
    global_grad_norm,
    restore_checkpoint,
    save_checkpoint,
)
from distopt.problems.classify import ClassificationData, batch_indices

__all__ = ["Corrupt", "GuardedHistory", "bad_batches", "train_guarded"]

# A corrupted-batch maker for train_guarded: (step, x, y) -> (x, y).
Corrupt = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class GuardedHistory:
    """Per step (one batch drawn each): what the guarded loop saw and did."""

    train_loss: list[float] = field(default_factory=list)  # nats, before the update
    grad_norm: list[float] = field(default_factory=list)  # global norm, before clipping
    lr: list[float] = field(default_factory=list)  # rate the step would use
    events: list[tuple[int, str]] = field(default_factory=list)  # (step, "skip"/"rollback")
    checkpoint_steps: list[int] = field(default_factory=list)
    rolled_back_to: list[int] = field(default_factory=list)  # checkpoint step, per rollback
    rollback_shift: list[float] = field(default_factory=list)  # ||w_restored - w||, per rollback

    def steps(self, kind: str) -> list[int]:
        return [s for s, k in self.events if k == kind]


def train_guarded(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: ClassificationData,
    *,
    batch_size: int,
    num_steps: int,
    lr_at: Callable[[int], float],
    monitor: SpikeMonitor | None = None,
    checkpoint_every: int = 25,
    lr_backoff: float = 0.5,
    clip_norm: float | None = None,
    corrupt: Corrupt | None = None,
    seed: int = 0,
) -> GuardedHistory:
    """Train with cross-entropy; with a ``monitor``, skip spikes and roll back on repeats.

    Every step draws the next batch (``corrupt`` may spoil it), computes loss and gradient,
    and asks the monitor. "ok": clip to ``clip_norm`` (if given), step, and every
    ``checkpoint_every`` steps save a checkpoint if the monitor is calm. "skip": the update
    is dropped. "rollback": restore the last checkpoint and multiply the rate by
    ``lr_backoff`` from then on; the data stream goes on, so the bad batches are not seen
    again. Without a monitor every step is applied (a loss that is not finite stops it).
    """
    if checkpoint_every < 1 or not 0 < lr_backoff <= 1:
        raise ValueError("need checkpoint_every >= 1 and 0 < lr_backoff <= 1")
    history = GuardedHistory()
    params = [p for p in model.parameters() if p.requires_grad]
    checkpoint = save_checkpoint(model, optimizer, -1)
    history.checkpoint_steps.append(-1)
    lr_scale = 1.0
    n = data.train_x.shape[0]
    for step, idx in enumerate(batch_indices(n, batch_size, num_steps, seed=seed)):
        x, y = data.train_x[idx], data.train_y[idx]
        if corrupt is not None:
            x, y = corrupt(step, x, y)
        lr = lr_at(step) * lr_scale
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        grad_norm = global_grad_norm(params)
        history.train_loss.append(loss.item())
        history.grad_norm.append(grad_norm)
        history.lr.append(lr)
        verdict = "ok" if monitor is None else monitor.check(step, loss.item(), grad_norm)
        if monitor is None and not math.isfinite(loss.item()):
            break
        if verdict == "ok":
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, clip_norm)
            optimizer.step()
            if monitor is not None and (step + 1) % checkpoint_every == 0 and monitor.calm(step):
                checkpoint = save_checkpoint(model, optimizer, step)
                history.checkpoint_steps.append(step)
            continue
        history.events.append((step, verdict))
        if verdict == "rollback":
            before = [p.detach().clone() for p in params]
            restore_checkpoint(checkpoint, model, optimizer)
            history.rolled_back_to.append(checkpoint.step)
            shift = sum(
                float((p.detach() - b).double().pow(2).sum())
                for p, b in zip(params, before, strict=True)
            )
            history.rollback_shift.append(math.sqrt(shift))
            lr_scale *= lr_backoff
            monitor.spike_steps.clear()
    return history


def bad_batches(
    steps: Iterable[int], *, feature_scale: float = 3.0, num_classes: int, seed: int = 0
) -> Corrupt:
    """A ``corrupt`` function for ``train_guarded``: at the given steps, labels are replaced
    by random classes and features multiplied by ``feature_scale`` (a mislabelled,
    mis-normalised shard); other batches pass unchanged."""
    bad = set(steps)

    def corrupt(step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if step not in bad:
            return x, y
        rng = np.random.default_rng([seed, step])
        labels = torch.tensor(rng.integers(0, num_classes, y.shape[0]), dtype=y.dtype)
        return x * feature_scale, labels

    return corrupt
