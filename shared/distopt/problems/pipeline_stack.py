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
    problem.boundaries()          # what crosses each cut, per micro-batch: activation, gradient

Inside a process group every method refuses, private ones included
(:mod:`distopt.problems.own_data`): the checks build the stages in the launching process and
ship each rank its own only, so no rank holds the bench, its seed or another stage's layers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from distopt.problems.own_data import refuse_inside_ranks

__all__ = ["PipelineStack", "Stage"]

_OWN_STAGE_ONLY = (
    "Inside a rank, the stage handed to your function holds your layers (and the inputs on "
    "stage 0, the targets on the last): activations and gradients reach you as messages."
)


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

    # Never in a rank whole: its parts (shard, stage) are built here and shipped to their
    # ranks (engine/own_parts.OwnParts); a copy that would travel with rank code (a
    # notebook global the answer names) travels withheld (engine/shipping.py).
    ships_by_parts: ClassVar[bool] = True

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
        refuse_inside_ranks("PipelineStack.full_model()", _OWN_STAGE_ONLY)
        return self._full_model()

    def _full_model(self) -> nn.Sequential:
        refuse_inside_ranks("PipelineStack's layers", _OWN_STAGE_ONLY)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            blocks: list[nn.Module] = []
            for _ in range(self.stages * self.layers_per_stage):
                blocks += [nn.Linear(self.width, self.width), nn.Tanh()]
            return nn.Sequential(*blocks).double()

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of the whole batch, (batch_size, width) each."""
        refuse_inside_ranks("PipelineStack.batch()", _OWN_STAGE_ONLY)
        return self._batch()

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        refuse_inside_ranks("PipelineStack's batch", _OWN_STAGE_ONLY)
        gen = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch_size, self.width, generator=gen, dtype=torch.float64)
        y = torch.randn(self.batch_size, self.width, generator=gen, dtype=torch.float64)
        return x, y

    def stage(self, rank: int) -> Stage:
        """What stage ``rank`` is given: its layers, and the inputs (stage 0) or targets (last)."""
        if not 0 <= rank < self.stages:
            raise ValueError(f"rank must be in 0..{self.stages - 1}, got {rank}")
        refuse_inside_ranks("PipelineStack.stage()", _OWN_STAGE_ONLY)
        x, y = self._batch()
        return Stage(
            model=copy.deepcopy(self._full_model()[self._layers(rank)]),
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
        return [[p.grad for p in model[self._layers(s)].parameters()] for s in range(self.stages)]

    def boundaries(self) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
        """What crosses each cut: ``(activations, gradients)``, each indexed ``[s][k]``: the
        input of stage s for micro-batch k (stage 0's: the micro-batch itself) and the gradient
        of the step's loss (the mean over the whole batch) with respect to it."""
        refuse_inside_ranks("PipelineStack.boundaries()", _OWN_STAGE_ONLY)
        model = self.full_model()
        x, y = self.batch()
        activations: list[list[torch.Tensor]] = [[] for _ in range(self.stages)]
        gradients: list[list[torch.Tensor]] = [[] for _ in range(self.stages)]
        for xm, ym in zip(x.split(self.micro_batch), y.split(self.micro_batch), strict=True):
            cuts, out = [], xm.clone().requires_grad_()
            for s in range(self.stages):
                out.retain_grad()  # the gradient the stage before receives for this input
                cuts.append(out)
                out = model[self._layers(s)](out)
            (((out - ym) ** 2).sum() / self.batch_size).backward()
            for s, cut in enumerate(cuts):
                activations[s].append(cut.detach())
                gradients[s].append(cut.grad)
        return activations, gradients

    def _layers(self, rank: int) -> slice:
        per_stage = 2 * self.layers_per_stage  # a Linear and a Tanh per block
        return slice(rank * per_stage, (rank + 1) * per_stage)
