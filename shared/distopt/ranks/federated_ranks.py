"""FedAvg on real processes: a server rank and client ranks that keep their data.

Rank 0 is the server; rank k + 1 is client k. Client k holds client k's examples of
:func:`distopt.sim.federated.make_problem` (with ``client_sizes``, so clients differ in size)
and draws its minibatches from its own generator, ``federated.client_stream(seed, k)``; the
clients sampled in each round come from the problem's generator, which every rank can replay.
So each client rank draws exactly the minibatches the numpy simulator ``run_federated`` draws
for that client, and the two runs must agree to rounding (float64, about 1e-15).

    bench = FederatedBench(client_sizes=(40, 100, 260))
    launch(rank_code, bench.world_size, bench)  # e.g. section 06's exercise, fedavg_over_ranks
    bench.reference_run().w                      # the simulator's: the same to ~1e-15

No rank gets the whole bench: ``launch`` (and ``record.run_traced``) ship each rank its own
part, built in the launching process (:meth:`FederatedBench.own_part`, a
:class:`FederatedPart`): the server's holds the settings and the rounds' participants and no
data at all; client k's also holds its own examples, its minibatch generator and its secret
generator (secure aggregation's). No part holds the seed, so no rank can draw another
client's data or the simulator's run again.

``secure_fedavg_ranks`` runs the same rounds with pairwise-masked updates (the section's secure
aggregation), the masks' seeds exchanged between client ranks only.

FedAvg on these ranks is section 06's exercise; its reference answer is on the grader's side
(``autograder/references/federated.py``), not here. Its traffic, counted on the server: the
global model to every sampled client and each one's model back, 2 m model-sized messages per
round, then one broadcast of the final model. :mod:`distopt.ranks.federated_checks` checks a
student's rank code against the simulator and against that count.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist

from distopt.problems.logistic import logistic_grad
from distopt.problems.own_data import (
    ForeignShardError,
    KeepsHome,
    RankPart,
    refuse_inside_ranks,
    refuse_other_rank,
)
from distopt.sim import federated

__all__ = ["SERVER", "FederatedBench", "FederatedPart", "secure_fedavg_ranks"]

SERVER = 0  # the server's rank; client k runs on rank k + 1

# What a rank that asked for every client's data should do instead.
_CLIENT_DATA_ONLY = (
    "Client k's data: bench.client_data(k), on rank k + 1 only; the server learns of them "
    "only through the models the clients send."
)


class _FederatedSettings:
    """What the whole bench and a rank's part answer alike, from the settings only."""

    @property
    def num_clients(self) -> int:
        return len(self.client_sizes)

    @property
    def world_size(self) -> int:
        """The server and one rank per client."""
        return self.num_clients + 1

    @property
    def model_bytes(self) -> int:
        """Bytes of the model: ``dim`` float64 weights."""
        return self.dim * np.dtype(np.float64).itemsize

    def steps_of(self, client: int) -> int:
        """K_k, the local steps client ``client`` runs in each round it takes part in."""
        steps = self.local_steps
        return steps if isinstance(steps, int) else steps[client]


@dataclass(frozen=True)
class FederatedBench(_FederatedSettings, KeepsHome):
    """The federated problem as the ranks see it: who holds what, and the run's settings.

    Inside a rank every method, the private ones included, answers client k's rank about
    client k only (:meth:`client_data`, :meth:`client_rng`), gives what every rank may know
    (the settings, :meth:`participants`) or refuses (all clients' data, the simulator's run);
    so does a copy in a rank that has left its group. tests/ranks/test_own_data_05_06.py
    calls every method inside ranks.

    ``distopt.launch`` does not ship it whole (``ships_by_parts``): each rank gets its own
    part (:meth:`own_part`), the server none of the clients' data and a client its own only.
    """

    # distopt.launch ships each rank bench.own_part(rank), never the whole bench.
    ships_by_parts: ClassVar[bool] = True

    client_sizes: tuple[int, ...] = (40, 100, 260)  # n_k of each client: world size = len + 1
    local_steps: int | tuple[int, ...] = 3  # K: SGD steps per round, for all or per client
    rounds: int = 4  # communication rounds
    clients_per_round: int | None = None  # m, sampled without replacement; None: all of them
    lr: float = 0.1  # learning rate of the local SGD steps
    batch_size: int = 16  # examples per minibatch, drawn with replacement
    dim: int = 5  # features = model parameters (logistic regression)
    seed: int = 0  # the data, the client sample and every client's minibatch stream
    shift_std: float = 1.5  # how far apart the clients' inputs lie
    label_skew: float = 0.5  # how much the clients' labelling rules differ

    def __post_init__(self) -> None:
        self._remember_home()
        if not self.client_sizes or min(self.client_sizes) < 1:
            raise ValueError(f"need clients of at least one example, got {self.client_sizes}")
        steps = self.local_steps
        if not isinstance(steps, int) and len(steps) != self.num_clients:
            raise ValueError(f"local_steps: one number or one per client, got {steps}")
        if min(self.steps_of(k) for k in range(self.num_clients)) < 1 or self.rounds < 1:
            raise ValueError("need local_steps >= 1 and rounds >= 1")
        m = self.clients_per_round
        if m is not None and not 1 <= m <= self.num_clients:
            raise ValueError(f"clients_per_round must be in 1..{self.num_clients}, got {m}")

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``client``'s examples: X (n_k, dim), y (n_k,), float64.

        In a process group only rank ``client + 1`` may ask: the data never leave a client.
        """
        self._only_on_client(client, "data")
        # Every client's examples are drawn here (one generator draws them in turn), and only
        # this client's leave.
        return federated.make_problem(**self._settings()).clients[client]

    def client_rng(self, client: int) -> np.random.Generator:
        """A fresh copy of client ``client``'s minibatch generator (make it once, keep it):
        ``idx = rng.integers(0, n_k, batch_size)`` at every local step, as the simulator does."""
        self._only_on_client(client, "minibatch generator")
        return federated.client_stream(self.seed, client)

    def secret_rng(self, client: int) -> np.random.Generator:
        """A fresh copy of client ``client``'s secret generator, from which it draws the seeds
        it shares with higher-numbered clients in secure aggregation (seeded, for the demo's
        repeatability only). In a process group only rank ``client + 1`` may ask."""
        self._only_on_client(client, "secret generator")
        return np.random.default_rng([self.seed, 2017, client])

    def own_part(self, rank: int) -> FederatedPart:
        """What rank ``rank`` is shipped, built in the launching process: the settings and the
        clients of every round for all; for client k's rank (``k + 1``) also client k's
        examples, its minibatch generator and its secret generator. The server's part holds
        no data; no part holds the seed or anything of another client."""
        refuse_other_rank(rank, "part", _CLIENT_DATA_ONLY, self._home_pid)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0 .. {self.world_size - 1}, got {rank}")
        own = {}
        if rank != SERVER:
            client = rank - 1
            own = dict(
                data=self.client_data(client),
                stream=self.client_rng(client),
                secrets=self.secret_rng(client),
            )
        settings = {name: getattr(self, name) for name in _PART_SETTINGS}
        chosen = tuple(tuple(c) for c in self.participants())
        return FederatedPart(rank=rank, chosen=chosen, **settings, **own)

    def participants(self) -> list[list[int]]:
        """The clients (0-based, sorted) that take part in each round; every rank can call it.

        All clients every round if ``clients_per_round`` is None; else the simulator's draw
        from the problem's generator, ``np.sort(rng.choice(n, m, replace=False))`` per round.
        """
        if self.clients_per_round is None:
            return [list(range(self.num_clients)) for _ in range(self.rounds)]
        rng = federated.make_problem(**self._settings()).rng  # the data stay here
        return [
            np.sort(rng.choice(self.num_clients, self.clients_per_round, replace=False)).tolist()
            for _ in range(self.rounds)
        ]

    def bytes_per_round(self) -> int:
        """Predicted server traffic per round: the model to each of the m sampled clients and
        each one's model back, 2 m model_bytes (the same summed over the clients)."""
        m = self.num_clients if self.clients_per_round is None else self.clients_per_round
        return 2 * m * self.model_bytes

    def problem(self) -> federated.FederatedProblem:
        """The whole problem, all clients' data, for the simulator (outside the ranks only)."""
        refuse_inside_ranks(
            "FederatedBench.problem()",
            _CLIENT_DATA_ONLY,
            self._home_pid,
        )
        return federated.make_problem(**self._settings(), client_streams=True)

    def reference_run(self, *, weighting: str = "examples") -> federated.FederatedRun:
        """The numpy simulator on the same data and draws: what the ranks must reproduce
        (outside the ranks only)."""
        refuse_inside_ranks("FederatedBench.reference_run()", _CLIENT_DATA_ONLY, self._home_pid)
        return federated.run_federated(
            self.problem(),
            local_steps=self.local_steps,
            rounds=self.rounds,
            lr=self.lr,
            batch_size=self.batch_size,
            clients_per_round=self.clients_per_round,
            weighting=weighting,
        )

    def _problem(self, *, client_streams: bool) -> federated.FederatedProblem:
        """Every client's data (outside the ranks only)."""
        refuse_inside_ranks("FederatedBench._problem()", _CLIENT_DATA_ONLY, self._home_pid)
        return federated.make_problem(**self._settings(), client_streams=client_streams)

    def _settings(self) -> dict[str, Any]:
        """The arguments of :func:`distopt.sim.federated.make_problem` (settings, no data)."""
        return dict(
            seed=self.seed,
            dim=self.dim,
            client_sizes=self.client_sizes,
            shift_std=self.shift_std,
            label_skew=self.label_skew,
        )

    def _only_on_client(self, client: int, what: str) -> None:
        if not 0 <= client < self.num_clients:
            raise IndexError(f"client {client} of {self.num_clients} (clients are 0-based)")
        refuse_other_rank(
            client + 1,
            f"client {client}'s {what}",
            f"It stays on rank {client + 1}: in federated learning a client's data never "
            "leave it, and only models travel.",
            self._home_pid,
        )


# The settings a rank's part carries: what the rank code reads, no seed and nothing that
# draws data (shift_std and label_skew shape the clients' data, which a client is given).
_PART_SETTINGS = (
    "client_sizes",
    "local_steps",
    "rounds",
    "clients_per_round",
    "lr",
    "batch_size",
    "dim",
)


@dataclass(frozen=True, eq=False)
class FederatedPart(_FederatedSettings, RankPart):
    """One rank's part of a :class:`FederatedBench`, as ``launch`` ships it to that rank.

    The same calls as the bench (:meth:`client_data`, :meth:`client_rng`,
    :meth:`participants`, :meth:`steps_of`, the settings ...), answered from what the
    launching process put here. The server's part (rank 0) holds the settings and the
    clients of every round, and no data; client k's part (rank k + 1) also holds client k's
    examples, its minibatch generator and its secret generator. None holds the seed, so no
    method, public or private, can answer for another client or draw the simulator's run:
    the server learns of the clients only through the models they send. A method of the
    whole bench that it lacks (``problem``, ``reference_run``, ...) is refused
    (:class:`~distopt.problems.own_data.RankPart`).
    """

    rank: int
    chosen: tuple[tuple[int, ...], ...]  # the clients (0-based, sorted) of each round
    client_sizes: tuple[int, ...]
    local_steps: int | tuple[int, ...]
    rounds: int
    clients_per_round: int | None
    lr: float
    batch_size: int
    dim: int
    data: tuple[np.ndarray, np.ndarray] | None = None  # a client's X (n_k, dim), y (n_k,)
    stream: np.random.Generator | None = None  # a client's minibatch generator (copied out)
    secrets: np.random.Generator | None = None  # a client's secret generator (copied out)

    _whole = FederatedBench
    _instead = _CLIENT_DATA_ONLY

    def participants(self) -> list[list[int]]:
        """The clients (0-based, sorted) that take part in each round (the simulator's)."""
        return [list(c) for c in self.chosen]

    def bytes_per_round(self) -> int:
        """Predicted server traffic per round: 2 m model_bytes (see the bench's)."""
        m = self.num_clients if self.clients_per_round is None else self.clients_per_round
        return 2 * m * self.model_bytes

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        """This client's examples: X (n_k, dim), y (n_k,), float64 (copies)."""
        X, y = self._own(client, "data", self.data)
        return X.copy(), y.copy()

    def client_rng(self, client: int) -> np.random.Generator:
        """A fresh copy of this client's minibatch generator (make it once, keep it)."""
        return copy.deepcopy(self._own(client, "minibatch generator", self.stream))

    def secret_rng(self, client: int) -> np.random.Generator:
        """A fresh copy of this client's secret generator (secure aggregation's seeds)."""
        return copy.deepcopy(self._own(client, "secret generator", self.secrets))

    def _own(self, client: int, what: str, value: Any) -> Any:
        if not 0 <= client < self.num_clients:
            raise IndexError(f"client {client} of {self.num_clients} (clients are 0-based)")
        if client + 1 != self.rank or value is None:
            raise ForeignShardError(
                f"rank {self.rank} asked for client {client}'s {what}: a rank holds only its "
                f"own data. It stays on rank {client + 1}: in federated learning a client's "
                "data never leave it, and only models travel."
            )
        return value


def secure_fedavg_ranks(
    rank: int,
    world_size: int,
    bench: FederatedBench | FederatedPart,
    masked_update: Callable[..., np.ndarray],
    mask_scale: float = 1000.0,
) -> dict[str, Any]:
    """FedAvg on these ranks with secure aggregation: the server receives only masked updates.

    Each round, after the model has gone out, every pair of the round's clients i < j shares
    a seed: client i draws it from a secret generator of its own and sends it to client j
    (an 8-byte message that never passes through the server; it stands in for the key
    agreement of Bonawitz et al. 2017, section 3). Client k sends
    ``masked_update(p_k * (w_k - w), k, seeds of its pairs, mask_scale=mask_scale)``, its
    update weighted by p_k = n_k / (sum of n_j over the round's clients; the sizes and the
    participants are public) plus its pairwise masks; the server adds the vectors, in which
    the masks cancel, and adds the sum to w: the weighted FedAvg step, up to rounding (about
    1e-16 times ``mask_scale`` per mask).

    ``masked_update(update, client, pair_seeds, *, mask_scale)`` is section 06's exercise.
    Returns ``{"w": the final model}`` on every rank, with ``"received"`` (rounds, m, dim),
    the vectors the server got, on rank 0 and ``"updates"`` (the rank's true weighted
    updates, one per round it took part in; for analysis only) on the clients.
    """
    if world_size != bench.world_size:
        raise ValueError(f"the bench needs {bench.world_size} ranks, got {world_size}")
    w = torch.zeros(bench.dim, dtype=torch.float64)
    received, updates = [], []
    if rank != SERVER:
        client = rank - 1
        X, y = bench.client_data(client)
        rng = bench.client_rng(client)
        secrets = bench.secret_rng(client)  # seeded, for the demo only
    for chosen in bench.participants():
        if rank == SERVER:
            for k in chosen:
                dist.send(w, dst=k + 1)
            vectors = []
            for k in chosen:
                vector = torch.empty_like(w)
                dist.recv(vector, src=k + 1)
                vectors.append(vector.numpy())
            received.append(np.array(vectors))
            w = w + torch.from_numpy(np.sum(vectors, axis=0))  # the masks cancel
        elif client in chosen:
            dist.recv(w, src=SERVER)
            local = w.numpy().copy()
            for _ in range(bench.steps_of(client)):
                idx = rng.integers(0, len(y), bench.batch_size)
                local -= bench.lr * logistic_grad(local, X[idx], y[idx])
            seeds = _share_pair_seeds(client, chosen, secrets)
            share = bench.client_sizes[client] / sum(bench.client_sizes[k] for k in chosen)
            update = share * (local - w.numpy())
            updates.append(update)
            masked = np.asarray(masked_update(update, client, seeds, mask_scale=mask_scale))
            dist.send(torch.from_numpy(masked.astype(np.float64)), dst=SERVER)
    dist.broadcast(w, src=SERVER)
    if rank == SERVER:
        return {"w": w.numpy(), "received": np.array(received)}
    return {"w": w.numpy(), "updates": np.array(updates)}


def _share_pair_seeds(
    client: int, chosen: list[int], secrets: np.random.Generator
) -> dict[tuple[int, int], int]:
    """This client's seed for each pair with another of the round's clients: it draws those
    with higher-numbered clients and sends them, and receives those with lower ones."""
    higher = [j for j in chosen if j > client]
    lower = [i for i in chosen if i < client]
    drawn = {j: torch.tensor([int(secrets.integers(2**63))], dtype=torch.int64) for j in higher}
    incoming = {i: torch.empty(1, dtype=torch.int64) for i in lower}
    works = [dist.isend(drawn[j], dst=j + 1) for j in higher]
    works += [dist.irecv(incoming[i], src=i + 1) for i in lower]
    for work in works:
        work.wait()
    seeds = {(client, j): int(seed.item()) for j, seed in drawn.items()}
    seeds.update({(i, client): int(seed.item()) for i, seed in incoming.items()})
    return seeds
