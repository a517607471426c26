"""Local SGD and DiLoCo: communicate every H steps instead of every step.

*Local SGD* (Stich 2019, "Local SGD converges fast and communicates little"): each of N
workers takes H SGD steps on its own data from the common model, then the workers average
their models with one all-reduce. H = 1 is synchronous data parallelism.

*DiLoCo* (Douillard et al. 2023, "DiLoCo: distributed low-communication training of language
models", Algorithm 1): the H local steps use an *inner* optimizer (AdamW in the paper, Adam
here) whose state stays on the worker; the averaged change of the parameters,
``outer_grad = theta - mean_i(theta_i)``, is then treated as a gradient by an *outer*
optimizer, SGD with Nesterov momentum (outer lr 0.7, momentum 0.9 in the paper).

Two implementations:

* ``simulate_local_sgd``: numpy, N workers in one process, on the least-squares problem,
  with the bytes each worker sends in ring all-reduces counted.
* ``train_local_sgd``: a ``distopt.launch`` worker training an MLP with torch.distributed
  (``"ddp"``, ``"local"`` or ``"diloco"``), counting the bytes it all-reduces;
  ``train_local_sgd_single_process`` runs the same N workers one after the other in one
  process, the baseline the multi-process run must match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from distopt.comm import ring_allreduce_bytes_sent
from distopt.data import make_logistic_data
from distopt.least_squares import LeastSquares
from distopt.sharding import build_mlp

__all__ = [
    "LocalRun",
    "nesterov_outer_step",
    "simulate_local_sgd",
    "LocalSGDConfig",
    "train_local_sgd",
    "train_local_sgd_single_process",
    "train_local_sgd_variants",
]

BYTES_PER_FLOAT32 = 4
# Adam's constants (Kingma & Ba 2015), for the inner optimizer of the numpy simulation.
_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8


def nesterov_outer_step(
    params: np.ndarray, outer_grad: np.ndarray, velocity: np.ndarray, *, lr: float, momentum: float
) -> tuple[np.ndarray, np.ndarray]:
    """One SGD step with Nesterov momentum, as ``torch.optim.SGD(nesterov=True)`` takes it:
    ``v <- momentum * v + g``; ``params <- params - lr * (g + momentum * v)``.

    Returns (new params, new velocity); the inputs are not modified.
    """
    velocity = momentum * velocity + outer_grad
    return params - lr * (outer_grad + momentum * velocity), velocity


@dataclass(frozen=True)
class LocalRun:
    """One simulated run, recorded after every averaging round."""

    steps: np.ndarray  # (num_rounds + 1,) local steps each worker has taken
    bytes_sent: np.ndarray  # (num_rounds + 1,) bytes each worker has sent (ring all-reduce)
    excess_loss: np.ndarray  # (num_rounds + 1,) f(average model) - f(w*) on all the data


def simulate_local_sgd(
    shards: list[LeastSquares],
    *,
    num_rounds: int,
    local_steps: int,
    lr: float,
    batch_size: int = 8,
    inner: str = "sgd",
    outer_lr: float = 1.0,
    outer_momentum: float = 0.0,
    seed: int = 0,
) -> LocalRun:
    """Local SGD (``inner="sgd"``, outer_lr 1, momentum 0) or DiLoCo (``inner="adam"``,
    outer_lr 0.7, momentum 0.9) with ``len(shards)`` workers, starting from zero.

    Each round: every worker takes ``local_steps`` inner steps on minibatches of its shard,
    then one all-reduce of the d float32 parameter changes, then the outer Nesterov step.
    """
    if inner not in ("sgd", "adam"):
        raise ValueError(f"inner must be 'sgd' or 'adam', got {inner!r}")
    if num_rounds < 0 or local_steps < 1:
        raise ValueError("num_rounds must be >= 0 and local_steps >= 1")
    num_workers = len(shards)
    full = LeastSquares(
        np.concatenate([s.features for s in shards]), np.concatenate([s.targets for s in shards])
    )
    best = full.loss(full.minimum())
    dim = full.num_features
    rng = np.random.default_rng(seed)
    round_bytes = ring_allreduce_bytes_sent(dim * BYTES_PER_FLOAT32, num_workers)
    global_w = np.zeros(dim)
    velocity = np.zeros(dim)
    m = np.zeros((num_workers, dim))  # Adam moments, per worker, kept across rounds
    v = np.zeros((num_workers, dim))
    adam_steps = 0
    losses = [full.loss(global_w) - best]
    for _ in range(num_rounds):
        local = np.tile(global_w, (num_workers, 1))
        for _ in range(local_steps):
            rows = rng.integers(0, len(shards[0].targets), (num_workers, batch_size))
            grads = np.stack([s.grad(local[i], rows[i]) for i, s in enumerate(shards)])
            if inner == "sgd":
                local -= lr * grads
            else:
                adam_steps += 1
                m = _BETA1 * m + (1 - _BETA1) * grads
                v = _BETA2 * v + (1 - _BETA2) * grads**2
                m_hat = m / (1 - _BETA1**adam_steps)
                v_hat = v / (1 - _BETA2**adam_steps)
                local -= lr * m_hat / (np.sqrt(v_hat) + _EPS)
        outer_grad = global_w - local.mean(axis=0)  # the all-reduce
        global_w, velocity = nesterov_outer_step(
            global_w, outer_grad, velocity, lr=outer_lr, momentum=outer_momentum
        )
        loss = full.loss(global_w) - best
        losses.append(loss if np.isfinite(loss) else np.inf)
    rounds = np.arange(num_rounds + 1)
    return LocalRun(rounds * local_steps, rounds * round_bytes, np.array(losses))


# ----------------------------------------------------------------------------------------
# The real engine: torch.distributed on CPU processes.


@dataclass(frozen=True)
class LocalSGDConfig:
    """What every rank (and the single-process baseline) trains."""

    variant: str = "local"  # "ddp" (all-reduce gradients every step), "local" or "diloco"
    local_steps: int = 10  # H: inner steps between averages ("local", "diloco")
    num_steps: int = 40  # inner steps per worker in all (a multiple of local_steps)
    layer_sizes: tuple[int, ...] = (8, 32, 2)  # MLP widths: features, hidden..., classes
    batch_size: int = 16  # examples per worker and step
    lr: float = 0.1  # inner learning rate (SGD for "ddp"/"local", Adam for "diloco")
    outer_lr: float = 0.7  # DiLoCo's outer Nesterov learning rate (Douillard et al. 2023)
    outer_momentum: float = 0.9  # DiLoCo's outer Nesterov momentum
    seed: int = 0  # initial weights and data


def _check_config(config: LocalSGDConfig) -> None:
    if config.variant not in ("ddp", "local", "diloco"):
        raise ValueError(f"variant must be 'ddp', 'local' or 'diloco', got {config.variant!r}")
    if config.local_steps < 1 or config.num_steps % config.local_steps:
        raise ValueError("num_steps must be a positive multiple of local_steps")


def _worker_batches(config: LocalSGDConfig, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (world_size, num_steps, batch, in) and labels (world_size, num_steps, batch)."""
    total = world_size * config.num_steps * config.batch_size
    features, labels = make_logistic_data(total, config.layer_sizes[0], seed=config.seed)
    shape = (world_size, config.num_steps, config.batch_size)
    return (
        torch.from_numpy(features).float().reshape(*shape, -1),
        torch.from_numpy(labels).long().reshape(shape),
    )


def _inner_optimizer(model: torch.nn.Module, config: LocalSGDConfig) -> torch.optim.Optimizer:
    if config.variant == "diloco":
        return torch.optim.Adam(model.parameters(), lr=config.lr)
    return torch.optim.SGD(model.parameters(), lr=config.lr)


def _outer_optimizer(params: list[torch.Tensor], config: LocalSGDConfig) -> torch.optim.Optimizer:
    if config.variant == "diloco":
        return torch.optim.SGD(
            params, lr=config.outer_lr, momentum=config.outer_momentum, nesterov=True
        )
    return torch.optim.SGD(params, lr=1.0)  # plain averaging: theta <- theta - outer_grad


def _full_loss(model: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(features.flatten(0, 2)), labels.flatten()))


def train_local_sgd(rank: int, world_size: int, config: LocalSGDConfig) -> dict[str, Any]:
    """Train on this rank's data, averaging over the ranks as ``config.variant`` says
    (a ``launch`` worker).

    Returns ``{"weights": [np.ndarray, ...], "loss": float, "bytes_all_reduced": int,
    "num_all_reduces": int}``: the final weights (the same on every rank), the loss on all
    ranks' data, and the payload bytes this rank handed to ``all_reduce`` calls.
    """
    _check_config(config)
    features, labels = _worker_batches(config, world_size)
    model = build_mlp(config.layer_sizes, config.seed)
    counter = {"bytes": 0, "calls": 0}

    def all_reduce_mean(tensor: torch.Tensor) -> None:
        counter["bytes"] += tensor.numel() * tensor.element_size()
        counter["calls"] += 1
        dist.all_reduce(tensor)
        tensor.div_(world_size)

    if config.variant == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # No annotations: DDP checks a hook's annotations, and this module's are strings.
        def counting_hook(state, bucket):
            tensor = bucket.buffer()
            counter["bytes"] += tensor.numel() * tensor.element_size()
            counter["calls"] += 1
            tensor.div_(world_size)
            work = dist.all_reduce(tensor, async_op=True)
            return work.get_future().then(lambda future: future.value()[0])

        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, counting_hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=config.lr)
        for step in range(config.num_steps):
            optimizer.zero_grad()
            F.cross_entropy(ddp(features[rank, step]), labels[rank, step]).backward()
            optimizer.step()
    else:
        optimizer = _inner_optimizer(model, config)
        outer_params = [p.detach().clone() for p in model.parameters()]
        outer = _outer_optimizer(outer_params, config)
        for step in range(config.num_steps):
            optimizer.zero_grad()
            F.cross_entropy(model(features[rank, step]), labels[rank, step]).backward()
            optimizer.step()
            if (step + 1) % config.local_steps == 0:
                flat = torch.cat(
                    [
                        (o - p.detach()).flatten()
                        for o, p in zip(outer_params, model.parameters(), strict=True)
                    ]
                )
                all_reduce_mean(flat)  # one all-reduce for all parameters
                _outer_step(outer, outer_params, flat, model)
    return {
        "weights": [p.detach().numpy().copy() for p in model.parameters()],
        "loss": _full_loss(model, features, labels),
        "bytes_all_reduced": counter["bytes"],
        "num_all_reduces": counter["calls"],
    }


def _outer_step(
    outer: torch.optim.Optimizer,
    outer_params: list[torch.Tensor],
    outer_grad: torch.Tensor,
    model: torch.nn.Module,
) -> None:
    """Apply the averaged change as the outer gradient, then restart the worker from it."""
    offset = 0
    for o in outer_params:
        o.grad = outer_grad[offset : offset + o.numel()].view_as(o).clone()
        offset += o.numel()
    outer.step()
    with torch.no_grad():
        for o, p in zip(outer_params, model.parameters(), strict=True):
            p.copy_(o)


def train_local_sgd_single_process(config: LocalSGDConfig, world_size: int) -> dict[str, Any]:
    """The same training with the ``world_size`` workers simulated one after the other.

    "ddp" is SGD on the average of the workers' gradients; "local" and "diloco" average the
    parameter changes every ``local_steps``. Returns ``train_local_sgd``'s keys except the
    byte counts.
    """
    _check_config(config)
    features, labels = _worker_batches(config, world_size)
    models = [build_mlp(config.layer_sizes, config.seed) for _ in range(world_size)]
    optimizers = [_inner_optimizer(m, config) for m in models]
    outer_params = [p.detach().clone() for p in models[0].parameters()]
    outer = _outer_optimizer(outer_params, config)
    for step in range(config.num_steps):
        for rank, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            optimizer.zero_grad()
            F.cross_entropy(model(features[rank, step]), labels[rank, step]).backward()
        if config.variant == "ddp":
            for params in zip(*(m.parameters() for m in models), strict=True):
                mean_grad = torch.stack([p.grad for p in params]).mean(dim=0)
                for p in params:
                    p.grad = mean_grad.clone()
        for optimizer in optimizers:
            optimizer.step()
        if config.variant != "ddp" and (step + 1) % config.local_steps == 0:
            changes = [
                torch.cat(
                    [
                        (o - p.detach()).flatten()
                        for o, p in zip(outer_params, m.parameters(), strict=True)
                    ]
                )
                for m in models
            ]
            mean_change = torch.stack(changes).mean(dim=0)
            _outer_step(outer, outer_params, mean_change, models[0])
            for model in models[1:]:
                _copy_into(model, outer_params)
    return {
        "weights": [p.detach().numpy().copy() for p in models[0].parameters()],
        "loss": _full_loss(models[0], features, labels),
    }


def _copy_into(model: torch.nn.Module, params: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, source in zip(model.parameters(), params, strict=True):
            p.copy_(source)


def train_local_sgd_variants(
    rank: int, world_size: int, configs: list[LocalSGDConfig]
) -> list[dict[str, Any]]:
    """``train_local_sgd`` for each config in turn, in the same processes (one launch for
    all: spawning costs seconds)."""
    return [train_local_sgd(rank, world_size, config) for config in configs]
