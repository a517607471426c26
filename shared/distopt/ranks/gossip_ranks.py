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
* :class:`GossipPart`: what a rank is shipped by ``distopt.launch``
  (:meth:`GossipProblem.own_part`): its first model, its own minibatch rows of every step
  and the settings, built in the launching process; no seed and nothing of another rank or
  of the reference, so no method of it can answer for another node.

The rank code itself is section 05's exercise: its reference answer is on the grader's side
(``autograder/references/async_decentralized.py``), not here.

The checks of a student's rank code against the simulator and against the traffic gossip
should make are in :mod:`distopt.ranks.gossip_checks`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from distopt.problems.least_squares import LeastSquares, make_least_squares
from distopt.problems.own_data import (
    ForeignShardError,
    KeepsHome,
    RankPart,
    refuse_inside_ranks,
    refuse_other_rank,
)
from distopt.sim import gossip

__all__ = [
    "ForeignShardError",
    "GossipPart",
    "GossipProblem",
    "reference_models",
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
    ``distopt.launch`` never ships it whole (``ships_by_parts``): rank r gets
    :meth:`own_part` ``(r)`` only.
    """

    ships_by_parts: ClassVar[bool] = True

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

    def own_part(self, rank: int) -> GossipPart:
        """What rank ``rank`` is shipped, built in the launching process: its first model, its
        minibatch rows of every step (those :meth:`all_rows` gives the simulator) and the
        settings; no seed, nothing of another rank, nothing of the reference. ``launch``
        ships each rank its own (:mod:`distopt.engine.own_parts`); inside a rank, a whole
        bench builds its own rank's part only. The whole ring's data and draws are made here,
        and only this rank's rows leave."""
        self._own(rank, "part")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0 .. {self.world_size - 1}, got {rank}")
        shard = make_least_squares(
            self.world_size * self.examples_per_node, self.num_features, seed=self.seed
        ).shards(self.world_size)[rank]
        drawn = gossip.minibatch_rows(
            self.world_size,
            self.examples_per_node,
            batch_size=self.batch_size,
            num_steps=self.steps,
            seed=self.seed,
        )
        rows = tuple(
            (torch.from_numpy(shard.features[picked]), torch.from_numpy(shard.targets[picked]))
            for picked in drawn[:, rank]
        )
        settings = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "seed"
        }
        return GossipPart(rank=rank, first=self.start(rank), rows=rows, **settings)

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


@dataclass(frozen=True, eq=False)
class GossipPart(RankPart):
    """One rank's part of a :class:`GossipProblem`, as ``launch`` ships it to that rank.

    The calls the rank code makes (:meth:`start`, :meth:`gradient`, the settings,
    :attr:`model_bytes`), answered from what the launching process put here: this rank's
    first model and its minibatch rows of every step, the rows the simulator draws for this
    node. It holds no seed, no other rank's rows or first model and nothing of the reference
    trajectory, so no method, public or private, can answer for another node: the
    neighbours' models reach this rank as messages only. A method of the whole bench that it
    lacks (``shards``, ``starts``, ...) is refused (:class:`~distopt.problems.own_data.
    RankPart`).
    """

    rank: int
    first: torch.Tensor  # this rank's first model (d,), float64
    rows: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per step: features (b, d), targets (b,)
    world_size: int
    num_features: int
    examples_per_node: int
    batch_size: int
    steps: int
    lr: float
    start_spread: float

    _whole = GossipProblem
    _instead = _OWN_DATA_ONLY

    @property
    def model_bytes(self) -> int:
        """Bytes of one model: d float64 weights (one gossip message)."""
        return 8 * self.num_features

    def start(self, rank: int) -> torch.Tensor:
        """This rank's first model, a float64 tensor (d,)."""
        self._own(rank, "first model")
        return self.first.clone()

    def gradient(self, step: int, rank: int, model: torch.Tensor) -> torch.Tensor:
        """Minibatch gradient (d,) of this rank's mean loss ``1/(2b) ||A w - y||^2`` at
        ``model`` (float64, (d,)), over its rows of step ``step``."""
        self._own(rank, "gradient")
        if not 0 <= step < self.steps:
            raise ValueError(f"step must be in 0 .. {self.steps - 1}, got {step}")
        features, targets = self.rows[step]
        return features.T @ (features @ model - targets) / len(targets)

    def _own(self, rank: int, what: str) -> None:
        if rank != self.rank:
            raise ForeignShardError(
                f"rank {self.rank} asked for rank {rank}'s {what}: a rank holds only its own "
                f"data. {_OWN_DATA_ONLY}"
            )


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
