"""A seeded MLP block cut by Megatron's tensor parallelism: each rank's shards, and the unsplit run.

The bench for section 03's tensor-parallel rank code. The block is

    y = GELU(x @ w_in + b_in) @ w_out + b_out

with x of shape (tokens, hidden), w_in (hidden, 4 hidden) and w_out (4 hidden, hidden), all
float64 (Shoeybi et al. 2019, "Megatron-LM", Section 3, https://arxiv.org/abs/1909.08053).
Megatron splits w_in and b_in by columns and w_out by rows; b_out is added once, after the
all-reduce, so every rank keeps it whole. A rank is handed only its own blocks
(:meth:`MegatronMLP.shard`), so it cannot compute the block without the others.

    problem = MegatronMLP(hidden=8, tokens=4, world_size=2)
    problem.shard(rank)         # rank's blocks, the input and the gradient of the output
    problem.reference()         # the unsplit block in one process: output and every gradient
    problem.gather(per_rank)    # the ranks' shard gradients glued back into whole ones
    problem.partials(rank)      # what rank's g and f all-reduce: its partial output and dx

Inside a process group every method refuses (:mod:`distopt.problems.own_data`): the checks
build each rank's shard in the launching process and ship only that, so no rank holds the
bench, its seed or another rank's blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from distopt.problems.own_data import refuse_inside_ranks

__all__ = ["PARAMS", "MLPReference", "MLPShard", "MegatronMLP", "mlp_block"]

PARAMS = ("w_in", "b_in", "w_out", "b_out")
# What a rank that asked for more than its own blocks should do instead.
_OWN_BLOCKS_ONLY = (
    "Inside a rank, the shard handed to your function holds your blocks; the other ranks' "
    "part of the output and of dloss/dx reach you by the all-reduces of g and f."
)
# How each parameter is split over the ranks: the axis its blocks are cut along (None: whole).
_SPLIT_AXIS = {"w_in": 1, "b_in": 0, "w_out": 0, "b_out": None}


def mlp_block(x: torch.Tensor, weights: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """GELU(x @ w_in + b_in) @ w_out + b_out, GELU in its exact (erf) form, PyTorch's default."""
    hidden = F.gelu(x @ weights["w_in"] + weights["b_in"])
    return hidden @ weights["w_out"] + weights["b_out"]


@dataclass(frozen=True)
class MLPShard:
    """What one rank of the tensor-parallel group holds (float64 tensors, its own copies)."""

    w_in: torch.Tensor  # (hidden, 4 hidden / world_size): this rank's columns of w_in
    b_in: torch.Tensor  # (4 hidden / world_size,): the entries of b_in for those columns
    w_out: torch.Tensor  # (4 hidden / world_size, hidden): this rank's rows of w_out
    b_out: torch.Tensor  # (hidden,): whole on every rank, added once after the all-reduce
    x: torch.Tensor  # (tokens, hidden): the block's input, the same on every rank
    grad_output: torch.Tensor  # (tokens, hidden): dloss/dy, where the backward pass starts


@dataclass(frozen=True)
class MLPReference:
    """The unsplit block run forward and backward in one process."""

    output: torch.Tensor  # (tokens, hidden)
    grads: dict[str, torch.Tensor]  # whole gradient of each parameter, keyed as PARAMS
    input_grad: torch.Tensor  # (tokens, hidden): dloss/dx


@dataclass(frozen=True)
class MegatronMLP:
    """A tensor-parallel MLP block: sizes, seed, and how it is split."""

    # Never in a rank whole: its parts (shard, stage) are built here and shipped to their
    # ranks (engine/own_parts.OwnParts); a copy that would travel with rank code (a
    # notebook global the answer names) travels withheld (engine/shipping.py).
    ships_by_parts: ClassVar[bool] = True

    hidden: int = 8  # model width h; the inner width is 4h
    tokens: int = 4  # rows of the input (tokens x micro-batch, flattened)
    world_size: int = 2  # tensor-parallel ranks; must divide the inner width 4h
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.hidden, self.tokens, self.world_size) < 1:
            raise ValueError("hidden, tokens and world_size must be >= 1")
        if self.inner % self.world_size:
            raise ValueError(f"inner width {self.inner} is not divisible by {self.world_size}")

    @property
    def inner(self) -> int:
        return 4 * self.hidden

    @property
    def activation_bytes(self) -> int:
        """Bytes of one float64 (tokens x hidden) tensor: what f and g each all-reduce."""
        return self.tokens * self.hidden * 8

    def weights(self) -> dict[str, torch.Tensor]:
        """The whole block's parameters, keyed as PARAMS (scaled so activations stay ~1)."""
        refuse_inside_ranks("MegatronMLP.weights()", _OWN_BLOCKS_ONLY)
        rng = np.random.default_rng([self.seed, self.hidden, 1])
        h, f = self.hidden, self.inner
        arrays = {
            "w_in": rng.standard_normal((h, f)) / np.sqrt(h),
            "b_in": 0.1 * rng.standard_normal(f),
            "w_out": rng.standard_normal((f, h)) / np.sqrt(f),
            "b_out": 0.1 * rng.standard_normal(h),
        }
        return {name: torch.from_numpy(a) for name, a in arrays.items()}

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The input x and the gradient of the output, both (tokens, hidden)."""
        refuse_inside_ranks("MegatronMLP.inputs()", _OWN_BLOCKS_ONLY)
        rng = np.random.default_rng([self.seed, self.hidden, self.tokens, 2])
        x = rng.standard_normal((self.tokens, self.hidden))
        grad_output = rng.standard_normal((self.tokens, self.hidden))
        return torch.from_numpy(x), torch.from_numpy(grad_output)

    def split(self, name: str, tensor: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s block of a whole parameter (or of its gradient), a contiguous copy."""
        self._check_rank(rank)
        axis = _SPLIT_AXIS[name]
        if axis is None:
            return tensor.clone()
        return tensor.chunk(self.world_size, dim=axis)[rank].contiguous()

    def shard(self, rank: int) -> MLPShard:
        """What rank ``rank`` is given: its blocks of the weights, the input, dloss/dy."""
        self._check_rank(rank)
        refuse_inside_ranks("MegatronMLP.shard()", _OWN_BLOCKS_ONLY)
        weights = self.weights()
        x, grad_output = self.inputs()
        blocks = {name: self.split(name, weights[name], rank) for name in PARAMS}
        return MLPShard(**blocks, x=x, grad_output=grad_output)

    def reference(self) -> MLPReference:
        """The whole block, forward and backward from ``grad_output``, in one process."""
        refuse_inside_ranks("MegatronMLP.reference()", _OWN_BLOCKS_ONLY)
        weights = {name: w.requires_grad_() for name, w in self.weights().items()}
        x, grad_output = self.inputs()
        x.requires_grad_()
        y = mlp_block(x, weights)
        y.backward(grad_output)
        return MLPReference(
            output=y.detach(),
            grads={name: w.grad for name, w in weights.items()},
            input_grad=x.grad,
        )

    def partials(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What rank ``rank`` all-reduces: its partial output GELU(x w_in_r + b_in_r) w_out_r
        (g's forward; b_out is added after the sum) and its partial dloss/dx through its own
        columns of w_in (f's backward), both (tokens, hidden), from its shard alone."""
        refuse_inside_ranks("MegatronMLP.partials()", _OWN_BLOCKS_ONLY)
        shard = self.shard(rank)
        x = shard.x.clone().requires_grad_()
        partial = F.gelu(x @ shard.w_in + shard.b_in) @ shard.w_out
        partial.backward(shard.grad_output)
        return partial.detach(), x.grad

    def gather(self, shard_grads: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Whole gradients from the ranks' shard gradients (rank order); b_out's is rank 0's."""
        if len(shard_grads) != self.world_size:
            raise ValueError(f"expected {self.world_size} ranks' gradients, got {len(shard_grads)}")
        whole = {}
        for name in PARAMS:
            axis = _SPLIT_AXIS[name]
            pieces = [torch.as_tensor(g[name]) for g in shard_grads]
            whole[name] = pieces[0].clone() if axis is None else torch.cat(pieces, dim=axis)
        return whole

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0..{self.world_size - 1}, got {rank}")
