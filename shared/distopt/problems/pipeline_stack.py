"""A seeded stack of layers cut into pipeline stages: what each stage holds, and the unsplit run.

The bench for section 03's pipeline rank code. The model is ``stages * layers_per_stage``
blocks of Linear(width, width) + Tanh, float64; stage s holds blocks
``s * layers_per_stage`` to ``(s + 1) * layers_per_stage - 1``. A batch of
``micro_batches * micro_batch`` samples is cut into ``micro_batches`` micro-batches; the loss
is the squared error summed over features and averaged over the whole batch. Stage 0 alone
gets the inputs and the last stage alone the targets (:meth:`PipelineStack.stage`), so no
stage can run the model without the others.

    problem = PipelineStack(stages=2, micro_batches=4)
    problem.stage(rank)           # rank's layers, sizes, and its inputs or targets
    problem.reference_grads()     # each stage's gradients of the unsplit model, whole batch
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["PipelineStack", "Stage"]


@dataclass(frozen=True)
class Stage:
    """What one pipeline stage (one rank) holds."""

    model: nn.Sequential  # this stage's Linear+Tanh blocks (float64, its own copy)
    micro_batches: int  # m: micro-batches per step
    micro_batch: int  # samples per micro-batch
    width: int  # features in and out of every block: a message is (micro_batch, width)
    batch_size: int  # micro_batches * micro_batch: the loss is the mean over all of them
    inputs: list[torch.Tensor] | None  # stage 0: the m micro-batches of inputs, else None
    targets: list[torch.Tensor] | None  # last stage: the m micro-batches of targets, else None

    def loss_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Squared error summed over the samples (and features) given: divided by
        ``batch_size`` it is their share of the step's loss, the mean over the whole batch."""
        return ((output - target) ** 2).sum()


@dataclass(frozen=True)
class PipelineStack:
    """A pipeline-parallel training step: stages, micro-batches, sizes, seed."""

    stages: int = 2  # p: pipeline ranks (the world size)
    micro_batches: int = 4  # m
    micro_batch: int = 2  # samples per micro-batch
    width: int = 8  # features of every layer
    layers_per_stage: int = 2  # Linear+Tanh blocks per stage
    seed: int = 0

    def __post_init__(self) -> None:
        sizes = (self.stages, self.micro_batches, self.micro_batch, self.width)
        if min(sizes) < 1 or self.layers_per_stage < 1:
            raise ValueError(f"every size must be >= 1, got {self}")

    @property
    def world_size(self) -> int:
        return self.stages

    @property
    def batch_size(self) -> int:
        return self.micro_batches * self.micro_batch

    @property
    def message_bytes(self) -> int:
        """Bytes of one float64 (micro_batch x width) message: an activation or its gradient."""
        return self.micro_batch * self.width * 8

    def full_model(self) -> nn.Sequential:
        """The unsplit float64 model; its weights depend only on the seed and the sizes."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            blocks: list[nn.Module] = []
            for _ in range(self.stages * self.layers_per_stage):
                blocks += [nn.Linear(self.width, self.width), nn.Tanh()]
            return nn.Sequential(*blocks).double()

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of the whole batch, (batch_size, width) each."""
        gen = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch_size, self.width, generator=gen, dtype=torch.float64)
        y = torch.randn(self.batch_size, self.width, generator=gen, dtype=torch.float64)
        return x, y

    def stage(self, rank: int) -> Stage:
        """What stage ``rank`` is given: its layers, and the inputs (stage 0) or targets (last)."""
        if not 0 <= rank < self.stages:
            raise ValueError(f"rank must be in 0..{self.stages - 1}, got {rank}")
        x, y = self.batch()
        return Stage(
            model=copy.deepcopy(self._slice(self.full_model(), rank)),
            micro_batches=self.micro_batches,
            micro_batch=self.micro_batch,
            width=self.width,
            batch_size=self.batch_size,
            inputs=list(x.split(self.micro_batch)) if rank == 0 else None,
            targets=list(y.split(self.micro_batch)) if rank == self.stages - 1 else None,
        )

    def reference_grads(self) -> list[list[torch.Tensor]]:
        """Each stage's parameter gradients of the unsplit model on the whole batch's mean loss."""
        model = self.full_model()
        x, y = self.batch()
        (((model(x) - y) ** 2).sum() / self.batch_size).backward()
        return [[p.grad for p in self._slice(model, s).parameters()] for s in range(self.stages)]

    def _slice(self, model: nn.Sequential, rank: int) -> nn.Sequential:
        per_stage = 2 * self.layers_per_stage  # a Linear and a Tanh per block
        return model[rank * per_stage : (rank + 1) * per_stage]
