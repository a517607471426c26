"""Keeping a long run alive: gradient-norm and loss monitoring, skipped steps, checkpoints
and rollback.

At scale a rare bad batch, or a rate too high for the current sharpness, makes the loss
jump; one such step can undo days of training. Large runs therefore watch every step's loss
and gradient norm against their running averages, *skip* a step that looks wrong (its
update is never applied), and after repeated trouble *roll back* to the last checkpoint and
go on with a lower learning rate and fresh data (Chowdhery et al. 2022, PaLM, sec. 5.1:
restart about 100 steps before the spike and skip 200-500 batches; Zhang et al. 2022, OPT
logbook: lower the rate and restart from the last checkpoint).

``SpikeMonitor`` decides per step; ``save_checkpoint`` / ``restore_checkpoint`` copy the
model and optimizer state in memory; ``train_guarded`` is the loop that uses them, and
``bad_batches`` makes a corrupted batch to test it with. The training-project section reuses
them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distopt.classify import ClassificationData, batch_indices

__all__ = [
    "Checkpoint",
    "GuardedHistory",
    "SpikeMonitor",
    "bad_batches",
    "global_grad_norm",
    "restore_checkpoint",
    "save_checkpoint",
    "train_guarded",
]

Corrupt = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def global_grad_norm(params: Iterable[torch.Tensor]) -> float:
    """sqrt of the sum over all parameters of their squared gradient entries (float)."""
    squares = [p.grad.detach().double().pow(2).sum() for p in params if p.grad is not None]
    return math.sqrt(float(sum(squares))) if squares else 0.0


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


@dataclass
class GuardedHistory:
    """Per step (one batch drawn each): what the guarded loop saw and did."""

    train_loss: list[float] = field(default_factory=list)  # nats, before the update
    grad_norm: list[float] = field(default_factory=list)  # global norm, before clipping
    lr: list[float] = field(default_factory=list)  # rate the step would use
    events: list[tuple[int, str]] = field(default_factory=list)  # (step, "skip"/"rollback")
    checkpoint_steps: list[int] = field(default_factory=list)
    rolled_back_to: list[int] = field(default_factory=list)  # checkpoint step, per rollback

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
            restore_checkpoint(checkpoint, model, optimizer)
            history.rolled_back_to.append(checkpoint.step)
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
