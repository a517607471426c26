"""Local SGD and DiLoCo on real processes: an MLP trained with torch.distributed.

The algorithms are those of :mod:`distopt.sim.local_sgd` (which simulates them in numpy):

* ``train_local_sgd``: a ``distopt.launch`` worker training an MLP (``"ddp"``, ``"local"`` or
  ``"diloco"``, with SGD or Adam as the inner optimizer), counting the bytes it all-reduces;
* ``train_local_sgd_single_process``: the same N workers one after the other in one process,
  the baseline the multi-process run must match;
* ``train_local_sgd_variants``: the three variants in one launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from distopt.problems.logistic import make_logistic_data
from distopt.problems.mlp import build_mlp

__all__ = [
    "LocalSGDConfig",
    "inner_optimizer_name",
    "train_local_sgd",
    "train_local_sgd_single_process",
    "train_local_sgd_variants",
]


@dataclass(frozen=True)
class LocalSGDConfig:
    """What every rank (and the single-process baseline) trains."""

    variant: str = "local"  # "ddp" (all-reduce gradients every step), "local" or "diloco"
    local_steps: int = 10  # H: inner steps between averages ("local", "diloco")
    num_steps: int = 40  # inner steps per worker in all (a multiple of local_steps)
    layer_sizes: tuple[int, ...] = (8, 32, 2)  # MLP widths: features, hidden..., classes
    batch_size: int = 16  # examples per worker and step
    lr: float = 0.1  # inner learning rate (of the optimizer `inner` names)
    inner: str = ""  # "sgd" or "adam"; "" = the variant's own: Adam for "diloco", SGD otherwise
    outer_lr: float = 0.7  # DiLoCo's outer Nesterov learning rate (Douillard et al. 2023)
    outer_momentum: float = 0.9  # DiLoCo's outer Nesterov momentum
    seed: int = 0  # initial weights and data


def _check_config(config: LocalSGDConfig) -> None:
    if config.variant not in ("ddp", "local", "diloco"):
        raise ValueError(f"variant must be 'ddp', 'local' or 'diloco', got {config.variant!r}")
    if config.local_steps < 1 or config.num_steps % config.local_steps:
        raise ValueError("num_steps must be a positive multiple of local_steps")
    if config.inner not in ("", "sgd", "adam"):
        raise ValueError(f"inner must be '', 'sgd' or 'adam', got {config.inner!r}")


def inner_optimizer_name(config: LocalSGDConfig) -> str:
    """The optimizer of the inner steps: ``config.inner``, or the variant's own ("adam" for
    "diloco", "sgd" otherwise). "ddp" with "adam" is the control for DiLoCo: the same inner
    optimizer, averaged every step."""
    return config.inner or ("adam" if config.variant == "diloco" else "sgd")


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
    if inner_optimizer_name(config) == "adam":
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
    model = build_mlp(config.layer_sizes, seed=config.seed)
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
        optimizer = _inner_optimizer(ddp, config)
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
                flat = _change(outer_params, model)
                all_reduce_mean(flat)  # one all-reduce for all parameters
                _outer_step(outer, outer_params, flat, model)
    return {
        "weights": [p.detach().numpy().copy() for p in model.parameters()],
        "loss": _full_loss(model, features, labels),
        "bytes_all_reduced": counter["bytes"],
        "num_all_reduces": counter["calls"],
    }


def _change(outer_params: list[torch.Tensor], model: torch.nn.Module) -> torch.Tensor:
    """theta_outer - theta_worker, all parameters in one flat vector (one all-reduce)."""
    with torch.no_grad():
        return parameters_to_vector(outer_params) - parameters_to_vector(model.parameters())


def _outer_step(
    outer: torch.optim.Optimizer,
    outer_params: list[torch.Tensor],
    outer_grad: torch.Tensor,
    model: torch.nn.Module,
) -> None:
    """Apply the averaged change as the outer gradient, then restart the worker from it."""
    pieces = torch.split(outer_grad, [o.numel() for o in outer_params])
    for o, piece in zip(outer_params, pieces, strict=True):
        o.grad = piece.view_as(o).clone()
    outer.step()
    _copy_into(model, outer_params)


def train_local_sgd_single_process(config: LocalSGDConfig, world_size: int) -> dict[str, Any]:
    """The same training with the ``world_size`` workers simulated one after the other.

    "ddp" is SGD on the average of the workers' gradients; "local" and "diloco" average the
    parameter changes every ``local_steps``. Returns ``train_local_sgd``'s keys except the
    byte counts.
    """
    _check_config(config)
    features, labels = _worker_batches(config, world_size)
    models = [build_mlp(config.layer_sizes, seed=config.seed) for _ in range(world_size)]
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
            mean_change = torch.stack([_change(outer_params, m) for m in models]).mean(dim=0)
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
