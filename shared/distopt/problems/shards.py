"""A tiny classification task split over ranks, and the single-process runs it must equal.

The bench for rank code a student writes (sections 01 and 02): every rank gets its shard of
each step's global batch, possibly of unequal sizes, and a fresh float64 MLP whose weights
differ from rank to rank (rank 0's are the true start, so a rank that never receives them
trains something else). The baselines train one model on the concatenated global batch,
one process, no communication: what data parallelism must reproduce. float64 keeps the
only difference, the order of the gradient sums, near 1e-15.

    problem = ShardedProblem(shard_sizes=(8, 8))
    launch(my_rank_code, problem.world_size, problem)  # each rank: problem.batch(step, rank)
    problem.reference_sgd()                              # the weights they must all end with
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distopt.problems.mlp import build_mlp

__all__ = ["ShardedProblem", "max_abs_diff", "param_bytes"]


@dataclass(frozen=True)
class ShardedProblem:
    """What every rank trains, and how the global batch of each step is split."""

    shard_sizes: tuple[int, ...] = (8, 8)  # examples of each rank per step (the world size)
    layer_sizes: tuple[int, ...] = (6, 16, 16, 3)  # MLP widths: features, hidden..., classes
    steps: int = 4  # optimizer steps
    lr: float = 0.1  # SGD learning rate (Adam uses adam_lr)
    adam_lr: float = 0.01
    micro_batches: int = 1  # per rank and step, for gradient accumulation
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.shard_sizes or min(self.shard_sizes) < self.micro_batches:
            raise ValueError("every shard needs at least micro_batches examples")
        if self.steps < 1 or self.micro_batches < 1:
            raise ValueError("need steps >= 1 and micro_batches >= 1")

    @property
    def world_size(self) -> int:
        return len(self.shard_sizes)

    @property
    def global_batch(self) -> int:
        return sum(self.shard_sizes)

    def new_model(self, rank: int = 0) -> nn.Sequential:
        """A fresh float64 MLP; its weights depend on ``rank`` (rank 0's are the start)."""
        return build_mlp(self.layer_sizes, seed=self.seed * 1000 + rank).double()

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs (global_batch, features) and labels (global_batch,) of one step."""
        rng = np.random.default_rng([self.seed, step])
        x = rng.standard_normal((self.global_batch, self.layer_sizes[0]))
        teacher = np.random.default_rng(self.seed + 99).standard_normal(
            (self.layer_sizes[0], self.layer_sizes[-1])
        )
        y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((len(x), teacher.shape[1])), 1)
        return torch.from_numpy(x), torch.from_numpy(y)

    def batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's shard of step ``step``'s global batch (``shard_sizes[rank]`` examples)."""
        x, y = self.global_batch_at(step)
        start = sum(self.shard_sizes[:rank])
        end = start + self.shard_sizes[rank]
        return x[start:end], y[start:end]

    def micro_batch(self, step: int, rank: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch ``index`` (0 .. micro_batches - 1) of this rank's shard of the step."""
        x, y = self.batch(step, rank)
        pieces = np.array_split(np.arange(len(y)), self.micro_batches)
        return x[pieces[index]], y[pieces[index]]

    def loss_sum(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of the examples given: divided by ``global_batch`` it is their
        share of the step's loss, the mean over the whole global batch."""
        return F.cross_entropy(model(x), y, reduction="sum")

    def reference_sgd(self) -> list[torch.Tensor]:
        """Weights after ``steps`` SGD steps on the mean loss of each global batch."""
        return self._reference(lambda params: torch.optim.SGD(params, lr=self.lr))

    def reference_adam(self) -> list[torch.Tensor]:
        """The same with ``torch.optim.Adam(lr=adam_lr)`` (its default betas and eps)."""
        return self._reference(lambda params: torch.optim.Adam(params, lr=self.adam_lr))

    def _reference(self, make_optimizer) -> list[torch.Tensor]:
        model = self.new_model(0)
        optimizer = make_optimizer(model.parameters())
        for step in range(self.steps):
            x, y = self.global_batch_at(step)
            optimizer.zero_grad()
            (self.loss_sum(model, x, y) / self.global_batch).backward()
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()]


def max_abs_diff(weights: list, reference: list[torch.Tensor]) -> float:
    """Largest absolute difference between two lists of same-shaped tensors or arrays."""
    if len(weights) != len(reference):
        raise ValueError(f"expected {len(reference)} parameter tensors, got {len(weights)}")
    return max(
        float((torch.as_tensor(w, dtype=torch.float64) - r).abs().max())
        for w, r in zip(weights, reference, strict=True)
    )


def param_bytes(model: nn.Module) -> list[int]:
    """Bytes of each parameter tensor, in registration order."""
    return [p.numel() * p.element_size() for p in model.parameters()]
