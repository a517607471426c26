"""FedAvg on real processes: a server rank and client ranks that keep their data.

Rank 0 is the server; rank k + 1 is client k. Client k holds client k's examples of
:func:`distopt.sim.federated.make_problem` (with ``client_sizes``, so clients differ in size)
and draws its minibatches from its own generator, ``federated.client_stream(seed, k)``; the
clients sampled in each round come from the problem's generator, which every rank can replay.
So each client rank draws exactly the minibatches the numpy simulator ``run_federated`` draws
for that client, and the two runs must agree to rounding (float64, about 1e-15).

    bench = FederatedBench(client_sizes=(40, 100, 260))
    launch(fedavg_ranks, bench.world_size, bench)  # every rank returns the final global model
    bench.reference_run().w                         # the simulator's: the same to ~1e-15

``secure_fedavg_ranks`` runs the same rounds with pairwise-masked updates (the section's secure
aggregation), the masks' seeds exchanged between client ranks only.

``fedavg_ranks`` is the reference answer of section 06's exercise (the notebook's test checks
that the student's rank code does not call it). Its traffic, counted on the server: the
global model to every sampled client and each one's model back, 2 m model-sized messages per
round, then one broadcast of the final model. :mod:`distopt.ranks.federated_checks` checks a
student's rank code against the simulator and against that count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distopt.problems.logistic import logistic_grad
from distopt.problems.own_data import KeepsHome, refuse_inside_ranks, refuse_other_rank
from distopt.sim import federated

__all__ = ["SERVER", "FederatedBench", "fedavg_ranks", "secure_fedavg_ranks"]

SERVER = 0  # the server's rank; client k runs on rank k + 1

# What a rank that asked for every client's data should do instead.
_CLIENT_DATA_ONLY = (
    "Client k's data: bench.client_data(k), on rank k + 1 only; the server learns of them "
    "only through the models the clients send."
)


@dataclass(frozen=True)
class FederatedBench(KeepsHome):
    """The federated problem as the ranks see it: who holds what, and the run's settings.

    Inside a rank every method, the private ones included, answers client k's rank about
    client k only (:meth:`client_data`, :meth:`client_rng`), gives what every rank may know
    (the settings, :meth:`participants`) or refuses (all clients' data, the simulator's run);
    so does a copy in a rank that has left its group. tests/ranks/test_own_data_05_06.py
    calls every method inside ranks.
    """

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


def fedavg_ranks(rank: int, world_size: int, bench: FederatedBench) -> np.ndarray:
    """FedAvg with the server on rank 0 and client k on rank k + 1 (a ``launch`` worker).

    Each round the server sends the global model to each sampled client (``dist.send``),
    each runs its local SGD steps from it and sends its model back, and the server averages
    them weighted by n_k / sum n_k (McMahan et al. 2017, Algorithm 1). A client that is not
    sampled sends and receives nothing. At the end the server broadcasts the final model.
    Returns it (dim,), the same on every rank.
    """
    if world_size != bench.world_size:
        raise ValueError(f"the bench needs {bench.world_size} ranks, got {world_size}")
    w = torch.zeros(bench.dim, dtype=torch.float64)
    if rank != SERVER:
        client = rank - 1
        X, y = bench.client_data(client)
        rng = bench.client_rng(client)
    for chosen in bench.participants():
        if rank == SERVER:
            models = []
            for k in chosen:
                dist.send(w, dst=k + 1)
            for k in chosen:
                model = torch.empty_like(w)
                dist.recv(model, src=k + 1)
                models.append(model.numpy())
            sizes = [bench.client_sizes[k] for k in chosen]
            w = torch.from_numpy(federated.average_models(np.array(models), sizes, "examples"))
        elif client in chosen:
            dist.recv(w, src=SERVER)  # this round starts from the global model
            local = w.numpy().copy()
            for _ in range(bench.steps_of(client)):
                idx = rng.integers(0, len(y), bench.batch_size)
                local -= bench.lr * logistic_grad(local, X[idx], y[idx])
            dist.send(torch.from_numpy(local), dst=SERVER)
    dist.broadcast(w, src=SERVER)
    return w.numpy()


def secure_fedavg_ranks(
    rank: int,
    world_size: int,
    bench: FederatedBench,
    masked_update: Callable[..., np.ndarray],
    mask_scale: float = 1000.0,
) -> dict[str, Any]:
    """``fedavg_ranks`` with secure aggregation: the server receives only masked updates.

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
        secrets = np.random.default_rng([bench.seed, 2017, client])  # seeded for the demo only
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
