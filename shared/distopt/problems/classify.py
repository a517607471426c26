"""A seeded synthetic classification problem and a small MLP, for optimizer experiments.

Inputs are Gaussian vectors; labels come from a fixed random two-layer *teacher* network
(the arg-max of its outputs), with a fraction of labels replaced at random so that the loss
cannot reach zero and minibatch gradients are noisy. A student MLP learns it in a few
seconds on one CPU core, which is what the large-batch section needs: many short, seeded
runs at different batch sizes, learning rates and optimizers.

Everything is float32 torch on CPU, and every run is seeded (data, initial weights, batch
order), so a run repeats bit for bit on the same machine and thread count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distopt.problems.mlp import build_mlp

__all__ = [
    "ClassificationData",
    "History",
    "batch_indices",
    "dead_units",
    "evaluate",
    "gradient_noise",
    "make_classification_data",
    "make_mlp",
    "steps_to_loss",
    "train",
]


@dataclass(frozen=True)
class ClassificationData:
    """Train and test sets: features (n, num_features) float32, labels (n,) int64."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @property
    def num_features(self) -> int:
        return self.train_x.shape[1]

    @property
    def num_classes(self) -> int:
        return int(max(self.train_y.max(), self.test_y.max())) + 1


def make_classification_data(
    num_train: int = 8192,
    num_test: int = 2048,
    *,
    num_features: int = 16,
    num_classes: int = 8,
    label_noise: float = 0.05,
    seed: int = 0,
) -> ClassificationData:
    """Labels from a random tanh teacher (num_features -> 32 -> num_classes), seeded.

    label_noise -- fraction of labels replaced by a uniformly random class (0 <= p < 1)
    """
    if num_train < 1 or num_test < 1 or num_features < 1 or num_classes < 2:
        raise ValueError("need num_train, num_test, num_features >= 1 and num_classes >= 2")
    if not 0 <= label_noise < 1:
        raise ValueError(f"label_noise must be in [0, 1), got {label_noise!r}")
    rng = np.random.default_rng(seed)
    n = num_train + num_test
    x = rng.standard_normal((n, num_features))
    w1 = rng.standard_normal((num_features, 32)) * (2.0 / math.sqrt(num_features))
    w2 = rng.standard_normal((32, num_classes))
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1)
    flip = rng.random(n) < label_noise
    y[flip] = rng.integers(0, num_classes, int(flip.sum()))
    xt = torch.tensor(x, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.int64)
    return ClassificationData(xt[:num_train], yt[:num_train], xt[num_train:], yt[num_train:])


def make_mlp(
    num_features: int,
    num_classes: int,
    *,
    hidden: int = 64,
    depth: int = 2,
    init_gain: float = 1.0,
    seed: int = 0,
) -> nn.Sequential:
    """ReLU MLP with ``depth`` hidden layers of width ``hidden``, seeded (``mlp.build_mlp``)."""
    if depth < 0 or hidden < 1:
        raise ValueError("need depth >= 0 and hidden >= 1")
    widths = [num_features] + [hidden] * depth + [num_classes]
    return build_mlp(widths, seed=seed, init_gain=init_gain)


def batch_indices(
    num_examples: int, batch_size: int, num_steps: int, *, seed: int = 0
) -> Iterator[np.ndarray]:
    """``num_steps`` index arrays of ``batch_size``: a fresh permutation per epoch.

    A batch never straddles two epochs (the remainder of an epoch is dropped), so every
    batch holds distinct examples; ``batch_size`` may not exceed ``num_examples``.
    """
    if not 1 <= batch_size <= num_examples:
        raise ValueError(f"batch_size must be in [1, {num_examples}], got {batch_size}")
    rng = np.random.default_rng(seed)
    per_epoch = num_examples // batch_size
    step = 0
    while step < num_steps:
        order = rng.permutation(num_examples)
        for k in range(min(per_epoch, num_steps - step)):
            yield order[k * batch_size : (k + 1) * batch_size]
        step += per_epoch


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy (nats) and accuracy (fraction) of ``model`` on (x, y)."""
    logits = model(x)
    loss = F.cross_entropy(logits, y).item()
    accuracy = (logits.argmax(dim=1) == y).float().mean().item()
    return loss, accuracy


@torch.no_grad()
def dead_units(model: nn.Sequential, x: torch.Tensor) -> list[int]:
    """Per ReLU of ``model`` (in order): how many of its units output 0 for every row of x.

    Such a unit passes no gradient to the weights that feed it, for any of these inputs, so
    gradient descent cannot revive it: it is "dead".
    """
    counts, h = [], x
    for layer in model:
        h = layer(h)
        if isinstance(layer, nn.ReLU):
            counts.append(int(((h > 0).sum(dim=0) == 0).sum()))
    return counts


def gradient_noise(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The simple noise scale of ``model``'s mean cross-entropy over the rows of (x, y).

    For per-example gradients g_i with mean G: ``grad_sq`` = |G|^2, ``trace_sigma`` = tr(Sigma)
    = sum_i |g_i - G|^2 / (n - 1), and ``noise_scale`` = B_simple = tr(Sigma) / |G|^2
    (McCandlish et al. 2018, section 2.2; ``costs.critical_batch.simple_noise_scale`` from the
    per-example gradients themselves). The g_i are never formed: for a Linear layer
    z = a W^T + b, example i's gradient is delta_i a_i^T for W and delta_i for b, with
    delta_i = d loss_i / d z_i, so |g_i|^2 = sum over layers of |delta_i|^2 (|a_i|^2 + 1):
    one forward and one backward pass over (x, y). ``model``: Linear layers (with biases) and
    ReLUs.
    """
    n = x.shape[0]
    if n < 2:
        raise ValueError("need at least 2 examples")
    inputs, outputs, h = [], [], x
    for layer in model:
        if isinstance(layer, nn.Linear):
            inputs.append(h.detach())
            h = layer(h)
            outputs.append(h)
        elif isinstance(layer, nn.ReLU):
            h = layer(h)
        else:
            raise TypeError(f"only Linear and ReLU layers, got {type(layer).__name__}")
    params = list(model.parameters())
    # Summed (not mean) losses: the gradient at z_i is then example i's own delta_i.
    grads = torch.autograd.grad(F.cross_entropy(h, y, reduction="sum"), outputs + params)
    deltas, param_grads = grads[: len(outputs)], grads[len(outputs) :]
    sum_sq = sum(
        float((d.double().pow(2).sum(1) * (a.double().pow(2).sum(1) + 1)).sum())
        for a, d in zip(inputs, deltas, strict=True)
    )
    grad_sq = sum(float((g.double() / n).pow(2).sum()) for g in param_grads)
    trace_sigma = (sum_sq - n * grad_sq) / (n - 1)
    return {"grad_sq": grad_sq, "trace_sigma": trace_sigma, "noise_scale": trace_sigma / grad_sq}


@dataclass
class History:
    """What a run recorded. Evaluation points are on the test set."""

    batch_size: int
    examples_seen: list[int] = field(default_factory=list)  # at each evaluation
    test_loss: list[float] = field(default_factory=list)  # nats, at each evaluation
    test_accuracy: list[float] = field(default_factory=list)  # fraction, at each evaluation
    train_loss: list[float] = field(default_factory=list)  # nats, minibatch, every step
    lr: list[float] = field(default_factory=list)  # learning rate used, every step
    diverged: bool = False  # the loss became inf or nan and the run stopped

    @property
    def final_test_loss(self) -> float:
        return self.test_loss[-1] if not self.diverged else math.inf


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: ClassificationData,
    *,
    batch_size: int,
    num_steps: int,
    lr_at: Callable[[int], float] | None = None,
    eval_every_examples: int = 4096,
    seed: int = 0,
    before_step: Callable[[int, nn.Module], None] | None = None,
) -> History:
    """Minibatch training with cross-entropy; returns the :class:`History`.

    lr_at               -- learning rate for step s = 0, 1, ...; None keeps the optimizer's
    eval_every_examples -- evaluate when the examples seen cross a multiple of this (and at
                           the start and end); a run stops at the first non-finite loss
    before_step         -- called as before_step(s, model) before step s updates the weights
                           (to measure something along the run, e.g. the sharpness)
    """
    history = History(batch_size)

    def record(seen: int) -> None:
        loss, accuracy = evaluate(model, data.test_x, data.test_y)
        history.examples_seen.append(seen)
        history.test_loss.append(loss)
        history.test_accuracy.append(accuracy)

    record(0)
    n = data.train_x.shape[0]
    for step, idx in enumerate(batch_indices(n, batch_size, num_steps, seed=seed)):
        if lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        if before_step is not None:
            before_step(step, model)
        loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
        if not math.isfinite(loss.item()):
            history.diverged = True
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history.train_loss.append(loss.item())
        history.lr.append(optimizer.param_groups[0]["lr"])
        seen = (step + 1) * batch_size
        if seen // eval_every_examples > step * batch_size // eval_every_examples or (
            step == num_steps - 1
        ):
            record(seen)
    if not history.diverged and not all(map(math.isfinite, history.test_loss)):
        history.diverged = True
    return history


def steps_to_loss(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: ClassificationData,
    *,
    batch_size: int,
    target_loss: float,
    max_steps: int,
    lr_at: Callable[[int], float] | None = None,
    eval_every_examples: int = 512,
    seed: int = 0,
) -> int | None:
    """Steps of minibatch training until the test loss first reaches ``target_loss`` (nats).

    The test loss is measured every ``max(1, eval_every_examples // batch_size)`` steps, so
    the count is exact to that granularity. Returns None if the target is not reached within
    ``max_steps`` steps or the loss becomes non-finite. (McCandlish et al. 2018 count the
    steps S(B) to a target loss this way, at the best rate for each batch size B.)
    """
    every = max(1, eval_every_examples // batch_size)
    n = data.train_x.shape[0]
    for step, idx in enumerate(batch_indices(n, batch_size, max_steps, seed=seed)):
        if lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
        if not math.isfinite(loss.item()):
            return None
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % every == 0 and evaluate(model, data.test_x, data.test_y)[0] <= target_loss:
            return step + 1
    return None
