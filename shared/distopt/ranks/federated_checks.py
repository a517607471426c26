"""Checks of a student's FedAvg rank code (section 06): the models and the messages.

:func:`assert_models_match` compares every rank's final model with the simulator's run of the
same :class:`distopt.ranks.federated_ranks.FederatedBench`; :func:`assert_fedavg_traffic`
counts what each rank sent and received (``distopt.engine.record``) against FedAvg's 2 m
model-sized messages per round through the server. Each failure says what was compared.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from distopt.engine.record import Recording
from distopt.ranks.federated_ranks import SERVER, FederatedBench

__all__ = ["assert_fedavg_traffic", "assert_models_match"]


def _role(rank: int) -> str:
    return "the server" if rank == SERVER else f"client {rank - 1}"


def assert_models_match(
    results: list[tuple[Any, Recording]], bench: FederatedBench, *, tolerance: float = 1e-12
) -> None:
    """Every rank returned the simulator's final global model (``bench.reference_run().w``,
    clients weighted by size) within ``tolerance``; a failure says which rank, by how much,
    and whether the models are those of the plain, unweighted mean instead."""
    expected = bench.reference_run().w
    unweighted = bench.reference_run(weighting="uniform").w
    for rank, (value, _) in enumerate(results):
        got = np.asarray(value, dtype=float)
        assert got.shape == expected.shape, (
            f"rank {rank} ({_role(rank)}) returned an array of shape {got.shape}; expected "
            f"the final global model, shape {expected.shape}, on every rank"
        )
        diff = float(np.abs(got - expected).max())
        if diff <= tolerance:
            continue
        if np.abs(got - unweighted).max() <= tolerance and diff > 1e3 * tolerance:
            hint = (
                "It equals the plain mean of the clients' models: weight client k by "
                "n_k / (sum of n_j over the round's clients), its share of the examples."
            )
        else:
            hint = (
                "Does each client start every round from the model it received, run all of "
                "its local steps, and send its model back? Does the server weight client k "
                "by n_k / (sum of n_j over the round's clients)?"
            )
        raise AssertionError(
            f"rank {rank} ({_role(rank)}) of {len(results)}: its final model differs from "
            f"the numpy simulator's (run_federated, weighted by client size) by {diff:.2e} "
            f"(tolerance {tolerance:g}); expected "
            f"{np.array2string(expected[:3], precision=6)}..., got "
            f"{np.array2string(got[:3], precision=6)}.... {hint}"
        )


def assert_fedavg_traffic(results: list[tuple[Any, Recording]], bench: FederatedBench) -> None:
    """The traffic FedAvg must make: per round, the server sends the model to each sampled
    client and receives one model from each (point to point, model_bytes each), a client
    not sampled sends and receives nothing, and at the end one broadcast of the model from
    rank 0; nothing else."""
    chosen = bench.participants()
    size = bench.model_bytes
    rounds_of = Counter(k for clients in chosen for k in clients)
    for rank, (_, log) in enumerate(results):
        who = f"rank {rank} ({_role(rank)})"
        other = sorted({c.name for c in log.collectives()} - {"broadcast"})
        assert not other, (
            f"{who} called {other}: FedAvg here needs only send/recv (or isend/irecv) between "
            f"the server and the sampled clients, and one broadcast at the end. Your traffic: "
            f"{log.summary()}"
        )
        casts = log.of("broadcast")
        assert [(c.payload_bytes, c.peer) for c in casts] == [(size, SERVER)], (
            f"{who} made {len(casts)} broadcast(s) of {[c.payload_bytes for c in casts]} "
            f"bytes; expected one, of the final model ({size} bytes) from rank 0, after the "
            f"last round. Your traffic: {log.summary()}"
        )
        if rank == SERVER:
            peers = Counter({k + 1: n for k, n in rounds_of.items()})
            where = "the sampled clients, once per round each"
        else:
            peers = Counter({SERVER: rounds_of[rank - 1]}) if rounds_of[rank - 1] else Counter()
            where = f"rank 0, once in each of the {rounds_of[rank - 1]} round(s) it was sampled"
        for calls, verb, preposition in ((log.sent(), "sent", "to"),
                                         (log.received(), "received", "from")):  # fmt: skip
            got_peers = Counter(c.peer for c in calls)
            assert got_peers == peers, (
                f"{who} {verb} {len(calls)} message(s) {preposition} ranks {dict(got_peers)} "
                f"(rank: count); expected {sum(peers.values())}, {preposition} {where} "
                f"{dict(peers)}. Your traffic: {log.summary()}"
            )
            sizes = sorted({c.payload_bytes for c in calls})
            assert sizes in ([], [size]), (
                f"{who} {verb} messages of {sizes} bytes; expected each the whole model, "
                f"{bench.dim} float64 = {size} bytes"
            )
