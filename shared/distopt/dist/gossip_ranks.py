"""Decentralized SGD on a ring of real ranks: point-to-point messages, no collective.

The algorithm is :func:`distopt.sim.gossip.decentralized_sgd_trajectory`'s, ``X <- W (X - eta G)``
(Koloskova et al. 2020, Algorithm 1) with the ring's Metropolis-Hastings weights (1/3 to the
node itself and 1/3 to each neighbour, :func:`distopt.sim.gossip.ring_weights`); here each
row of ``X`` lives in its own process and the mixing is done by messages:

* :class:`GossipProblem`: the seeded bench. Rank r has its least-squares shard, its own
  first model and, at every step, the same minibatch rows the numpy simulator draws for
  node r, so that :func:`reference_models` (one process, numpy) gives what every rank must
  hold after every step. Inside a process group a rank gets only its own first model and
  gradients (:class:`ForeignShardError` otherwise), as a real node holds only its own data:
  its neighbours' models can reach it only by messages, not by simulating the whole ring;
* :func:`ring_gossip_sgd`: the reference rank code (the answer of section 05's exercise,
  which its test forbids calling): one local step, two ``isend`` and two ``irecv`` with the
  ring neighbours, then the 1/3 average;
* :func:`assert_models_match` and :func:`assert_ring_traffic`: the checks of a student's
  rank code against the simulator and against the traffic gossip should make (two messages
  of the whole model per step, to ranks r - 1 and r + 1 mod n, and no collective), each
  failure saying what was compared.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distopt.dist.record import Recording
from distopt.problems.least_squares import LeastSquares, make_least_squares
from distopt.sim import gossip

__all__ = [
    "ForeignShardError",
    "GossipProblem",
    "assert_models_match",
    "assert_ring_traffic",
    "reference_models",
    "ring_gossip_sgd",
]


class ForeignShardError(RuntimeError):
    """A rank asked the bench for another rank's data (see :class:`GossipProblem`)."""


def _current_rank() -> int | None:
    """This process's rank if it is in a process group, else None (the test's own process)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


@dataclass(frozen=True)
class GossipProblem:
    """What every rank of the ring trains: float64 least squares, one shard per rank."""

    world_size: int = 4  # nodes of the ring, one rank each (>= 2)
    num_features: int = 10  # d: the model is a vector of d float64 weights
    examples_per_node: int = 64  # rows of each rank's shard
    batch_size: int = 8  # rows a rank samples (with replacement) per step
    steps: int = 5  # decentralized SGD steps
    lr: float = 0.1  # step size eta; 0 leaves pure gossip averaging, X <- W X
    start_spread: float = 1.0  # std of the ranks' random first models (0: all start at zero)
    seed: int = 0  # data, first models and minibatches

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"a gossip ring needs at least 2 ranks, got {self.world_size}")
        if min(self.num_features, self.examples_per_node, self.batch_size, self.steps) < 1:
            raise ValueError("num_features, examples_per_node, batch_size and steps must be >= 1")

    @property
    def model_bytes(self) -> int:
        """Bytes of one model: d float64 weights (one gossip message)."""
        return 8 * self.num_features

    def data(self) -> LeastSquares:
        """All ranks' rows, rank 0's first (outside the ranks only)."""
        self._outside_ranks("data")
        return self._data()

    def shards(self) -> list[LeastSquares]:
        """Each rank's shard (examples_per_node contiguous rows of :meth:`data`; outside the
        ranks only)."""
        self._outside_ranks("shards")
        return self._shards()

    def all_rows(self) -> np.ndarray:
        """Minibatch rows (steps, world_size, batch_size): ``[t, r]`` are rank r's at step t,
        drawn as :func:`distopt.sim.gossip.decentralized_sgd` draws them (outside the ranks
        only)."""
        self._outside_ranks("all_rows")
        return self._all_rows()

    def starts(self) -> np.ndarray:
        """The ranks' first models (world_size, d), different on every rank (outside the
        ranks only)."""
        self._outside_ranks("starts")
        return self._starts()

    def start(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s first model, a float64 tensor (d,); inside a rank, its own only."""
        self._own(rank, "first model")
        return torch.from_numpy(self._starts()[rank].copy())

    def gradient(self, step: int, rank: int, model: torch.Tensor) -> torch.Tensor:
        """Minibatch gradient (d,) of rank ``rank``'s mean loss ``1/(2b) ||A w - y||^2`` at
        ``model`` (float64, (d,)), over its rows of step ``step``; inside a rank, its own only."""
        self._own(rank, "gradient")
        if not 0 <= step < self.steps:
            raise ValueError(f"step must be in 0 .. {self.steps - 1}, got {step}")
        shard = self._shards()[rank]
        rows = self._all_rows()[step, rank]
        features = torch.from_numpy(shard.features[rows])
        targets = torch.from_numpy(shard.targets[rows])
        return features.T @ (features @ model - targets) / len(rows)

    # A real node holds only its own shard: inside a process group the bench answers a rank
    # about itself only, so that the neighbours' models must come by messages.
    def _own(self, rank: int, what: str) -> None:
        me = _current_rank()
        if me is not None and rank != me:
            raise ForeignShardError(
                f"rank {me} asked the problem for rank {rank}'s {what}: a rank of the ring holds "
                f"only its own data, so problem.start(rank) and problem.gradient(step, rank, x) "
                f"answer for your own rank only. Your neighbours' models must reach you as "
                f"messages (dist.isend / dist.irecv), not be computed on your rank."
            )

    def _outside_ranks(self, what: str) -> None:
        me = _current_rank()
        if me is not None:
            raise ForeignShardError(
                f"rank {me} called problem.{what}(), which holds every rank's data: inside a rank "
                f"use problem.start(rank) and problem.gradient(step, rank, x) for your own rank, "
                f"and messages (dist.isend / dist.irecv) for your neighbours' models."
            )

    def _data(self) -> LeastSquares:
        return make_least_squares(
            self.world_size * self.examples_per_node, self.num_features, seed=self.seed
        )

    def _shards(self) -> list[LeastSquares]:
        return self._data().shards(self.world_size)

    def _all_rows(self) -> np.ndarray:
        return gossip.minibatch_rows(
            self.world_size,
            self.examples_per_node,
            batch_size=self.batch_size,
            num_steps=self.steps,
            seed=self.seed,
        )

    def _starts(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1])
        return self.start_spread * rng.standard_normal((self.world_size, self.num_features))


def reference_models(problem: GossipProblem) -> np.ndarray:
    """What the ranks must hold: X (steps + 1, world_size, d), ``[t, r]`` rank r's model after
    t steps, from the numpy simulator with the ranks' shards, minibatches and first models."""
    return gossip.decentralized_sgd_trajectory(
        problem.shards(),
        gossip.ring_weights(problem.world_size),
        rows=problem.all_rows(),
        lr=problem.lr,
        start=problem.starts(),
    )


def ring_gossip_sgd(rank: int, world_size: int, problem: GossipProblem) -> torch.Tensor:
    """Decentralized SGD on a ring (a ``launch`` worker): returns this rank's models after
    every step, a float64 tensor (steps + 1, d), row 0 the first model.

    Each step: a local SGD step on this rank's minibatch; the result sent to both
    neighbours and theirs received, all four messages posted before any is waited for (so no
    order of the ranks can deadlock); then the Metropolis-Hastings average, 1/3 each.
    """
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    model = problem.start(rank)
    models = [model]
    for step in range(problem.steps):
        half_step = model - problem.lr * problem.gradient(step, rank, model)
        from_left, from_right = torch.empty_like(half_step), torch.empty_like(half_step)
        requests = [
            dist.isend(half_step, left),
            dist.isend(half_step, right),
            dist.irecv(from_left, left),
            dist.irecv(from_right, right),
        ]
        for request in requests:
            request.wait()
        model = (half_step + from_left + from_right) / 3
        models.append(model)
    return torch.stack(models)


def _known_mistakes(problem: GossipProblem) -> dict[str, np.ndarray]:
    """Trajectories (steps + 1, n, d) of a few wrong updates, to name the one a rank made."""
    n, shards, rows = problem.world_size, problem.shards(), problem.all_rows()

    def run(weights: np.ndarray) -> np.ndarray:
        return gossip.decentralized_sgd_trajectory(
            shards, weights, rows=rows, lr=problem.lr, start=problem.starts()
        )

    shift = np.roll(np.eye(n), 1, axis=1)
    mistakes = {
        "an average over all ranks (gossip mixes with the two ring neighbours only)": run(
            np.full((n, n), 1 / n)
        ),
        "weights 1/2 to itself and 1/4 to each neighbour (Metropolis-Hastings gives 1/3 each "
        "on a ring)": run((2 * np.eye(n) + shift + shift.T) / 4),
        "weights 1/2 to each neighbour and none to itself": run((shift + shift.T) / 2),
        "no mixing at all (each rank only took its own SGD steps)": run(np.eye(n)),
    }
    # Lian et al.'s order, X <- W X - eta G: mix the old models, then step.
    weights, x = gossip.ring_weights(n), problem.starts()
    lian = [x]
    for step_rows in rows:
        grads = np.stack([s.grad(x[i], step_rows[i]) for i, s in enumerate(shards)])
        x = weights @ x - problem.lr * grads
        lian.append(x)
    mistakes["X <- W X - lr G: the old models mixed (the exercise steps first, then mixes)"] = (
        np.stack(lian)
    )
    return mistakes


def assert_models_match(
    results: list[tuple[Any, Recording]], problem: GossipProblem, *, tolerance: float = 1e-12
) -> None:
    """Every rank's models after every step equal its row of :func:`reference_models`.

    results -- what ``launch(traced(fn), ...)`` returned: (models (steps + 1, d), recording)
    """
    expected = reference_models(problem)
    n, d = problem.world_size, problem.num_features
    assert len(results) == n, f"expected results from {n} ranks, got {len(results)}"
    for rank, (value, _) in enumerate(results):
        got = np.asarray(torch.as_tensor(value, dtype=torch.float64))
        assert got.shape == (problem.steps + 1, d), (
            f"rank {rank} of {n} returned shape {got.shape}; expected its models after every "
            f"step, (steps + 1, d) = ({problem.steps + 1}, {d}), row 0 its first model"
        )
        errors = np.abs(got - expected[:, rank]).max(axis=1)
        if errors.max() <= tolerance:
            continue
        step = int(np.argmax(errors > tolerance))
        named = [
            what
            for what, trajectory in _known_mistakes(problem).items()
            if np.abs(got - trajectory[:, rank]).max() <= tolerance
        ]
        diagnosis = (
            f" Its models match {named[0]}."
            if named
            else " Is the gradient taken at this rank's own model, the step taken before the "
            "mixing, and each neighbour's half-step weighted 1/3?"
        )
        raise AssertionError(
            f"rank {rank} of {n}: its model after step {step} differs from node {rank}'s row "
            f"of the numpy simulator X <- W (X - lr G) by {errors[step]:.2e} (tolerance "
            f"{tolerance:g}); expected {np.array2string(expected[step, rank][:3], precision=6)}"
            f"... got {np.array2string(got[step][:3], precision=6)}....{diagnosis}"
        )


def assert_ring_traffic(results: list[tuple[Any, Recording]], problem: GossipProblem) -> None:
    """Every rank sent 2 messages per step, the whole model, one to each ring neighbour,
    received as many from them, and made no collective call."""
    n, steps, size = problem.world_size, problem.steps, problem.model_bytes
    for rank, (_, log) in enumerate(results):
        left, right = (rank - 1) % n, (rank + 1) % n
        neighbours = Counter({left: steps}) + Counter({right: steps})
        collectives = [c.name for c in log.collectives()]
        assert not collectives, (
            f"rank {rank} of {n} called {sorted(set(collectives))}: gossip uses no collective "
            f"(every rank waits in one, and an average over all ranks is not gossip); talk "
            f"only to your two neighbours, with send/recv or isend/irecv. Your traffic: "
            f"{log.summary()}"
        )
        for calls, verb, preposition in ((log.sent(), "sent", "to"),
                                         (log.received(), "received", "from")):  # fmt: skip
            assert len(calls) == 2 * steps, (
                f"rank {rank} of {n} {verb} {len(calls)} messages in {steps} steps; expected 2 "
                f"per step, one {preposition} each neighbour. Your traffic: {log.summary()}"
            )
            peers = Counter(c.peer for c in calls)
            assert None not in peers, (
                f"rank {rank} of {n} {verb} {peers[None]} messages whose peer the recorder did "
                f"not see: give the neighbour's rank as dst= / src= of dist.isend, dist.irecv, "
                f"dist.send or dist.recv (a receive from any source cannot be checked)"
            )
            assert peers == neighbours, (
                f"rank {rank} of {n} {verb} messages {preposition} ranks {dict(peers)} "
                f"(rank: count); expected {steps} {preposition} each ring neighbour, ranks "
                f"{left} and {right} ((rank - 1) % world_size and (rank + 1) % world_size)"
                + (", which with 2 ranks are the same rank" if n == 2 else "")
            )
            sizes = sorted({c.payload_bytes for c in calls})
            assert sizes == [size], (
                f"rank {rank} of {n} {verb} messages of {sizes} bytes; expected each the whole "
                f"model, {problem.num_features} float64 = {size} bytes"
            )
