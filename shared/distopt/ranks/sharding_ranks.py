"""Measured per-rank training state of real ZeRO-1 and FSDP2 runs, on CPU processes.

``measure_sharded_state`` is a worker for ``distopt.launch``: every rank trains one step of
the same small MLP twice, once with DDP + ``ZeroRedundancyOptimizer`` (ZeRO-1: only the
optimizer state is sharded) and once with ``fully_shard`` (FSDP2, i.e. ZeRO-3: parameters,
gradients and optimizer state are all sharded), and reports how many bytes of each it holds,
and, for the ZeRO-1 step, how many bytes DDP all-reduces and ``ZeroRedundancyOptimizer``
broadcasts.

Example (4 ranks)::

    from distopt import launch
    from distopt.ranks.sharding_ranks import measure_sharded_state

    per_rank = launch(measure_sharded_state, 4)
    per_rank[0]["fsdp2"]["param_bytes"]  # bytes of parameters held by rank 0
    per_rank[0]["zero1_comm"]["broadcast_bytes"]  # bytes rank 0 handed to broadcasts

Both runs are checked against a plain single-process Adam step on all ranks' data, so the
measured layouts are known to train the same model.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distopt.engine import record
from distopt.problems.mlp import build_mlp

# ZeRO, FSDP2 and DTensor are imported inside the functions that use them, i.e. only in the
# spawned ranks: a notebook that imports this module to pass measure_sharded_state to launch
# then skips ~1 s of imports, and torch.distributed.optim's import-time DeprecationWarnings
# (dozens, about torch.jit.script, in torch 2.13), which pytest would display.

__all__ = ["DEFAULT_LAYER_SIZES", "measure_sharded_state"]

# Widths of the MLP's layers: Linear(256, 512), ReLU, Linear(512, 512), ..., Linear(256, 10).
DEFAULT_LAYER_SIZES = (256, 512, 512, 256, 10)
# Samples per rank in the training batch. Small: only the state's size matters here.
_BATCH_SIZE_PER_RANK = 8
_LEARNING_RATE = 1e-3
# Adam's per-parameter moments; its scalar "step" counter is not counted as state bytes.
_ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")
# Largest tolerated difference between a sharded run's parameters and the reference's.
_MAX_ABS_DIFF = 1e-5


def measure_sharded_state(
    rank: int,
    world_size: int,
    layer_sizes: Sequence[int] = DEFAULT_LAYER_SIZES,
    seed: int = 0,
) -> dict[str, Any]:
    """Bytes of parameters, gradients and Adam moments this rank holds under ZeRO-1 and FSDP2.

    Run it through ``distopt.launch``. Every rank trains one Adam step on its own batch, with
    each method, and raises if the result differs from a single-process reference step (on
    all ranks' batches at once) by more than 1e-5.

    Returns a dict of plain Python values::

        {
            "rank": int, "world_size": int,
            "num_params": int,              # parameters of the whole model
            "zero1": {"param_bytes": int, "grad_bytes": int, "optimizer_bytes": int},
            "fsdp2": {"param_bytes": int, "grad_bytes": int, "optimizer_bytes": int},
            "zero1_comm": {                 # the ZeRO-1 step's communication, this rank
                "allreduce_bytes": int,     # gradient buckets DDP all-reduced
                "allreduce_calls": int,     # number of those buckets
                "broadcast_bytes": int,     # tensors ZeroRedundancyOptimizer broadcast
                "broadcast_calls": int,
                "broadcast_src_bytes": int, # ... of which this rank was the source
            },
            "max_abs_diff_zero1": float,    # vs the reference step
            "max_abs_diff_fsdp2": float,
        }

    The state ``*_bytes`` are bytes held by this rank; ``optimizer_bytes`` counts Adam's
    ``exp_avg`` and ``exp_avg_sq`` (not its scalar ``step``). The communication counts are
    bytes of the tensors this rank hands to each collective during the training step (not
    the set-up): DDP's all-reduces are counted by a communication hook that performs them
    (the same pre-divided all-reduce as DDP's default), the broadcasts by
    :func:`distopt.engine.record.communication`.
    """
    _check_process_group(world_size)
    base = build_mlp(layer_sizes, seed=seed)
    batches = [_rank_batch(r, layer_sizes, seed) for r in range(world_size)]
    reference = _reference_step(base, batches)

    zero1_bytes, zero1_comm, zero1_params = _zero1_step(base, batches[rank], rank)
    fsdp2_bytes, fsdp2_params = _fsdp2_step(base, batches[rank], world_size)

    diff_zero1 = _max_abs_diff(zero1_params, reference)
    diff_fsdp2 = _max_abs_diff(fsdp2_params, reference)
    # Checked after all the collectives, so that a failure cannot leave other ranks waiting.
    for method, diff in (("ZeRO-1", diff_zero1), ("FSDP2", diff_fsdp2)):
        if not diff <= _MAX_ABS_DIFF:
            raise AssertionError(
                f"rank {rank}: {method} parameters differ from the single-process reference "
                f"step by {diff:.3g} (tolerance {_MAX_ABS_DIFF:g})"
            )
    return {
        "rank": rank,
        "world_size": world_size,
        "num_params": sum(p.numel() for p in base.parameters()),
        "zero1": zero1_bytes,
        "fsdp2": fsdp2_bytes,
        "zero1_comm": zero1_comm,
        "max_abs_diff_zero1": diff_zero1,
        "max_abs_diff_fsdp2": diff_fsdp2,
    }


def _rank_batch(
    rank: int, layer_sizes: Sequence[int], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch: inputs (batch, in_features) and class labels (batch,)."""
    # Any rank can regenerate any other rank's batch, which the reference step needs.
    generator = torch.Generator().manual_seed(1_000 * (seed + 1) + rank)
    inputs = torch.randn(_BATCH_SIZE_PER_RANK, layer_sizes[0], generator=generator)
    labels = torch.randint(0, layer_sizes[-1], (_BATCH_SIZE_PER_RANK,), generator=generator)
    return inputs, labels


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple) -> None:
    inputs, labels = batch
    F.cross_entropy(model(inputs), labels).backward()
    optimizer.step()


def _reference_step(
    base: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> list[torch.Tensor]:
    """Parameters after one plain, single-process Adam step on all ranks' batches.

    The gradient is what data parallelism computes: the average over ranks of each rank's
    mean-loss gradient (the mean loss over the concatenated batches, as the batches are the
    same size). It is accumulated the way DDP does it, each rank's gradient divided by the
    number of ranks and then summed, because Adam's first step, ``g / (|g| + eps)``, turns
    rounding differences in near-zero gradients into differences of ~1e-6 in the weights.
    """
    model = copy.deepcopy(base)
    optimizer = torch.optim.Adam(model.parameters(), lr=_LEARNING_RATE)
    params = list(model.parameters())
    averaged = [torch.zeros_like(p) for p in params]
    for inputs, labels in batches:
        grads = torch.autograd.grad(F.cross_entropy(model(inputs), labels), params)
        for total, grad in zip(averaged, grads, strict=True):
            total.add_(grad / len(batches))
    for param, grad in zip(params, averaged, strict=True):
        param.grad = grad
    optimizer.step()
    return [p.detach().clone() for p in params]


def _zero1_step(
    base: nn.Module, batch: tuple, rank: int
) -> tuple[dict[str, int], dict[str, int], list[torch.Tensor]]:
    """One DDP + ZeroRedundancyOptimizer(Adam) step.

    Returns this rank's state bytes, its communication counts and the full parameters.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(copy.deepcopy(base))
    bucket_bytes: list[int] = []
    model.register_comm_hook(bucket_bytes, _counting_allreduce_hook)
    optimizer = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.Adam, lr=_LEARNING_RATE
    )
    with record.communication() as log:
        _train_step(model, optimizer, batch)
    broadcasts = log.of("broadcast")
    comm_bytes = {
        "allreduce_bytes": sum(bucket_bytes),
        "allreduce_calls": len(bucket_bytes),
        "broadcast_bytes": log.payload_bytes("broadcast"),
        "broadcast_calls": len(broadcasts),
        "broadcast_src_bytes": sum(c.payload_bytes for c in broadcasts if c.peer == rank),
    }
    params = list(model.module.parameters())
    state_bytes = {
        # ZeRO-1 keeps full parameters and (after DDP's all-reduce) full gradients...
        "param_bytes": _tensor_bytes(params),
        "grad_bytes": _tensor_bytes(p.grad for p in params if p.grad is not None),
        # ...and only its own partition's optimizer state, in the wrapped local optimizer.
        "optimizer_bytes": _adam_moment_bytes(optimizer.optim.state),
    }
    return state_bytes, comm_bytes, [p.detach().clone() for p in params]


def _counting_allreduce_hook(
    bucket_bytes: list[int], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: DDP's default averaging all-reduce, bytes noted per bucket.

    Like ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook`` it
    divides the bucket by the world size first and sums it over the ranks; it also appends
    the bucket's bytes to ``bucket_bytes`` (the hook's state).
    """
    buffer = bucket.buffer()
    bucket_bytes.append(buffer.numel() * buffer.element_size())
    buffer.div_(dist.get_world_size())
    work = dist.all_reduce(buffer, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# DDP's register_comm_hook compares the hook's annotations with the real classes, and
# ``from __future__ import annotations`` left them as strings: put the classes back.
_counting_allreduce_hook.__annotations__.update(
    bucket=dist.GradBucket, bucket_bytes=list[int], **{"return": torch.futures.Future[torch.Tensor]}
)


def _fsdp2_step(
    base: nn.Module, batch: tuple, world_size: int
) -> tuple[dict[str, int], list[torch.Tensor]]:
    """One FSDP2 (fully_shard) Adam step: this rank's state bytes, gathered full params."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(base)
    mesh = init_device_mesh("cpu", (world_size,))
    # One FSDP unit per Linear, so each layer is gathered only while it is used, then the
    # root, which owns whatever is left (nothing here) and drives the step's hooks.
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=_LEARNING_RATE)
    _train_step(model, optimizer, batch)
    params = list(model.parameters())
    state_bytes = {
        "param_bytes": _tensor_bytes(_local(p) for p in params),
        "grad_bytes": _tensor_bytes(_local(p.grad) for p in params if p.grad is not None),
        "optimizer_bytes": _adam_moment_bytes(optimizer.state),
    }
    # full_tensor() is an all-gather: every rank calls it for every parameter, in order.
    full_params = [(p.full_tensor() if _is_dtensor(p) else p).detach().clone() for p in params]
    return state_bytes, full_params


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (unpadded), or the tensor itself."""
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def _is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Total bytes of the tensors' elements."""
    return int(sum(t.numel() * t.element_size() for t in tensors))


def _adam_moment_bytes(state: Mapping[Any, Mapping[str, Any]]) -> int:
    """Bytes of this rank's (local shards of) Adam moments in an optimizer's ``state``."""
    return _tensor_bytes(
        _local(param_state[name])
        for param_state in state.values()
        for name in _ADAM_MOMENTS
        if name in param_state
    )


def _max_abs_diff(params: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Largest absolute elementwise difference between two lists of same-shaped tensors."""
    if len(params) != len(reference):
        raise ValueError(f"{len(params)} parameters vs {len(reference)} in the reference")
    return max(float((p - r).abs().max()) for p, r in zip(params, reference, strict=True))


def _check_process_group(world_size: int) -> None:
    if not dist.is_initialized() or dist.get_world_size() != world_size:
        raise RuntimeError(
            "measure_sharded_state(rank, world_size) must run under distopt.launch, e.g. "
            "launch(measure_sharded_state, 4)"
        )
