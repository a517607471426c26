"""LAMB's per-layer norms and global-norm clipping when the parameters are sharded.

With ZeRO-style sharding (section 02) each rank holds one contiguous slice of the flattened
parameters, of their gradients and of the optimizer state, and a layer may be cut between
two ranks. Everything elementwise (Adam's moments, LAMB's direction u) is computed on the
slice alone, but three quantities need the whole model: LAMB's trust ratio ||w_l|| / ||u_l||
of every layer l, and the global gradient norm ||g|| that clipping divides by. Each is a
square root of a *sum of squares*, and sums add across ranks: every rank sums the squares of
the part of each layer it holds (0 for a layer it does not touch), and an **all-reduce of
these partial sums** gives every rank all the norms. Clipping comes first (LAMB's moments
see the clipped gradient), so there are two: the gradient's num_layers sums, then the
2 x num_layers sums of the weights and of u. Together they send 3 x num_layers float64
numbers, whatever the model's size, instead of gathering any parameters.

``sharded_lamb_step`` is a worker for ``distopt.launch``; ``reference_lamb_step`` computes the
same in one process, for comparison::

    from distopt import launch
    from distopt.ranks import sharded_norms_ranks

    per_rank = launch(sharded_norms_ranks.sharded_lamb_step, 2)
    reference = sharded_norms_ranks.reference_lamb_step()
    per_rank[0]["layer_w_norms"], reference["layer_w_norms"]  # equal to ~1e-15

The bench is section 04's problem (``distopt.problems.classify``), in float64: the MLP 16-64-64-8
and the gradient of one batch, which every rank computes whole and then keeps its slice of,
as it would after ZeRO's reduce-scatter. Only the norms' communication is recorded.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distopt.engine import record
from distopt.problems import classify

__all__ = ["layer_squared_norms", "reference_lamb_step", "shard_bounds", "sharded_lamb_step"]

_BATCH = 1024  # examples in the batch whose gradient is clipped and stepped
_LR, _BETAS, _EPS, _WEIGHT_DECAY, _MAX_NORM = 0.05, (0.9, 0.999), 1e-6, 0.01, 0.1


def shard_bounds(num_params: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's slice of a flat vector: contiguous, sizes differ by at most 1."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    base, extra = divmod(num_params, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def layer_squared_norms(shard: torch.Tensor, start: int, layer_sizes: list[int]) -> torch.Tensor:
    """Per layer, the sum of squares of the part of it inside ``shard`` (float64, num_layers).

    shard -- the flat slice [start, start + len(shard)) of the parameters laid end to end,
    layer_sizes -- numel of each layer in that order. A layer outside the slice gives 0.
    """
    stop = start + shard.numel()
    sums = torch.zeros(len(layer_sizes), dtype=torch.float64)
    offset = 0
    for index, size in enumerate(layer_sizes):
        low, high = max(offset, start), min(offset + size, stop)
        if low < high:
            sums[index] = shard[low - start : high - start].double().pow(2).sum()
        offset += size
    return sums


def _bench(seed: int) -> tuple[list[str], list[int], torch.Tensor, torch.Tensor]:
    """Layer names and sizes, the flat float64 weights and the flat gradient of one batch."""
    data = classify.make_classification_data(seed=seed)
    model = classify.make_mlp(data.num_features, data.num_classes, seed=seed).double()
    x, y = data.train_x[:_BATCH].double(), data.train_y[:_BATCH]
    F.cross_entropy(model(x), y).backward()
    names = [name for name, _ in model.named_parameters()]
    sizes = [p.numel() for p in model.parameters()]
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return names, sizes, weights, grads


def _lamb_direction(w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """LAMB's first-step direction m_hat / (sqrt(v_hat) + eps) + weight_decay * w, elementwise."""
    beta1, beta2 = _BETAS
    m_hat = (1 - beta1) * g / (1 - beta1)
    v_hat = (1 - beta2) * g * g / (1 - beta2)
    return m_hat / (v_hat.sqrt() + _EPS) + _WEIGHT_DECAY * w


def _finish(
    names: list[str], sizes: list[int], sums: torch.Tensor, w: torch.Tensor, g: torch.Tensor
) -> dict[str, Any]:
    """From the (3, num_layers) sums of squares: norms, clipped gradient and LAMB step of w, g."""
    w_norms, u_norms, g_norms = sums.sqrt()
    global_norm = math.sqrt(float(sums[2].sum()))
    scale = min(1.0, _MAX_NORM / global_norm)
    ratios = torch.where((w_norms > 0) & (u_norms > 0), w_norms / u_norms, torch.ones_like(w_norms))
    return {
        "layer_names": names,
        "layer_sizes": sizes,
        "layer_w_norms": w_norms.tolist(),
        "layer_u_norms": u_norms.tolist(),
        "layer_g_norms": g_norms.tolist(),
        "global_grad_norm": global_norm,
        "clip_scale": scale,
        "trust_ratios": ratios.tolist(),
        "clipped_grad": (g * scale).tolist(),
    }


def reference_lamb_step(seed: int = 0) -> dict[str, Any]:
    """Single process: the norms, the clipped gradient and the LAMB step of the whole model.

    Returns the keys of ``sharded_lamb_step`` except the communication ones, with
    ``new_weights`` and ``clipped_grad`` the whole flat vectors (lists of floats: the ranks
    return plain Python values).
    """
    names, sizes, weights, grads = _bench(seed)
    clipped = grads * min(1.0, _MAX_NORM / float(grads.norm()))
    u = _lamb_direction(weights, clipped)
    sums = torch.stack(
        [layer_squared_norms(v, 0, sizes) for v in (weights, u, grads)]
    )  # fmt: skip
    out = _finish(names, sizes, sums, weights, grads)
    out["new_weights"] = _apply(weights, u, out["trust_ratios"], 0, sizes).tolist()
    return out


def _apply(
    w: torch.Tensor, u: torch.Tensor, ratios: list[float], start: int, sizes: list[int]
) -> torch.Tensor:
    """w - lr * ratio * u on the slice [start, start + len(w)), with each element's layer ratio."""
    ratio = torch.repeat_interleave(torch.tensor(ratios, dtype=torch.float64), torch.tensor(sizes))
    return w - _LR * ratio[start : start + w.numel()] * u


def sharded_lamb_step(rank: int, world_size: int, seed: int = 0) -> dict[str, Any]:
    """One LAMB step with global-norm clipping on this rank's slice of the flat parameters.

    Run it through ``distopt.launch``. The rank keeps the slice ``shard_bounds`` gives it of
    the weights and of the gradient; the gradient's per-layer squared norms go into one
    all-reduce, from whose total it clips its slice; then the squared norms of its weights
    and of its slice of LAMB's direction u go into a second.

    Returns what ``reference_lamb_step`` returns, for this rank's slice (``new_weights``,
    ``clipped_grad`` are the slice [start, stop)), plus ``start``, ``stop``,
    ``allreduce_calls`` and ``allreduce_bytes`` (what this rank handed to all-reduces).
    """
    names, sizes, weights, grads = _bench(seed)
    start, stop = shard_bounds(weights.numel(), world_size, rank)
    w, g = weights[start:stop].clone(), grads[start:stop].clone()
    del weights, grads  # from here on the rank uses its slice only
    with record.communication() as log:
        g_sums = layer_squared_norms(g, start, sizes)
        dist.all_reduce(g_sums)  # per-layer squared gradient norms, summed over ranks
        clipped = g * min(1.0, _MAX_NORM / math.sqrt(float(g_sums.sum())))
        u = _lamb_direction(w, clipped)
        wu_sums = torch.stack([layer_squared_norms(v, start, sizes) for v in (w, u)])
        dist.all_reduce(wu_sums)  # per-layer squared norms of the weights and of u
    out = _finish(names, sizes, torch.cat([wu_sums, g_sums[None]]), w, g)
    out["new_weights"] = _apply(w, u, out["trust_ratios"], start, sizes).tolist()
    out.update(
        start=start,
        stop=stop,
        allreduce_calls=log.count("all_reduce"),
        allreduce_bytes=log.payload_bytes("all_reduce"),
    )
    return out
