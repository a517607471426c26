"""Decentralized SGD on a ring of real ranks: point-to-point messages, no collective.

The algorithm is :func:`distopt.sim.gossip.decentralized_sgd_trajectory`'s, ``X <- W (X - eta G)``
(Koloskova et al. 2020, Algorithm 1) with the ring's Metropolis-Hastings weights (1/3 to the
node itself and 1/3 to each neighbour, :func:`distopt.sim.gossip.ring_weights`); here each
row of ``X`` lives in its own process and the mixing is done by messages:

* :class:`GossipProblem`: the seeded bench. Rank r has its least-squares shard, its own
  first model and, at every step, the same minibatch rows the numpy simulator draws for
  node r, so that :func:`reference_models` (one process, numpy) gives what every rank must
  hold after every step. Inside a process group a rank gets only its own first model and
  gradients (:class:`~distopt.problems.own_data.ForeignShardError` otherwise), as a real
  node holds only its own data: its neighbours' models can reach it only by messages, not
  by simulating the whole ring;
* :func:`ring_gossip_sgd`: the reference rank code (the answer of section 05's exercise,
  which its test forbids calling): one local step, two ``isend`` and two ``irecv`` with the
  ring neighbours, then the 1/3 average.

The checks of a student's rank code against the simulator and against the traffic gossip
should make are in :mod:`distopt.ranks.gossip_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from distopt.problems.least_squares import LeastSquares, make_least_squares
from distopt.problems.own_data import (
    ForeignShardError,
    KeepsHome,
    refuse_inside_ranks,
    refuse_other_rank,
)
from distopt.sim import gossip

__all__ = [
    "ForeignShardError",
    "GossipProblem",
    "reference_models",
    "ring_gossip_sgd",
]


# What a rank that asked for more than its own data should do instead.
_OWN_DATA_ONLY = (
    "Inside a rank, problem.start(rank) and problem.gradient(step, rank, x) answer for your own "
    "rank only; your neighbours' models must reach you as messages (dist.isend / dist.irecv), "
    "not be computed on your rank."
)


@dataclass(frozen=True)
class GossipProblem(KeepsHome):
    """What every rank of the ring trains: float64 least squares, one shard per rank.

    Inside a rank every method, the private ones included, answers for that rank only
    (:meth:`start`, :meth:`gradient`) or refuses (everything that holds several ranks' data);
    so does a copy in a rank that has left its group (:class:`~distopt.problems.own_data.
    KeepsHome`). tests/ranks/test_own_data_05_06.py calls every method inside ranks.
    """

    world_size: int = 4  # nodes of the ring, one rank each (>= 2)
    num_features: int = 10  # d: the model is a vector of d float64 weights
    examples_per_node: int = 64  # rows of each rank's shard
    batch_size: int = 8  # rows a rank samples (with replacement) per step
    steps: int = 5  # decentralized SGD steps
    lr: float = 0.1  # step size eta; 0 leaves pure gossip averaging, X <- W X
    start_spread: float = 1.0  # std of the ranks' random first models (0: all start at zero)
    seed: int = 0  # data, first models and minibatches

    def __post_init__(self) -> None:
        self._remember_home()
        if self.world_size < 2:
            raise ValueError(f"a gossip ring needs at least 2 ranks, got {self.world_size}")
        if min(self.num_features, self.examples_per_node, self.batch_size, self.steps) < 1:
            raise ValueError("num_features, examples_per_node, batch_size and steps must be >= 1")

    @property
    def model_bytes(self) -> int:
        """Bytes of one model: d float64 weights (one gossip message)."""
        return 8 * self.num_features

    # --- what only the test may see ----------------------------------------------------------
    def data(self) -> LeastSquares:
        """All ranks' rows, rank 0's first (outside the ranks only)."""
        self._outside_ranks("data")
        return make_least_squares(
            self.world_size * self.examples_per_node, self.num_features, seed=self.seed
        )

    def shards(self) -> list[LeastSquares]:
        """Each rank's shard (examples_per_node contiguous rows of :meth:`data`; outside the
        ranks only)."""
        self._outside_ranks("shards")
        return self.data().shards(self.world_size)

    def all_rows(self) -> np.ndarray:
        """Minibatch rows (steps, world_size, batch_size): ``[t, r]`` are rank r's at step t,
        drawn as :func:`distopt.sim.gossip.decentralized_sgd` draws them (outside the ranks
        only)."""
        self._outside_ranks("all_rows")
        return gossip.minibatch_rows(
            self.world_size,
            self.examples_per_node,
            batch_size=self.batch_size,
            num_steps=self.steps,
            seed=self.seed,
        )

    def starts(self) -> np.ndarray:
        """The ranks' first models (world_size, d), different on every rank (outside the
        ranks only)."""
        self._outside_ranks("starts")
        rng = np.random.default_rng([self.seed, 1])
        return self.start_spread * rng.standard_normal((self.world_size, self.num_features))

    # --- what a rank may ask, about itself only ----------------------------------------------
    def start(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s first model, a float64 tensor (d,); inside a rank, its own only."""
        self._own(rank, "first model")
        rng = np.random.default_rng([self.seed, 1])
        first = self.start_spread * rng.standard_normal((self.world_size, self.num_features))
        return torch.from_numpy(first[rank].copy())

    def gradient(self, step: int, rank: int, model: torch.Tensor) -> torch.Tensor:
        """Minibatch gradient (d,) of rank ``rank``'s mean loss ``1/(2b) ||A w - y||^2`` at
        ``model`` (float64, (d,)), over its rows of step ``step``; inside a rank, its own only."""
        self._own(rank, "gradient")
        if not 0 <= step < self.steps:
            raise ValueError(f"step must be in 0 .. {self.steps - 1}, got {step}")
        features, targets = self._minibatch(step, rank)
        return features.T @ (features @ model - targets) / len(targets)

    # --- internals: each guards itself, whoever calls it ---------------------------------------
    def _minibatch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank ``rank``'s rows of step ``step``: features (b, d), targets (b,); its own only.
        The whole ring's data and draws are made here, and only this rank's rows leave."""
        self._own(rank, "minibatch")
        data = make_least_squares(
            self.world_size * self.examples_per_node, self.num_features, seed=self.seed
        )
        shard = data.shards(self.world_size)[rank]
        rows = gossip.minibatch_rows(
            self.world_size,
            self.examples_per_node,
            batch_size=self.batch_size,
            num_steps=step + 1,
            seed=self.seed,
        )[step, rank]
        return torch.from_numpy(shard.features[rows]), torch.from_numpy(shard.targets[rows])

    # A real node holds only its own shard: inside a process group the bench answers a rank
    # about itself only, so that the neighbours' models must come by messages.
    def _own(self, rank: int, what: str) -> None:
        refuse_other_rank(rank, what, _OWN_DATA_ONLY, self._home_pid)

    def _outside_ranks(self, what: str) -> None:
        refuse_inside_ranks(f"problem.{what}()", _OWN_DATA_ONLY, self._home_pid)


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
    neighbours and theirs received (:func:`_exchange`); then the Metropolis-Hastings
    average, 1/3 each.
    """
    neighbours = ((rank - 1) % world_size, (rank + 1) % world_size)
    models = [problem.start(rank)]
    for step in range(problem.steps):
        half_step = models[-1] - problem.lr * problem.gradient(step, rank, models[-1])
        models.append((half_step + sum(_exchange(half_step, neighbours))) / 3)
    return torch.stack(models)


def _exchange(vector: torch.Tensor, neighbours: tuple[int, ...]) -> list[torch.Tensor]:
    """``vector`` sent to each of ``neighbours`` and one vector received from each, all the
    messages posted before any is waited for (so no order of the ranks can deadlock)."""
    received = [torch.empty_like(vector) for _ in neighbours]
    requests = [dist.isend(vector, peer) for peer in neighbours]
    requests += [dist.irecv(r, peer) for r, peer in zip(received, neighbours, strict=True)]
    for request in requests:
        request.wait()
    return received
