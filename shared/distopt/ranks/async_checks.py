"""Checks of a student's parameter server (section 05), each failure saying what differed.

The server's run comes from :func:`distopt.ranks.async_ranks.run`: what the server returned
(its weights after every update, each update's staleness and sender) and what the package's
workers logged (each gradient they pushed, the version and weights it was computed at, the
answer they got).

* :func:`assert_updates_replay`: every update, against the workers' own logs: the answer
  carried the weights just updated, the staleness is the updates applied since the read,
  and ``w <- w - step(staleness) * g`` was applied to the server's current weights, naming
  the typical mistake where one fits;
* :func:`assert_matches_simulator`: a lockstep run (gradients arriving in the simulator's
  order) equal to :func:`distopt.sim.async_sgd.simulate_async_sgd` update by update;
* :func:`assert_timed_structure`: a timed run with one slowed worker: that worker pushes
  fewer gradients, and staler ones, than the others; where the workers' own clocks show that
  the machine stretched their emulated compute or slowed the server's answers, it says so
  (:class:`BusyMachineWarning`) instead of failing, since what makes a server asynchronous
  is checked without a clock;
* :func:`assert_server_traffic`: point-to-point messages only, one answer per gradient, and
  every receive from any source (``dist.recv(message)`` without ``src``): a server that
  names the rank it waits for (in turn, or in an order it knows in advance) is not
  asynchronous, whatever order the gradients happen to arrive in.

What decides is out of the server's reach: the workers' logs come from other processes
(what they received and sent, and their clocks), the expected values are computed here from
the bench, and the server's own recording only says how it called ``torch.distributed``.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import torch

from distopt.ranks.async_ranks import STOP, AsyncRun

__all__ = [
    "BusyMachineWarning",
    "assert_matches_simulator",
    "assert_server_traffic",
    "assert_timed_structure",
    "assert_updates_replay",
    "busy_evidence",
    "server_output",
]

_TOLERANCE = 1e-12
# A worker's emulated compute is a sleep: on an idle machine it overshoots by well under a
# millisecond, and the server answers in about one (the notebook's table measured 1.0 ms on an idle
# machine). A median overshoot or wait above this share of a mean step (2.25 ms at the tests'
# 10 ms time unit) means the machine, not the server, set the order the gradients came in.
_BUSY_SHARE = 0.15


class BusyMachineWarning(UserWarning):
    """A timed run's clock-based check was not decided: the machine stretched the workers'
    emulated compute (their own clocks show it), so the counts say nothing about the server."""


def server_output(run: AsyncRun) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The server's (weights (U + 1, d), staleness (U,), workers (U,)) as arrays, after
    checking their shapes."""
    bench, value = run.bench, run.returned
    updates, d = bench.num_updates, bench.num_features
    assert isinstance(value, tuple | list) and len(value) == 3, (
        f"the server returned {type(value).__name__}; expected a tuple (weights, staleness, "
        f"workers): the weights after every update, each update's staleness and the rank "
        f"whose gradient it applied"
    )
    weights = np.asarray([np.asarray(w, dtype=float) for w in value[0]], dtype=float)
    staleness, workers = np.asarray(value[1]), np.asarray(value[2])
    assert weights.shape == (updates + 1, d), (
        f"the server's weights have shape {weights.shape}; expected (num_updates + 1, d) = "
        f"({updates + 1}, {d}): the first weights, then the weights after every update"
    )
    for name, array in (("staleness", staleness), ("workers", workers)):
        assert array.shape == (updates,), (
            f"the server returned {array.shape[0] if array.ndim else array} {name} entries; "
            f"expected one per update, {updates}"
        )
    assert np.all(staleness == np.round(staleness)), (
        f"staleness must count updates (integers); got {staleness[:5]}..."
    )
    assert np.abs(weights[0]).max() == 0, "the first weights must be bench.start(), zeros"
    return weights, staleness.astype(int), workers.astype(int)


def _vec(x: np.ndarray) -> str:
    return np.array2string(np.asarray(x)[:3], precision=6) + "..."


def assert_updates_replay(run: AsyncRun) -> None:
    """Every update of the server, replayed from the workers' logs (exact to 1e-12)."""
    bench, logs = run.bench, run.worker_logs
    weights, staleness, workers = server_output(run)
    n = bench.num_workers
    bad = sorted(set(workers.tolist()) - set(range(1, n + 1)))
    assert not bad, (
        f"the server's workers list holds {bad}; expected the ranks of the workers, 1 .. {n} "
        f"(dist.recv returns the sender's rank)"
    )
    seen = [0] * n
    for i, rank in enumerate(workers.tolist()):
        log, push = logs[rank - 1], seen[rank - 1]
        seen[rank - 1] += 1
        where = f"update {i} (the gradient number {push} of rank {rank})"
        assert push < len(log["read_versions"]), (
            f"{where}: rank {rank} pushed only {len(log['read_versions'])} gradients; the "
            f"server's workers list names it more often"
        )
        read, answer = int(log["read_versions"][push]), int(log["reply_versions"][push])
        hint = {
            i: "it answered before applying the gradient: the worker then computes its next "
            "gradient without its own last update",
            STOP: "it answered STOP: all num_updates updates come first, then stop_workers",
        }.get(
            answer,
            "it applied other gradients before answering this one (did it wait for several?)",
        )
        assert answer == i + 1, (
            f"{where}: the server answered rank {rank} with version {answer}; expected "
            f"{i + 1}, the weights right after applying its gradient: {hint}"
        )
        assert np.abs(log["weights_read"][push] - weights[read]).max() <= _TOLERANCE, (
            f"{where}: rank {rank} computed its gradient at weights it received as version "
            f"{read}, {_vec(log['weights_read'][push])}, but the server's weights after update "
            f"{read} are {_vec(weights[read])}: answer with pack(version, w), the weights just "
            f"updated and their version"
        )
        expected_tau = i - read
        assert staleness[i] == expected_tau, (
            f"{where}: staleness {staleness[i]}; expected {expected_tau}: the gradient was "
            f"computed at version {read} and {expected_tau} updates were applied since "
            f"(the version now, {i}, minus the version it carries)"
        )
        gradient = log["gradients"][push]
        # The worker's gradient is its own push's, at the weights it last received.
        recomputed = bench.gradient(rank, push, torch.from_numpy(log["weights_read"][push]))
        assert np.abs(gradient - recomputed.numpy()).max() <= _TOLERANCE, (
            f"{where}: the gradient rank {rank} logged is not its minibatch gradient at the "
            f"weights it received (version {read}): the workers' logs were altered"
        )
        expected = weights[i] - bench.step_size(expected_tau) * gradient
        if np.abs(weights[i + 1] - expected).max() <= _TOLERANCE:
            continue
        mistakes = {
            "w <- (the weights the worker read) - step * g: the gradient applied to the "
            "worker's stale copy; apply it to the server's current weights": weights[read]
            - bench.step_size(expected_tau) * gradient,
            "the step lr, not bench.step_size(staleness): the staleness-aware step divides "
            "it by the staleness": weights[i] - bench.lr * gradient,
            "w unchanged": weights[i],
        }
        named = [m for m, w in mistakes.items() if np.abs(weights[i + 1] - w).max() <= 1e-12]
        raise AssertionError(
            f"{where}: the server's weights after it are {_vec(weights[i + 1])}; expected "
            f"w - bench.step_size({expected_tau}) * g = {_vec(expected)}. "
            + (
                f"They match {named[0]}."
                if named
                else "Is g the gradient of this message, and the step bench.step_size(staleness)?"
            )
        )
    for rank, log in enumerate(logs, start=1):
        pushes, applied = len(log["read_versions"]), seen[rank - 1]
        assert pushes == applied + 1 and log["reply_versions"][-1] == STOP, (
            f"rank {rank} pushed {pushes} gradients, {applied} applied; expected one more than "
            f"applied, answered STOP: after the last update, stop_workers(world_size, bench) "
            f"receives the gradient each worker is computing and answers STOP"
        )


def assert_matches_simulator(run: AsyncRun) -> None:
    """A lockstep run: the simulator's arrival order, staleness and weights, update by update
    (weights within 1e-12), and every update consistent with the workers' logs."""
    bench = run.bench
    assert bench.lockstep, "assert_matches_simulator needs a lockstep bench"
    weights, staleness, workers = server_output(run)
    reference = bench.reference()
    expected_workers = reference.workers + 1
    if not np.array_equal(workers, expected_workers):
        i = int(np.argmax(workers != expected_workers))
        raise AssertionError(
            f"update {i} applied a gradient of rank {workers[i]} by the server's workers "
            f"list; in this lockstep bench the gradients come one at a time in the "
            f"simulator's order, and the {i}-th came from rank {expected_workers[i]} (order "
            f"{expected_workers[:8].tolist()}...). Record the rank dist.recv returns."
        )
    assert_updates_replay(run)
    assert np.array_equal(staleness, reference.staleness), (
        f"staleness {staleness[:10].tolist()}...; the simulator's "
        f"{reference.staleness[:10].tolist()}..."
    )
    errors = np.abs(weights - reference.weights).max(axis=1)
    assert errors.max() <= _TOLERANCE, (
        f"the server's weights after update {int(np.argmax(errors > _TOLERANCE))} differ from "
        f"the simulator's by {errors.max():.2e} (tolerance {_TOLERANCE:g})"
    )


def assert_timed_structure(run: AsyncRun, *, slow_share: float = 0.75) -> None:
    """A timed run whose bench slows one worker (its factor the largest, at least twice the
    others'): every worker's gradients were applied; the slowed one's count is below
    ``slow_share`` times the fewest of any other, and its mean staleness above theirs.

    These depend on the clock. Where they fail and the workers' own clocks show the machine
    stretched their emulated compute or slowed the server's answers (:func:`busy_evidence`),
    a :class:`BusyMachineWarning` says so and nothing fails: what makes a server
    asynchronous (it receives from any source and answers each gradient before the next) is
    checked without a clock, by :func:`assert_updates_replay` and
    :func:`assert_server_traffic`, and a synchronous or fixed-order server fails those."""
    assert not run.bench.lockstep, "assert_timed_structure needs a timed bench (lockstep=False)"
    server_output(run)  # a wrong shape is the server's, never the machine's
    try:
        _assert_timed_counts(run, slow_share)
    except AssertionError as failure:
        busy = busy_evidence(run)
        if busy is None:
            raise
        warnings.warn(
            f"busy machine, not graded: {busy}. The check it replaces said: {failure}",
            BusyMachineWarning,
            stacklevel=2,
        )


def busy_evidence(run: AsyncRun) -> str | None:
    """Why the workers' clocks say the run was not the one the counts assume, or None.

    Each worker logs when its weights came, when it pushed its gradient and when the answer
    came. Between the first two it only sleeps its step time and computes a gradient of a
    few rows (microseconds): an overshoot of that interval over the sleep is the machine's.
    Between the last two it waits for the server: an asynchronous server on an idle machine
    answers in well under a millisecond, so long waits mean the server's process was slowed
    (a busy machine, or the grader's own watch on the answer) and the workers' gradients
    reached it in turns, not as they came. Either way the slowed worker's share says nothing
    about the server. These clocks run in the workers' processes, out of the server's reach.
    """
    bench = run.bench
    overshoot, waits = [], []
    for rank, log in enumerate(run.worker_logs, start=1):
        came = np.concatenate([[float(log["started_s"])], np.asarray(log["replied_s"])[:-1]])
        measured = np.asarray(log["sent_s"]) - came
        slept = np.array([bench.compute_time_s(rank, j) for j in range(len(measured))])
        overshoot.append(measured - slept)
        waits.append(np.asarray(log["replied_s"]) - np.asarray(log["sent_s"]))
    over = float(np.median(np.concatenate(overshoot))) if overshoot else 0.0
    wait = float(np.median(np.concatenate(waits))) if waits else 0.0
    mean_step_s = bench.time_unit_s * (bench.base_s + bench.mean_delay_s)
    found = []
    if over > _BUSY_SHARE * mean_step_s:
        found.append(f"the workers' emulated compute overshot its sleeps by {1e3 * over:.1f} ms")
    if wait > _BUSY_SHARE * mean_step_s:
        found.append(f"the workers waited {1e3 * wait:.1f} ms for each answer")
    if not found:
        return None
    return (
        " and ".join(found)
        + f" on median, more than {_BUSY_SHARE:g} of a mean step ({1e3 * mean_step_s:.1f} ms)"
    )


def _assert_timed_counts(run: AsyncRun, slow_share: float) -> None:
    bench = run.bench
    assert not bench.lockstep, "assert_timed_structure needs a timed bench (lockstep=False)"
    _, staleness, workers = server_output(run)
    factors = np.asarray(bench.slowdowns)
    slow = int(np.argmax(factors)) + 1
    others = [r for r in range(1, bench.num_workers + 1) if r != slow]
    assert factors[slow - 1] >= 2 * max(factors[r - 1] for r in others), "one slowed worker"
    counts = Counter(workers.tolist())
    missing = [r for r in range(1, bench.num_workers + 1) if counts[r] == 0]
    assert not missing, (
        f"no update applied a gradient of ranks {missing}: every worker's gradients count"
    )
    fewest = min(counts[r] for r in others)
    assert counts[slow] < slow_share * fewest, (
        f"the server applied {counts[slow]} gradients of the slowed rank {slow} "
        f"({factors[slow - 1]:g}x slower) and at least {fewest} of every other worker; "
        f"expected under {slow_share:g}x as many: an asynchronous server takes each "
        f"worker's gradients as they come, so a slow worker sends fewer (a server that waits "
        f"for every worker, or takes them in turn, applies as many of each)"
    )
    slow_mean = float(staleness[workers == slow].mean())
    fast_mean = float(staleness[workers != slow].mean())
    assert slow_mean > fast_mean, (
        f"mean staleness of the slowed rank {slow}'s gradients {slow_mean:.2f}, of the others' "
        f"{fast_mean:.2f}: while it computes longer, more updates are applied, so its "
        f"gradients should be the stalest"
    )


def assert_server_traffic(run: AsyncRun) -> None:
    """The server made no collective call and sent each worker one message per gradient it
    pushed plus the first weights, each the version and d float64; it received every push."""
    bench, log = run.bench, run.server_log
    collectives = sorted({c.name for c in log.collectives()})
    assert not collectives, (
        f"the server called {collectives}: a parameter server talks to each worker alone, "
        f"with send/recv (or isend/irecv); a collective waits for every rank. Your traffic: "
        f"{log.summary()}"
    )
    pushes = {r: len(lg["read_versions"]) for r, lg in enumerate(run.worker_logs, start=1)}
    expected = Counter({r: p + 1 for r, p in pushes.items()})
    sent = Counter(c.peer for c in log.sent())
    assert sent == expected, (
        f"the server sent messages to ranks {dict(sent)} (rank: count); expected "
        f"{dict(expected)}: the first weights, then one answer per gradient received "
        f"(the workers pushed {pushes})"
    )
    received = len(log.received())
    assert received == sum(pushes.values()), (
        f"the server made {received} receive calls; the workers pushed "
        f"{sum(pushes.values())} gradients: receive each one once"
    )
    named = [c.peer for c in log.received() if c.peer is not None]
    assert not named, (
        f"the server named the sender in {len(named)} of its {received} receive calls "
        f"(src={named[:6]}...): an asynchronous server receives from any source, "
        f"worker = dist.recv(message) without src, and answers the rank it returns; waiting "
        f"for a named worker (in turn, or in an order known in advance) keeps the others "
        f"waiting however long they have been ready"
    )
    sizes = sorted({c.payload_bytes for c in log.sent() + log.received()})
    assert sizes == [bench.message_bytes], (
        f"the server's messages are {sizes} bytes; expected each [version, d values] in "
        f"float64, {bench.message_bytes} bytes (pack / unpack)"
    )
