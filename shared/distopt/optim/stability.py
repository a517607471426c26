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
model and optimizer state in memory. Nothing here knows the task: section 04's guarded loop
(``distopt.problems.classify.train_guarded``) and the training project use them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = [
    "Checkpoint",
    "SpikeMonitor",
    "global_grad_norm",
    "restore_checkpoint",
    "save_checkpoint",
]


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
