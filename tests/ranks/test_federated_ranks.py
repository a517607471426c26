"""distopt.ranks.federated_ranks: FedAvg on a server rank and client ranks equals the numpy
simulator to rounding, with the traffic of the cost model, and the checks name mistakes."""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from autograder.references.federated import fedavg_ranks
from distopt import launch
from distopt.engine import record
from distopt.problems.logistic import logistic_grad
from distopt.problems.own_data import ForeignShardError
from distopt.ranks.federated_checks import assert_fedavg_traffic, assert_models_match
from distopt.ranks.federated_ranks import FederatedBench, secure_fedavg_ranks
from distopt.sim import federated

BENCHES = [
    FederatedBench(),
    FederatedBench(
        client_sizes=(30, 7, 120, 55, 200),
        clients_per_round=2,
        local_steps=(2, 5, 1, 3, 4),
        rounds=6,
        seed=3,
    ),
    FederatedBench(client_sizes=(50,), local_steps=4, rounds=3, dim=3, seed=5),
]


@pytest.mark.parametrize("bench", BENCHES)
def test_ranks_equal_the_simulator_and_send_two_models_per_sampled_client(bench):
    results = launch(
        record.traced(fedavg_ranks, payloads=True), bench.world_size, bench, timeout=60
    )
    assert_models_match(results, bench)
    assert_fedavg_traffic(results, bench)
    server_log = results[0][1]
    p2p = server_log.payload_bytes("send") + server_log.payload_bytes("recv")
    assert p2p == bench.rounds * bench.bytes_per_round()
    clients = sum(log.payload_bytes("send") + log.payload_bytes("recv") for _, log in results[1:])
    assert clients == p2p


def test_participants_are_the_simulators_sample():
    bench = FederatedBench(client_sizes=(5, 6, 7, 8, 9, 10), clients_per_round=3, rounds=5)
    seen = []

    def remember(updates):
        seen.append(len(updates))
        return updates.mean(axis=0)

    federated.run_federated(
        bench.problem(), local_steps=1, rounds=5, clients_per_round=3, aggregate=remember
    )
    rng = federated.make_problem(
        bench.seed,
        dim=bench.dim,
        client_sizes=bench.client_sizes,
        shift_std=1.5,
        label_skew=0.5,
    ).rng
    expected = [np.sort(rng.choice(6, 3, replace=False)).tolist() for _ in range(5)]
    assert bench.participants() == expected
    assert seen == [3] * 5
    assert FederatedBench(client_sizes=(1, 2)).participants() == [[0, 1]] * 4


def _ask_for(rank, world_size, bench, client):
    try:
        bench.client_data(client)
    except ForeignShardError as exc:
        return str(exc)
    try:
        bench.problem()
    except ForeignShardError as exc:
        return "problem: " + str(exc)
    return "ok"


def test_a_clients_data_stay_on_its_rank():
    bench = FederatedBench(client_sizes=(4, 6))
    got = launch(_ask_for, 3, bench, 1, timeout=60)
    assert "stays on rank 2" in got[0] and "stays on rank 2" in got[1]
    assert got[2].startswith("problem: ")  # its own data, but not everybody's
    X, y = bench.client_data(1)  # outside a process group: allowed
    assert X.shape == (6, bench.dim) and y.shape == (6,)
    assert not dist.is_initialized()


def _fake(models, world_size):
    return [(np.asarray(models), record.Recording()) for _ in range(world_size)]


def test_the_unweighted_mean_is_named():
    bench = FederatedBench()
    with pytest.raises(AssertionError, match="plain mean"):
        assert_models_match(_fake(bench.reference_run(weighting="uniform").w, 4), bench)
    with pytest.raises(AssertionError, match="start every round"):
        assert_models_match(_fake(np.zeros(bench.dim), 4), bench)


def test_missing_traffic_is_reported():
    bench = FederatedBench()
    with pytest.raises(AssertionError, match="broadcast"):
        assert_fedavg_traffic(_fake(np.zeros(bench.dim), 4), bench)


def test_bench_validates_its_settings():
    with pytest.raises(ValueError):
        FederatedBench(client_sizes=(3, 0))
    with pytest.raises(ValueError):
        FederatedBench(client_sizes=(3, 4), local_steps=(1, 2, 3))
    with pytest.raises(ValueError):
        FederatedBench(client_sizes=(3, 4), clients_per_round=3)
    assert FederatedBench(dim=7).model_bytes == 56
    assert FederatedBench(client_sizes=(1, 2, 3), clients_per_round=2).bytes_per_round() == 160


def _mask(update, client, pair_seeds, *, mask_scale):
    """Section 06's masked_update, written out for this test: +m_ij for j > i, -m_ij for j < i."""
    out = np.array(update, dtype=float)
    for (i, _), seed in pair_seeds.items():
        sign = 1.0 if client == i else -1.0
        out += sign * federated.pair_mask(seed, len(out), scale=mask_scale)
    return out


def test_secure_fedavg_gives_fedavgs_model_and_the_server_sees_only_masked_vectors():
    bench = FederatedBench(client_sizes=(40, 100, 260, 70), clients_per_round=3, rounds=5)
    results = launch(record.traced(secure_fedavg_ranks), bench.world_size, bench, _mask, timeout=60)
    expected = bench.reference_run().w
    for value, _ in results:
        np.testing.assert_allclose(value["w"], expected, rtol=0, atol=1e-9)
    received = results[0][0]["received"]
    assert received.shape == (5, 3, bench.dim)
    # what the server got from each client is mostly mask: far larger than any true update
    updates = np.concatenate([value["updates"] for value, _ in results[1:]])
    assert np.linalg.norm(received, axis=2).min() > 1000 * np.linalg.norm(updates, axis=1).max()
    # the server's traffic is FedAvg's; the seeds went between clients, 8 bytes per pair
    server_log = results[0][1]
    assert server_log.payload_bytes("send") + server_log.payload_bytes("recv") == (
        bench.rounds * bench.bytes_per_round()
    )
    seeds_sent = sum(log.payload_bytes("isend") for _, log in results[1:])
    assert seeds_sent == bench.rounds * 3 * 8  # 3 pairs among 3 clients, every round
    assert all(c.peer != 0 for _, log in results[1:] for c in log.of("isend"))


def _buggy_fedavg(rank, world_size, bench, bug):
    """fedavg_ranks with one wrong message: the final model right, or nearly, every time."""
    w = torch.zeros(bench.dim, dtype=torch.float64)
    if rank != 0:
        X, y = bench.client_data(rank - 1)
        rng = bench.client_rng(rank - 1)
    for chosen in bench.participants():
        if rank == 0:
            for k in chosen:
                dist.send(torch.zeros_like(w) if bug == "zeros_out" else w, dst=k + 1)
            models = []
            for k in chosen:
                model = torch.empty_like(w)
                dist.recv(model, src=k + 1)
                models.append(model.numpy())
            sizes = [bench.client_sizes[k] for k in chosen]
            w = torch.from_numpy(np.average(models, axis=0, weights=sizes))
        elif rank - 1 in chosen:
            dist.recv(w, src=0)
            local = w.numpy().copy()
            for _ in range(bench.steps_of(rank - 1)):
                idx = rng.integers(0, len(y), bench.batch_size)
                local -= bench.lr * logistic_grad(local, X[idx], y[idx])
            outgoing = {"echo": w.numpy().copy(), "zeros_back": np.zeros(bench.dim)}.get(bug, local)
            dist.send(torch.from_numpy(outgoing), dst=0)
    dist.broadcast(w, src=0)
    return w.numpy()


@pytest.mark.parametrize(
    ("bug", "says"),
    [
        ("zeros_out", "round 1: the server sent client"),
        ("echo", "It is the model it received, unchanged"),
        ("zeros_back", r"client 0 \(rank 1\) sent \[0\. 0\. 0\.\]"),
    ],
)
def test_a_message_of_the_right_size_but_the_wrong_contents_fails(bug, says):
    """The contents of every message are checked, not only their sizes and peers."""
    bench = FederatedBench(rounds=2)

    def buggy(rank, world_size, bench):
        return _buggy_fedavg(rank, world_size, bench, bug)

    results = launch(record.traced(buggy, payloads=True), bench.world_size, bench, timeout=60)
    with pytest.raises(AssertionError, match=says):
        assert_fedavg_traffic(results, bench)
