"""A tiny classification task split over ranks, and the single-process runs it must equal.

The bench for rank code a student writes (sections 01 and 02): every rank gets its shard of
each step's global batch, possibly of unequal sizes, and a fresh float64 MLP whose weights
differ from rank to rank (rank 0's are the true start, so a rank that never receives them
trains something else). The baselines train one model on the concatenated global batch,
one process, no communication: what data parallelism must reproduce. float64 keeps the
only difference, the order of the gradient sums, near 1e-15.

Inside a process group the bench hands a rank its own shard only: the whole batch, another
rank's shard and the single-process answers raise :class:`ForeignShardError`
(:mod:`distopt.problems.own_data`), so that rank code cannot skip the communication by
training on everything itself. The test, outside the ranks, also gets what each message
must carry: each rank's share of each step's gradient, and Adam's state after each step.

    problem = ShardedProblem(shard_sizes=(8, 8))
    launch(my_rank_code, problem.world_size, problem)  # each rank: problem.batch(step, rank)
    problem.reference_sgd()                              # the weights they must all end with

``layer_backward_s`` emulates a larger model's compute: each ``nn.Linear`` of a rank's model
sleeps that long in the backward pass, before its gradients are computed (inside a
``record_function`` range, ``backward: layer i (emulated)``, for profiler traces), so that a
timeline on :func:`distopt.engine.link.emulated_link` shows overlap as a cluster would,
without occupying a core. The single-process baselines never sleep.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distopt.problems.mlp import build_mlp
from distopt.problems.own_data import ForeignShardError, refuse_inside_ranks, refuse_other_rank

__all__ = ["ForeignShardError", "ShardedProblem", "flat", "max_abs_diff", "param_bytes"]

# What a rank that asked for more than its own shard should do instead.
_OWN_SHARD_ONLY = (
    "Inside a rank, problem.batch(step, rank) and problem.micro_batch(step, rank, k) answer "
    "for your own rank only; the other shards' gradients reach you through the collective "
    "(all-reduce, reduce-scatter), not by computing them yourself."
)


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
    layer_backward_s: float = 0.0  # emulated compute: wall seconds each Linear's backward sleeps

    def __post_init__(self) -> None:
        if not self.shard_sizes or min(self.shard_sizes) < self.micro_batches:
            raise ValueError("every shard needs at least micro_batches examples")
        if self.steps < 1 or self.micro_batches < 1:
            raise ValueError("need steps >= 1 and micro_batches >= 1")
        if not self.layer_backward_s >= 0:
            raise ValueError(f"layer_backward_s must be >= 0, got {self.layer_backward_s!r}")

    @property
    def world_size(self) -> int:
        return len(self.shard_sizes)

    @property
    def global_batch(self) -> int:
        return sum(self.shard_sizes)

    def new_model(self, rank: int = 0) -> nn.Sequential:
        """A fresh float64 MLP; its weights depend on ``rank`` (rank 0's are the start). With
        ``layer_backward_s``, each Linear's backward first sleeps that long."""
        model = self._bare_model(rank)
        if self.layer_backward_s > 0:
            layers = [m for m in model if isinstance(m, nn.Linear)]
            for index, layer in enumerate(layers):
                layer.register_forward_hook(
                    functools.partial(_sleep_in_backward, index, self.layer_backward_s)
                )
        return model

    def _bare_model(self, rank: int) -> nn.Sequential:
        return build_mlp(self.layer_sizes, seed=self.seed * 1000 + rank).double()

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs (global_batch, features) and labels (global_batch,) of one step (outside the
        ranks only)."""
        refuse_inside_ranks("problem.global_batch_at()", _OWN_SHARD_ONLY)
        return self._global_batch(step)

    def _global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        x = rng.standard_normal((self.global_batch, self.layer_sizes[0]))
        teacher = np.random.default_rng(self.seed + 99).standard_normal(
            (self.layer_sizes[0], self.layer_sizes[-1])
        )
        y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((len(x), teacher.shape[1])), 1)
        return torch.from_numpy(x), torch.from_numpy(y)

    def batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's shard of step ``step``'s global batch (``shard_sizes[rank]`` examples);
        inside a rank, its own only."""
        refuse_other_rank(rank, "shard", _OWN_SHARD_ONLY)
        x, y = self._global_batch(step)
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
        """Weights after ``steps`` SGD steps on the mean loss of each global batch (outside
        the ranks only)."""
        refuse_inside_ranks("problem.reference_sgd()", _OWN_SHARD_ONLY)
        return self._run("sgd")[-1]["weights"]

    def reference_adam(self) -> list[torch.Tensor]:
        """The same with ``torch.optim.Adam(lr=adam_lr)`` (its default betas and eps)."""
        refuse_inside_ranks("problem.reference_adam()", _OWN_SHARD_ONLY)
        return self._run("adam")[-1]["weights"]

    def reference_shares(self) -> torch.Tensor:
        """(steps, world_size, P) float64 (outside the ranks only): ``[t, r]`` is rank r's
        share of step t's gradient, flattened in parameter order: the gradient of its shard's
        summed loss over ``global_batch``, at the single-process SGD weights of that step.
        The shares of all ranks add up to the step's gradient: what an all-reduce adds."""
        refuse_inside_ranks("problem.reference_shares()", _OWN_SHARD_ONLY)
        return torch.stack([record["shares"] for record in self._run("sgd")])

    def reference_adam_states(self) -> list[dict[str, torch.Tensor]]:
        """After each of the ``steps`` Adam steps (outside the ranks only): the weights and
        Adam's first and second moments (``"weights"``, ``"exp_avg"``, ``"exp_avg_sq"``),
        each a flat float64 vector of the P parameters in parameter order."""
        refuse_inside_ranks("problem.reference_adam_states()", _OWN_SHARD_ONLY)
        found = []
        for record in self._run("adam"):
            found.append({name: flat(record[name]) for name in ("weights", *_ADAM_STATE)})
        return found

    def _run(self, optimizer_name: str) -> list[dict]:
        """One process on each whole global batch: per step, the ranks' shares of the
        gradient (before the step), then the weights and optimizer state after it."""
        model = self._bare_model(0)  # no emulated compute: the baselines never sleep
        params = list(model.parameters())
        if optimizer_name == "sgd":
            optimizer = torch.optim.SGD(params, lr=self.lr)
        else:
            optimizer = torch.optim.Adam(params, lr=self.adam_lr)
        found = []
        for step in range(self.steps):
            x, y = self._global_batch(step)
            shares = []
            for start, size in zip(
                np.cumsum((0, *self.shard_sizes)), self.shard_sizes, strict=False
            ):
                model.zero_grad()
                piece = slice(int(start), int(start + size))
                (self.loss_sum(model, x[piece], y[piece]) / self.global_batch).backward()
                shares.append(flat([p.grad for p in params]))
            optimizer.zero_grad()
            (self.loss_sum(model, x, y) / self.global_batch).backward()
            optimizer.step()
            state = {
                name: [optimizer.state[p][name].detach().clone() for p in params]
                for name in _ADAM_STATE
                if optimizer_name == "adam"
            }
            weights = [p.detach().clone() for p in params]
            found.append({"shares": torch.stack(shares), "weights": weights, **state})
        return found


_ADAM_STATE = ("exp_avg", "exp_avg_sq")  # torch.optim.Adam's moments, by their state keys


def _sleep_in_backward(
    index: int, seconds: float, module: nn.Module, inputs: tuple, output: torch.Tensor
) -> None:
    """Forward hook: when the gradient reaches this layer's output, sleep ``seconds`` before
    the layer's own backward runs (its weight and bias gradients are ready after it)."""

    def emulated_compute(grad: torch.Tensor) -> None:
        with torch.profiler.record_function(f"backward: layer {index} (emulated)"):
            time.sleep(seconds)

    if output.requires_grad:
        output.register_hook(emulated_compute)


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors flattened and concatenated, float64, in the order given."""
    return torch.cat([torch.as_tensor(t, dtype=torch.float64).reshape(-1) for t in tensors])


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
