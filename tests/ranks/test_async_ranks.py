"""Tests of distopt.ranks.async_ranks and async_checks: the parameter server on real ranks
against the simulator, timed runs with a slowed worker, and the checks' verdicts on typical
wrong servers."""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from autograder.references.async_decentralized import async_server
from distopt import LaunchError, launch
from distopt.ranks import async_checks, async_ranks
from distopt.ranks.async_ranks import AsyncBench, pack, unpack
from distopt.sim import async_sgd

LOCKSTEP = [
    AsyncBench(),
    AsyncBench(
        num_workers=3,
        num_updates=20,
        lr=0.4,
        staleness_aware=True,
        run_seed=5,
        slowdowns=(1.0, 3.0, 1.0),
        num_features=6,
        num_examples=200,
    ),
]


def test_the_reference_server_follows_the_simulator_in_lockstep():
    for bench in LOCKSTEP:
        found = async_ranks.run(async_server, bench)
        async_checks.assert_matches_simulator(found)
        async_checks.assert_server_traffic(found)
        weights = np.asarray(found.returned[0])
        assert np.array_equal(weights, bench.reference().weights)  # same numpy gradients


def test_timed_runs_slow_worker_and_synchronous_baseline():
    """One launch: an asynchronous and a synchronous run with one worker 3x slower."""
    timed = dict(num_workers=3, slowdowns=(1.0, 1.0, 3.0), lockstep=False, time_unit_s=0.01)
    fast = AsyncBench(num_updates=40, lr=0.3, staleness_aware=True, **timed)
    sync = AsyncBench(num_updates=4, lr=1.0, synchronous=True, **timed)
    found, sync_run = async_ranks.run_all([(async_server, fast), (async_ranks.sync_server, sync)])
    async_checks.assert_updates_replay(found)
    async_checks.assert_timed_structure(found)
    async_checks.assert_server_traffic(found)
    times = found.update_times_s(found.returned[2])
    # In arrival order, each gradient's push time: non-decreasing, but for two pushes a few
    # milliseconds apart, which may reach the server in either order (0.11 ms seen).
    assert np.all(np.diff(times) >= -0.5) and times[0] >= 1.0  # a step is at least base_s
    # The synchronous server replays simulate_sync_sgd: the same weights after every step,
    # and every step waits for the 3x slower worker (its compute at least 3 simulated s).
    reference = sync.reference_sync()
    assert np.abs(np.asarray(sync_run.returned[0]) - reference.weights).max() < 1e-12
    logs = sync_run.worker_logs
    for step in range(4):
        assert all(
            np.array_equal(log["weights_read"][step], reference.weights[step]) for log in logs
        )
    step_times = sync_run.update_times_s(None)
    assert np.all(step_times >= np.cumsum(reference.compute_s.max(axis=1)) - 1e-9)
    assert np.all(np.diff(step_times) >= 3.0)


def test_the_bench_replays_the_simulator_and_keeps_data_to_its_owner():
    bench = AsyncBench(num_workers=3, num_updates=12, slowdowns=(1.0, 2.0, 1.0), run_seed=4)
    reference = bench.reference()
    order = bench.arrival_order()
    assert order[:12] == (reference.workers + 1).tolist() and len(order) == 12 + 3
    assert sorted(order[12:]) == [1, 2, 3] and order[12] == order[11]
    # Worker 2's j-th gradient: the rows the simulator applied for its j-th push.
    mine = np.nonzero(reference.workers == 1)[0]
    w = np.linspace(-1, 1, bench.num_features)
    for push, update in enumerate(mine):
        expected = bench.problem().grad(w, reference.rows[update])
        assert np.array_equal(bench.gradient(2, push, torch.from_numpy(w)).numpy(), expected)
        assert bench.compute_time_s(2, push) == reference.compute_s[update] * 0.01
    assert bench.compute_time_s(2, 12) > 0  # beyond the trace: its own generator
    longer = async_sgd.simulate_async_sgd(
        bench.problem(), num_workers=3, num_updates=30, lr=0.1, slowdowns=(1.0, 2.0, 1.0), seed=4
    )
    assert np.array_equal(longer.workers[:12], reference.workers)  # a prefix: same draws
    assert bench.step_size(4) == 0.1 and AsyncBench(staleness_aware=True).step_size(4) == 0.025
    version, vector = unpack(pack(7, torch.ones(3)))
    assert version == 7 and vector.dtype == torch.float64 and bench.message_bytes == 88
    with pytest.raises(ValueError, match="slowdowns"):
        AsyncBench(num_workers=2, slowdowns=(1.0,))
    # A synchronous bench: worker k's j-th gradient is simulate_sync_sgd's of step j.
    sync = AsyncBench(num_workers=3, num_updates=5, synchronous=True, lockstep=False)
    reference = sync.reference_sync()
    for step in range(5):
        expected = sync.problem().grad(w, reference.rows[step, 2])
        assert np.array_equal(sync.gradient(3, step, torch.from_numpy(w)).numpy(), expected)
        assert sync.compute_time_s(3, step) == reference.compute_s[step, 2] * 0.01
    with pytest.raises(ValueError, match="timed"):
        AsyncBench(synchronous=True)


PEEKS = ["server_gradient", "other_worker", "reference", "problem"]


def _peek(rank, world_size, bench):
    """Each rank asks for what only another rank, or the test, holds: what it was told."""
    told = {}
    for how in PEEKS:
        try:
            if how == "server_gradient":
                bench.gradient(1, 0, bench.start())
            elif how == "other_worker":
                bench.gradient(rank % (world_size - 1) + 1, 0, bench.start())
            else:
                getattr(bench, how)()
        except Exception as error:
            told[how] = f"{type(error).__name__}: {error}"
    return told


def test_inside_a_rank_the_bench_answers_for_that_rank_only():
    for rank, told in enumerate(launch(_peek, 3, AsyncBench(num_workers=2), timeout=30)):
        refused = [h for h in PEEKS if not (rank == 1 and h == "server_gradient")]
        assert sorted(told) == sorted(refused), (rank, told)  # worker 1 may have its own
        assert all(t.startswith("ForeignShardError") and "messages" in t for t in told.values())


def _buggy_server(rank, world_size, bench, bug):
    """The reference server with one typical mistake."""
    w, version = bench.start(), 0
    for worker in range(1, world_size):
        dist.send(pack(version, w), worker)
    message = torch.empty(bench.num_features + 1, dtype=torch.float64)
    weights, staleness, workers = [w], [], []
    while version < bench.num_updates:
        if bug == "fixed_order":  # the workers in turn, each named: not from any source
            worker = 1 + len(workers) % (world_size - 1)
            dist.recv(message, worker)
            arrived = [(worker, *unpack(message))]
        elif bug == "synchronous":  # one gradient from every worker, then the updates
            arrived = []
            for worker in range(1, world_size):
                dist.recv(message, worker)
                arrived.append((worker, *unpack(message)))
        else:
            arrived = [(dist.recv(message), *unpack(message))]
        for worker, read_version, gradient in arrived:
            tau = version - read_version + (bug == "off_by_one")
            if bug == "answer_first":
                dist.send(pack(version, w), worker)
            base = weights[read_version] if bug == "stale_copy" else w
            step = bench.lr if bug == "unscaled" else bench.step_size(tau)
            w = base - step * gradient
            version += 1
            if bug != "answer_first":
                dist.send(pack(version, w), worker)
            weights.append(w)
            staleness.append(tau)
            workers.append(worker)
    async_ranks.stop_workers(world_size, bench)
    return torch.stack(weights), staleness, workers


def _server(bug):
    def server(rank, world_size, bench):
        return _buggy_server(rank, world_size, bench, bug)

    return server


BUGS = {
    "off_by_one": "updates were applied since",
    "stale_copy": "the worker's stale copy",
    "unscaled": "the staleness-aware step divides",
    "answer_first": "it answered before applying",
}


def test_typical_bugs_fail_the_lockstep_check_with_a_reason():
    bench = AsyncBench(num_workers=3, num_updates=10, staleness_aware=True, lr=0.3)
    runs = async_ranks.run_all([(_server(bug), bench) for bug in BUGS])
    for found, says in zip(runs, BUGS.values(), strict=True):
        with pytest.raises(AssertionError, match=says):
            async_checks.assert_matches_simulator(found)


def test_a_synchronous_server_stalls_the_lockstep_bench_and_is_told_why():
    bench = AsyncBench(num_workers=3, num_updates=6, patience_s=1.0)
    with pytest.raises(LaunchError, match="waits forever"):
        async_ranks.run(_server("synchronous"), bench, timeout=20)


def test_a_server_that_names_its_senders_fails_whatever_the_order():
    """Receiving from a named worker, in turn, is not asynchronous: the traffic check reads
    every receive's source (and the counts of a timed run show why it matters)."""
    bench = AsyncBench(num_workers=3, num_updates=12, lr=0.2, slowdowns=(1.0, 3.0, 1.0),
                       lockstep=False, time_unit_s=0.005)  # fmt: skip
    found = async_ranks.run(_server("fixed_order"), bench, timeout=30)
    async_checks.assert_updates_replay(found)  # each update is right for what it received
    with pytest.raises(AssertionError, match="named the sender in 12 of its 15 receive"):
        async_checks.assert_server_traffic(found)


def _fabricated_timed_run(overshoot_s, answer_s=1e-4):
    """A timed run's record, written by hand: three workers that each pushed 4 gradients,
    every one applied in turn (counts equal: the slowed worker is not slower), their clocks
    showing ``overshoot_s`` beyond each sleep and ``answer_s`` for each answer."""
    bench = AsyncBench(num_workers=3, num_updates=9, slowdowns=(1.0, 3.0, 1.0),
                       lockstep=False, time_unit_s=0.01)  # fmt: skip
    logs = []
    for rank in (1, 2, 3):
        clock, sent, replied = 0.0, [], []
        for push in range(4):
            clock += bench.compute_time_s(rank, push) + overshoot_s
            sent.append(clock)
            clock += answer_s
            replied.append(clock)
        logs.append({"started_s": np.array(0.0), "sent_s": np.array(sent),
                     "replied_s": np.array(replied)})  # fmt: skip
    returned = (torch.zeros(10, bench.num_features), [0] * 9, [1, 2, 3] * 3)
    return async_ranks.AsyncRun(bench, returned, None, logs)


def test_the_timed_check_says_busy_only_where_the_workers_clocks_show_it():
    idle = _fabricated_timed_run(overshoot_s=2e-4)
    assert async_checks.busy_evidence(idle) is None
    with pytest.raises(AssertionError, match="gradients of the slowed rank 2"):
        async_checks.assert_timed_structure(idle)
    busy = _fabricated_timed_run(overshoot_s=0.02)
    assert "overshot its sleeps by 20.0 ms" in async_checks.busy_evidence(busy)
    with pytest.warns(async_checks.BusyMachineWarning, match="busy machine, not graded"):
        async_checks.assert_timed_structure(busy)
    slow_server = _fabricated_timed_run(overshoot_s=2e-4, answer_s=0.01)
    assert "waited 10.0 ms for each answer" in async_checks.busy_evidence(slow_server)
