"""A tiny classification task split over ranks, and the single-process runs it must equal.

The bench for rank code a student writes (sections 01 and 02): every rank gets its shard of
each step's global batch, possibly of unequal sizes, and a fresh float64 MLP whose weights
differ from rank to rank (rank 0's are the true start, so a rank that never receives them
trains something else). The baselines train one model on the concatenated global batch,
one process, no communication: what data parallelism must reproduce. float64 keeps the
only difference, the order of the gradient sums, near 1e-15.

Inside a process group the bench hands a rank its own shard and its own starting model
only: the whole batch, another rank's shard or model and the single-process answers raise
:class:`ForeignShardError` (:mod:`distopt.problems.own_data`), through every method, the
private ones included, so that rank code cannot skip the communication by training on
everything itself. A copy unpickled in another process (a rank) that is out of its group,
or has left it, is answered nothing (tests/ranks/test_own_data.py tries every method). The
test, outside the ranks, also gets what each message must carry: each rank's share of each
step's gradient (on the SGD and on the Adam trajectory), and Adam's state after each step.

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

import dataclasses
import functools
import os
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distopt.problems.mlp import build_mlp
from distopt.problems.own_data import (
    ForeignShardError,
    RankPart,
    mark_received,
    refuse_inside_ranks,
    refuse_other_rank,
)

__all__ = [
    "ForeignShardError",
    "RankShard",
    "ShardedProblem",
    "flat",
    "max_abs_diff",
    "param_bytes",
]

# What a rank that asked for more than its own shard should do instead.
_OWN_SHARD_ONLY = (
    "Inside a rank, problem.batch(step, rank) and problem.micro_batch(step, rank, k) answer "
    "for your own rank only; the other shards' gradients reach you through the collective "
    "(all-reduce, reduce-scatter), not by computing them yourself."
)

# What a rank that asked for another rank's starting model should do instead.
_OWN_MODEL_ONLY = (
    "Inside a rank, problem.new_model(rank) builds your own rank's model only; rank 0's "
    "starting weights reach the other ranks by a message (dist.broadcast from rank 0)."
)


class _Shards:
    """What the whole problem and a rank's part answer alike: the sizes, a micro-batch of
    ``batch`` (each class's own), and the loss."""

    @property
    def world_size(self) -> int:
        return len(self.shard_sizes)

    @property
    def global_batch(self) -> int:
        return sum(self.shard_sizes)

    def micro_batch(self, step: int, rank: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch ``index`` (0 .. micro_batches - 1) of this rank's rows of the step."""
        x, y = self.batch(step, rank)
        pieces = np.array_split(np.arange(len(y)), self.micro_batches)
        return x[pieces[index]], y[pieces[index]]

    def loss_sum(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of the examples given: divided by ``global_batch`` it is their
        share of the step's loss, the mean over the whole global batch."""
        return F.cross_entropy(model(x), y, reduction="sum")


@dataclass(frozen=True)
class ShardedProblem(_Shards):
    """What every rank trains, and how the global batch of each step is split."""

    shard_sizes: tuple[int, ...] = (8, 8)  # examples of each rank per step (the world size)
    layer_sizes: tuple[int, ...] = (6, 16, 16, 3)  # MLP widths: features, hidden..., classes
    steps: int = 4  # optimizer steps
    lr: float = 0.1  # SGD learning rate (Adam uses adam_lr)
    adam_lr: float = 0.01
    micro_batches: int = 1  # per rank and step, for gradient accumulation
    seed: int = 0
    layer_backward_s: float = 0.0  # emulated compute: wall seconds each Linear's backward sleeps
    # distopt.launch never ships it whole: rank r gets own_part(r) only (engine/own_parts.py)
    ships_by_parts: ClassVar[bool] = True

    def __post_init__(self) -> None:
        # The process that made the bench: the only one where it answers out of a group.
        object.__setattr__(self, "_home_pid", os.getpid())
        if not self.shard_sizes or min(self.shard_sizes) < self.micro_batches:
            raise ValueError("every shard needs at least micro_batches examples")
        if self.steps < 1 or self.micro_batches < 1:
            raise ValueError("need steps >= 1 and micro_batches >= 1")
        if not self.layer_backward_s >= 0:
            raise ValueError(f"layer_backward_s must be >= 0, got {self.layer_backward_s!r}")

    def __reduce__(self) -> tuple:
        # Unpickled in another process (a rank): that process is marked as one that
        # received a bench, before it joins its group (see own_data.mark_received).
        values = tuple(getattr(self, f.name) for f in dataclasses.fields(self))
        return _unpickled, (type(self), values, self._home_pid)

    def new_model(self, rank: int = 0) -> nn.Sequential:
        """A fresh float64 MLP; its weights depend on ``rank`` (rank 0's are the start). With
        ``layer_backward_s``, each Linear's backward first sleeps that long. Inside a rank,
        its own only (rank 0's weights reach the others by a broadcast)."""
        return _emulating_backward(self._bare_model(rank), self.layer_backward_s)

    def own_part(self, rank: int) -> RankShard:
        """What rank ``rank`` holds, built here (outside the ranks): its rows of every step and
        micro-batch, its own starting model's weights, and the settings; no seed, nothing of
        another rank. The checks ship each rank its own (``own_data.OwnParts``)."""
        refuse_other_rank(rank, "part", _OWN_SHARD_ONLY, self._home_pid)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0 .. {self.world_size - 1}, got {rank}")
        rows = tuple(self._rows(step, rank) for step in range(self.steps))
        start = tuple(p.detach().clone() for p in _build_model(self, rank).parameters())
        settings = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "seed"
        }
        return RankShard(rank=rank, rows=rows, start=start, **settings)

    def _bare_model(self, rank: int) -> nn.Sequential:
        refuse_other_rank(rank, "starting model", _OWN_MODEL_ONLY, self._home_pid)
        return _build_model(self, rank)

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs (global_batch, features) and labels (global_batch,) of one step (outside the
        ranks only)."""
        refuse_inside_ranks("problem.global_batch_at()", _OWN_SHARD_ONLY, self._home_pid)
        return self._global_batch(step)

    def _global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        refuse_inside_ranks("problem._global_batch()", _OWN_SHARD_ONLY, self._home_pid)
        return self._rows(step, None)

    def _rows(self, step: int, rank: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s examples: rank ``rank``'s rows, or (``None``, outside the ranks
        only) all of them. The whole batch is drawn here and only the rows asked for leave."""
        if rank is None:
            refuse_inside_ranks("problem._rows(step, None)", _OWN_SHARD_ONLY, self._home_pid)
        else:
            refuse_other_rank(rank, "shard", _OWN_SHARD_ONLY, self._home_pid)
        rng = np.random.default_rng([self.seed, step])
        x = rng.standard_normal((self.global_batch, self.layer_sizes[0]))
        teacher = np.random.default_rng(self.seed + 99).standard_normal(
            (self.layer_sizes[0], self.layer_sizes[-1])
        )
        y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((len(x), teacher.shape[1])), 1)
        if rank is None:
            return torch.from_numpy(x), torch.from_numpy(y)
        start = sum(self.shard_sizes[:rank])
        rows = slice(start, start + self.shard_sizes[rank])
        return torch.from_numpy(x[rows].copy()), torch.from_numpy(y[rows].copy())

    def batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's shard of step ``step``'s global batch (``shard_sizes[rank]`` examples);
        inside a rank, its own only."""
        return self._rows(step, rank)

    def reference_sgd(self) -> list[torch.Tensor]:
        """Weights after ``steps`` SGD steps on the mean loss of each global batch (outside
        the ranks only)."""
        refuse_inside_ranks("problem.reference_sgd()", _OWN_SHARD_ONLY, self._home_pid)
        return self._run("sgd")[-1]["weights"]

    def reference_adam(self) -> list[torch.Tensor]:
        """The same with ``torch.optim.Adam(lr=adam_lr)`` (its default betas and eps)."""
        refuse_inside_ranks("problem.reference_adam()", _OWN_SHARD_ONLY, self._home_pid)
        return self._run("adam")[-1]["weights"]

    def reference_shares(self) -> torch.Tensor:
        """(steps, world_size, P) float64 (outside the ranks only): ``[t, r]`` is rank r's
        share of step t's gradient, flattened in parameter order: the gradient of its shard's
        summed loss over ``global_batch``, at the single-process SGD weights of that step.
        The shares of all ranks add up to the step's gradient: what an all-reduce adds."""
        refuse_inside_ranks("problem.reference_shares()", _OWN_SHARD_ONLY, self._home_pid)
        return torch.stack([record["shares"] for record in self._run("sgd")])

    def reference_adam_shares(self) -> torch.Tensor:
        """Like :meth:`reference_shares`, on single-process Adam's trajectory (outside the
        ranks only): ``[t, r]`` is rank r's share of step t's gradient at the weights Adam
        had before step t, what a ZeRO-1 rank reduce-scatters at that step."""
        refuse_inside_ranks("problem.reference_adam_shares()", _OWN_SHARD_ONLY, self._home_pid)
        return torch.stack([record["shares"] for record in self._run("adam")])

    def reference_adam_states(self) -> list[dict[str, torch.Tensor]]:
        """After each of the ``steps`` Adam steps (outside the ranks only): the weights and
        Adam's first and second moments (``"weights"``, ``"exp_avg"``, ``"exp_avg_sq"``),
        each a flat float64 vector of the P parameters in parameter order."""
        refuse_inside_ranks("problem.reference_adam_states()", _OWN_SHARD_ONLY, self._home_pid)
        found = []
        for record in self._run("adam"):
            found.append({name: flat(record[name]) for name in ("weights", *_ADAM_STATE)})
        return found

    def _run(self, optimizer_name: str) -> list[dict]:
        """One process on each whole global batch: per step, the ranks' shares of the
        gradient (before the step), then the weights and optimizer state after it (outside
        the ranks only)."""
        refuse_inside_ranks("problem._run()", _OWN_SHARD_ONLY, self._home_pid)
        model = _build_model(self, 0)  # no emulated compute: the baselines never sleep
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


@dataclass(frozen=True, eq=False)
class RankShard(_Shards, RankPart):
    """One rank's part of a :class:`ShardedProblem`, as the checks ship it to that rank.

    The same calls as the problem (``batch``, ``micro_batch``, ``new_model``, ``loss_sum``,
    the settings), answered from what the launching process put here: this rank's rows of
    every step and its own starting weights. It holds no seed and no other rank's data, so no
    method, public or private, can answer for another rank: the other shards' gradients and
    rank 0's weights reach this rank by messages only.
    """

    _whole: ClassVar[type] = ShardedProblem  # its methods the part lacks are refused by name
    _instead: ClassVar[str] = _OWN_SHARD_ONLY

    rank: int
    rows: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (x, y) of each step, this rank's
    start: tuple[torch.Tensor, ...]  # this rank's starting parameters, in order (or none)
    shard_sizes: tuple[int, ...]
    layer_sizes: tuple[int, ...]
    steps: int
    lr: float
    adam_lr: float
    micro_batches: int
    layer_backward_s: float

    def _own(self, rank: int, what: str, instead: str) -> None:
        if rank != self.rank:
            raise ForeignShardError(
                f"rank {self.rank} asked for rank {rank}'s {what}: a rank holds only its own "
                f"data. {instead}"
            )

    def batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of step ``step`` (``shard_sizes[rank]`` examples)."""
        self._own(rank, "shard", _OWN_SHARD_ONLY)
        if not 0 <= step < self.steps:
            raise IndexError(f"step must be in 0 .. {self.steps - 1}, got {step}")
        x, y = self.rows[step]
        return x.clone(), y.clone()

    def new_model(self, rank: int = 0) -> nn.Sequential:
        """This rank's starting float64 MLP (for rank 0, the true start)."""
        self._own(rank, "starting model", _OWN_MODEL_ONLY)
        if not self.start:
            raise ForeignShardError(
                f"rank {self.rank} asked for a whole starting model, and this bench ships none: "
                "each rank starts from its own shard of every layer (bench.start_shard(rank, "
                "layer)) and gathers the full weights when it needs them."
            )
        model = build_mlp(self.layer_sizes).double()
        with torch.no_grad():
            for param, value in zip(model.parameters(), self.start, strict=True):
                param.copy_(value)
        return _emulating_backward(model, self.layer_backward_s)


def _emulating_backward(model: nn.Sequential, seconds: float) -> nn.Sequential:
    """With ``seconds`` > 0, each Linear's backward first sleeps that long."""
    if seconds > 0:
        layers = [m for m in model if isinstance(m, nn.Linear)]
        for index, layer in enumerate(layers):
            layer.register_forward_hook(functools.partial(_sleep_in_backward, index, seconds))
    return model


def _build_model(problem: ShardedProblem, rank: int) -> nn.Sequential:
    """Rank ``rank``'s starting MLP, unguarded: for the bench's own methods, which guard."""
    return build_mlp(problem.layer_sizes, seed=problem.seed * 1000 + rank).double()


def _unpickled(cls: type, values: tuple, home_pid: int) -> ShardedProblem:
    """A bench unpickled: in another process than the one that made it, mark that process
    (:func:`distopt.problems.own_data.mark_received`); the copy keeps its maker's pid."""
    if os.getpid() != home_pid:
        mark_received()
    problem = cls(*values)
    object.__setattr__(problem, "_home_pid", home_pid)
    return problem


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
