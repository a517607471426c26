"""Checks of a student's FedAvg rank code (section 06): the models and the messages.

:func:`assert_models_match` compares every rank's final model with the simulator's run of the
same :class:`distopt.ranks.federated_ranks.FederatedBench`; :func:`assert_fedavg_traffic`
counts what each rank sent and received (``distopt.engine.record``) against FedAvg's 2 m
model-sized messages per round through the server, and :func:`assert_fedavg_messages` reads
what each message carried (recorded with ``payloads=True``): the server's model to each
client of a round is the weighted average of the models the previous round's clients sent
(zeros in the first round), and each client's model back is its ``K_k`` local SGD steps from
the model it received, on its own data and its own minibatch stream. Each is computed here,
in the test's process, from the messages themselves, so a failure names the first message
that broke the rule, and zeros or any decoy of the right size fail. Each failure says what
was compared.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from distopt.engine.record import Recording
from distopt.problems.logistic import logistic_grad
from distopt.ranks.federated_ranks import SERVER, FederatedBench
from distopt.sim import federated

__all__ = ["assert_fedavg_messages", "assert_fedavg_traffic", "assert_models_match"]

_TOLERANCE = 1e-12


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
    rank 0; nothing else. Then what each message carried: :func:`assert_fedavg_messages`."""
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
    assert_fedavg_messages(results, bench)


def _vec(x: np.ndarray) -> str:
    return np.array2string(np.asarray(x)[:3], precision=6) + "..."


def _payload(call: Any, who: str) -> np.ndarray:
    assert len(call.payload) == 1, (
        f"the recording of {who} holds no message contents: run the ranks with "
        f"launch(record.traced(fn, payloads=True), ...) so that each message can be checked"
    )
    return call.payload[0].detach().double().reshape(-1).numpy()


def _local_models(bench: FederatedBench, client: int, starts: list[np.ndarray]) -> list:
    """Client ``client``'s model after its K_k local steps from each of ``starts`` (the models
    it received, in the rounds it took part in), drawing its minibatches from its own stream
    as the simulator does: what it must send back each time."""
    X, y = bench.client_data(client)
    rng = federated.client_stream(bench.seed, client)
    found = []
    for start in starts:
        local = np.array(start, dtype=np.float64)
        for _ in range(bench.steps_of(client)):
            idx = rng.integers(0, len(y), bench.batch_size)
            local = local - bench.lr * logistic_grad(local, X[idx], y[idx])
        found.append(local)
    return found


def assert_fedavg_messages(
    results: list[tuple[Any, Recording]], bench: FederatedBench, *, tolerance: float = _TOLERANCE
) -> None:
    """What each message carried (needs ``record.traced(fn, payloads=True)``), round by round:

    * the server's sends of round t go to the round's clients, each carrying the global
      model: zeros in round 0, then the average of round t - 1's client models weighted by
      n_k / (sum of n_j over that round's clients); its final broadcast carries the last
      round's average;
    * client k's send in each round it takes part in is its K_k local SGD steps (its own
      data, its own minibatch stream, ``bench.lr``) from the model the server sent it then
      (or its update, that model minus the one it received: the server can add it).

    Traffic counts are :func:`assert_fedavg_traffic`'s; this reads the contents only.
    """
    chosen = bench.participants()
    server_sends = results[SERVER][1].sent()
    client_sends = {k: results[k + 1][1].sent() for k in range(bench.num_clients)}
    rounds_of = {k: [t for t, c in enumerate(chosen) if k in c] for k in range(bench.num_clients)}
    received = {k: [] for k in range(bench.num_clients)}  # the model each got, per round in
    w = np.zeros(bench.dim)
    models: list[np.ndarray] = []  # the previous round's client models, and their sizes
    sizes: list[int] = []
    position = 0
    for t, clients in enumerate(chosen):
        sends = server_sends[position : position + len(clients)]
        position += len(clients)
        peers = sorted(c.peer for c in sends if c.peer is not None)
        assert peers == [k + 1 for k in clients], (
            f"round {t}: the server's sends of the round went to ranks "
            f"{[c.peer for c in sends]}; expected one to each of the round's clients, ranks "
            f"{[k + 1 for k in clients]}, before the next round's"
        )
        for call in sends:
            k = (call.peer or 0) - 1
            got = _payload(call, "the server")
            assert got.shape == w.shape and np.abs(got - w).max() <= tolerance, (
                f"round {t}: the server sent client {k} (rank {k + 1}) {_vec(got)}; expected "
                f"the global model {_vec(w)}: "
                + (
                    "zeros in the first round"
                    if t == 0
                    else f"round {t - 1}'s client models averaged, client j weighted by "
                    f"n_j / (sum of n over that round's clients)"
                )
                + _named_average(got, models, sizes, tolerance)
            )
            if 0 <= k < bench.num_clients:
                received[k].append(w)
        models, sizes = [], []
        for k in clients:
            turn = rounds_of[k].index(t)
            sent = client_sends[k]
            assert turn < len(sent), (
                f"round {t}: client {k} (rank {k + 1}) sent only {len(sent)} model(s) in all; "
                f"it takes part in rounds {rounds_of[k]}"
            )
            models.append(_payload(sent[turn], f"client {k}"))
            sizes.append(bench.client_sizes[k])
        for i, (k, model) in enumerate(zip(clients, models, strict=True)):
            turn = rounds_of[k].index(t)
            start = received[k][turn]
            want = _local_models(bench, k, received[k][: turn + 1])[turn]
            if model.shape == want.shape and np.abs(start + model - want).max() <= tolerance:
                models[i] = model = start + model  # it sent its update, w_k - w: as good
            error = float(np.abs(model - want).max()) if model.shape == want.shape else np.inf
            assert error <= tolerance, (
                f"round {t}: client {k} (rank {k + 1}) sent {_vec(model)}; expected its "
                f"{bench.steps_of(k)} local SGD step(s) from the model it received "
                f"({_vec(received[k][turn])}), on its own data with its own minibatch stream: "
                f"{_vec(want)} (differs by {error:.2e}, tolerance {tolerance:g})."
                + _named_client_mistake(model, received[k][turn], tolerance)
            )
        w = federated.average_models(np.array(models), sizes, "examples")
    casts = results[SERVER][1].of("broadcast")
    if casts:
        got = _payload(casts[-1], "the server")
        assert got.shape == w.shape and np.abs(got - w).max() <= tolerance, (
            f"the server's final broadcast carried {_vec(got)}; expected the last round's "
            f"weighted average of the clients' models, {_vec(w)}."
            + _named_average(got, models, sizes, tolerance)
        )


def _named_average(got: np.ndarray, models: list, sizes: list, tolerance: float) -> str:
    """Names a typical wrong global model: the plain mean of the round's models."""
    if not models or got.shape != models[0].shape:
        return ""
    if np.abs(got - np.mean(models, axis=0)).max() <= tolerance:
        return (
            " It is the plain mean of the round's models: weight client k by n_k / (sum of "
            "n_j over the round's clients)."
        )
    return ""


def _named_client_mistake(model: np.ndarray, start: np.ndarray, tolerance: float) -> str:
    """Names a typical wrong client message."""
    if model.shape != start.shape:
        return f" It holds {model.size} values, not the model's {start.size}."
    if np.abs(model - start).max() <= tolerance:
        return " It is the model it received, unchanged: run the local steps before sending."
    if np.abs(model).max() == 0:
        return " It is all zeros: send the model after the local steps."
    return ""
