"""Asynchronous SGD on real processes: a parameter-server rank and worker ranks.

The algorithm is :func:`distopt.sim.async_sgd.simulate_async_sgd`'s (Dean et al. 2012,
"Downpour SGD"; the staleness-aware step of Zhang et al. 2016): rank 0, the server, holds the
weights and a version number (the updates applied so far); worker ranks 1 .. N loop: receive
the weights and their version, compute a minibatch gradient, send it back tagged with the
version it was computed at. The server applies each gradient the moment it arrives and
answers its sender with the new weights, so a gradient's *staleness* is the number of
updates applied between the read and the update. Every message is one float64 vector,
``[version, vector...]`` (:func:`pack`, :func:`unpack`); a version of :data:`STOP` ends a
worker.

* :class:`AsyncBench`: the seeded bench, for the section's least-squares problem. Worker k's
  j-th gradient uses the minibatch rows and the step time the simulator gave that worker's
  j-th gradient (extra gradients draw from a generator of its own), and inside a process
  group a rank gets only its own: the server holds no data at all, only what messages bring.
  On the server's rank (where the student's code runs) every method that holds data or the
  simulator's run refuses, the arrival order included (a server that knows it could receive
  in a fixed order instead of from any source), and so do the module's own caches; a worker
  rank gets its own minibatches and step times, the dataset all workers sample from, and the
  lockstep order it takes turns in (tests/ranks/test_own_data_05_06.py calls every method).
* :class:`AsyncPart`: what :func:`run` and :func:`run_all` ship each rank instead of the
  bench (:meth:`AsyncBench.own_part`), built in the launching process: the server's holds
  the settings and no data; worker k's also its own minibatches (their rows of the data),
  its own step times and, in lockstep, the order of the turns. No part holds the seeds, so
  no rank can draw another worker's stream or the simulator's run again.
* Two ways to run it. ``lockstep=True``: the workers take turns, passing a token, so that the
  gradients reach the server one at a time in the simulator's order and the server's weights
  must equal the simulator's after every update (a server that waits for several gradients
  waits forever; the workers then say so after ``patience_s``). ``lockstep=False``: each
  worker's compute is a sleep of its step time (``time_unit_s`` real seconds per simulated
  second); sleeping frees the core, so N workers on 2 cores behave like N devices, and the
  arrival order is the operating system's.
* ``synchronous=True``: the workers replay :func:`distopt.sim.async_sgd.simulate_sync_sgd`'s
  step times and minibatches instead, for :func:`sync_server`, whose weights must then equal
  that simulator's after every step.
* :func:`bench_worker`: the worker ranks' loop (the package's; students write the server);
  :func:`stop_workers`: the server's ending; :func:`sync_server`: the synchronous server
  an asynchronous one is compared with; :func:`run` and :func:`run_all` launch a server. The
  asynchronous server is section 05's exercise: its reference answer is on the grader's side
  (``autograder/references/async_decentralized.py``), not here.

The checks of a student's server are in :mod:`distopt.ranks.async_checks`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distopt.engine import record
from distopt.engine.own_parts import OwnParts
from distopt.problems.least_squares import LeastSquares, make_least_squares
from distopt.problems.own_data import (
    NO_RANK,
    ForeignShardError,
    KeepsHome,
    RankPart,
    current_rank,
    refuse_inside_ranks,
    refuse_other_rank,
)
from distopt.sim import async_sgd

__all__ = [
    "SERVER",
    "STOP",
    "AsyncBench",
    "AsyncPart",
    "AsyncRun",
    "bench_worker",
    "pack",
    "run",
    "run_all",
    "stop_workers",
    "sync_server",
    "unpack",
]

SERVER = 0  # the parameter server's rank; worker k (0-based) runs on rank k + 1
STOP = -1  # the version of the message that ends a worker

_OWN_DATA_ONLY = (
    "Inside a rank, bench.gradient(rank, push, weights) and bench.compute_time_s(rank, push) "
    "answer for a worker's own rank only, and the server has no data: the gradients reach "
    "it as the workers' messages."
)


def pack(version: int, vector: torch.Tensor) -> torch.Tensor:
    """One message: ``[version, vector...]``, float64 (d + 1,)."""
    head = torch.tensor([float(version)], dtype=torch.float64)
    return torch.cat([head, vector.to(torch.float64).reshape(-1)])


def unpack(message: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(version, a copy of the vector (d,)) of a message made by :func:`pack`."""
    return int(message[0].item()), message[1:].clone()


class _AsyncSettings:
    """What the whole bench and a rank's part answer alike, from the settings only."""

    @property
    def world_size(self) -> int:
        """The server and one rank per worker."""
        return self.num_workers + 1

    @property
    def message_bytes(self) -> int:
        """Bytes of every message: the version and d weights or gradient entries, float64."""
        return 8 * (self.num_features + 1)

    def start(self) -> torch.Tensor:
        """The server's first weights: zeros (d,), float64, as the simulator starts."""
        return torch.zeros(self.num_features, dtype=torch.float64)

    def step_size(self, staleness: int) -> float:
        """The step for a gradient ``staleness`` updates old: lr, or lr / max(1, staleness)."""
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        return self.lr / max(1, staleness) if self.staleness_aware else self.lr


@dataclass(frozen=True)
class AsyncBench(_AsyncSettings, KeepsHome):
    """The asynchronous run as the ranks see it: who holds what, and the run's settings."""

    num_workers: int = 4  # worker ranks 1 .. num_workers; the server is rank 0
    num_updates: int = 30  # gradients the server applies (steps, for the synchronous server)
    lr: float = 0.1  # step size eta (the base step when staleness_aware)
    staleness_aware: bool = False  # step eta / max(1, staleness) (Zhang et al. 2016)
    slowdowns: tuple[float, ...] | None = None  # per worker: step-time factor; None: all 1
    lockstep: bool = True  # gradients arrive one at a time, in the simulator's order
    synchronous: bool = False  # the workers replay simulate_sync_sgd's draws (for sync_server)
    time_unit_s: float = 0.01  # timed runs: real seconds per simulated second of compute
    base_s: float = 1.0  # a step takes slowdown * (base_s + Exponential(mean_delay_s)),
    mean_delay_s: float = 0.5  # in simulated seconds, as in the simulator
    num_examples: int = 1024  # rows of the least-squares problem
    num_features: int = 10  # d: the weights are d float64
    batch_size: int = 8  # rows per gradient, drawn with replacement
    seed: int = 0  # the data
    run_seed: int = 0  # step times and minibatches: the simulator's seed
    patience_s: float = 5.0  # how long a worker waits for the server before it says why

    def __post_init__(self) -> None:
        self._remember_home()
        if self.num_workers < 1 or self.num_updates < 1:
            raise ValueError("need num_workers >= 1 and num_updates >= 1")
        if self.slowdowns is not None and (
            len(self.slowdowns) != self.num_workers or min(self.slowdowns) <= 0
        ):
            raise ValueError(f"slowdowns must be {self.num_workers} positive numbers")
        if self.time_unit_s < 0 or self.patience_s <= 0:
            raise ValueError("need time_unit_s >= 0 and patience_s > 0")
        if self.synchronous and self.lockstep:
            raise ValueError("a synchronous bench is timed: set lockstep=False")

    def own_part(self, rank: int) -> AsyncPart:
        """What rank ``rank`` is shipped, built in the launching process: the settings for
        all; for a worker also its own minibatches (the rows of the data each of its
        num_updates + 1 gradients uses), its own step times and, in lockstep, the order of
        the turns. The server's part holds no data; no part holds the seeds, another worker's
        stream or anything of the simulator's weights."""
        refuse_other_rank(rank, "part", _OWN_DATA_ONLY, self._home_pid)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0 .. {self.world_size - 1}, got {rank}")
        settings = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("seed", "run_seed")
        }
        if rank == SERVER:
            return AsyncPart(rank=rank, pushes=(), times=np.zeros(0), order=None, **settings)
        rows, times = _cached_stream(self, rank - 1)
        data = self._problem()
        pushes = tuple((data.features[r], data.targets[r]) for r in rows)
        order = tuple(self.arrival_order()) if self.lockstep else None
        return AsyncPart(rank=rank, pushes=pushes, times=times.copy(), order=order, **settings)

    # --- what a worker rank may ask, about itself only ----------------------------------
    def gradient(self, rank: int, push: int, weights: torch.Tensor) -> torch.Tensor:
        """Worker ``rank``'s ``push``-th gradient (0-based) at ``weights`` (d,), float64:
        the mean least-squares gradient over that push's minibatch rows."""
        self._own(rank, "minibatches")
        rows = _cached_stream(self, rank - 1)[0][push]
        grad = self._problem().grad(np.asarray(weights, dtype=np.float64), rows)
        return torch.from_numpy(grad)

    def compute_time_s(self, rank: int, push: int) -> float:
        """Real seconds worker ``rank`` computes its ``push``-th gradient (timed runs)."""
        self._own(rank, "step times")
        return float(_cached_stream(self, rank - 1)[1][push]) * self.time_unit_s

    def arrival_order(self) -> list[int]:
        """Lockstep: the ranks whose gradients reach the server, in turn. The simulator's
        ``num_updates`` arrivals, then one more gradient from every worker, which the server
        answers with STOP: the last one's first, then the others by rank. The workers take
        turns in it; the server may not ask (it receives from whichever worker sends)."""
        _refuse_on_server(self, "bench.arrival_order()")
        if self.synchronous:
            raise ValueError("a synchronous bench has no arrival order")
        applied = (_cached_trace(self).workers + 1).tolist()
        last = applied[-1]
        return applied + [last] + [r for r in range(1, self.world_size) if r != last]

    # --- what only the test may see -------------------------------------------------------
    def problem(self) -> LeastSquares:
        """The whole least-squares problem (outside the ranks only)."""
        refuse_inside_ranks("bench.problem()", _OWN_DATA_ONLY, self._home_pid)
        return self._problem()

    def excess_loss(self, weights: np.ndarray) -> np.ndarray:
        """f(w) - f(w*) of each row of ``weights`` (k, d) (outside the ranks only)."""
        refuse_inside_ranks("bench.excess_loss()", _OWN_DATA_ONLY, self._home_pid)
        problem = self.problem()
        return problem.loss(np.atleast_2d(weights)) - problem.loss(problem.minimum())

    def reference(self) -> async_sgd.ServerRun:
        """The simulator's asynchronous run on the same data and draws, weights kept: what
        a lockstep run must reproduce (outside the ranks only)."""
        refuse_inside_ranks("bench.reference()", _OWN_DATA_ONLY, self._home_pid)
        found = self._simulate(self.step_size, keep_weights=True, eval_every=1)
        if len(found.staleness) < self.num_updates:
            raise ValueError(f"the simulator diverged after {len(found.staleness)} updates")
        return found

    def reference_sync(self) -> async_sgd.ServerRun:
        """The simulator's synchronous run, num_updates steps, weights kept: on a
        ``synchronous`` bench, the draws its workers replay (outside the ranks only)."""
        refuse_inside_ranks("bench.reference_sync()", _OWN_DATA_ONLY, self._home_pid)
        return self._simulate_sync(self.lr, keep_weights=True)

    # --- internals: each guards itself, whoever calls it -------------------------------------
    def _own(self, rank: int, what: str) -> None:
        if not 1 <= rank <= self.num_workers:
            raise ValueError(f"workers are ranks 1 .. {self.num_workers}, got {rank}")
        refuse_other_rank(rank, f"worker rank {rank}'s {what}", _OWN_DATA_ONLY, self._home_pid)

    def _problem(self) -> LeastSquares:
        """The dataset every worker samples its minibatches from (not on the server)."""
        _refuse_on_server(self, "bench._problem()")
        return _least_squares(self.num_examples, self.num_features, self.seed)

    def _simulator_settings(self) -> dict[str, Any]:
        """What both simulators take from the bench besides the step size."""
        return dict(
            num_workers=self.num_workers,
            batch_size=self.batch_size,
            slowdowns=self.slowdowns,
            base_s=self.base_s,
            mean_delay_s=self.mean_delay_s,
            seed=self.run_seed,
        )

    def _simulate(self, lr: Any, **kwargs: Any) -> async_sgd.ServerRun:
        refuse_inside_ranks("bench._simulate()", _OWN_DATA_ONLY, self._home_pid)
        return async_sgd.simulate_async_sgd(
            self._problem(),
            num_updates=self.num_updates,
            lr=lr,
            **self._simulator_settings(),
            **kwargs,
        )

    def _simulate_sync(self, lr: float, **kwargs: Any) -> async_sgd.ServerRun:
        refuse_inside_ranks("bench._simulate_sync()", _OWN_DATA_ONLY, self._home_pid)
        return async_sgd.simulate_sync_sgd(
            self._problem(),
            num_steps=self.num_updates,
            lr=lr,
            **self._simulator_settings(),
            **kwargs,
        )

    def _trace(self) -> async_sgd.ServerRun:
        """The simulator's draws for every worker (outside the ranks only)."""
        refuse_inside_ranks("bench._trace()", _OWN_DATA_ONLY, self._home_pid)
        return _cached_trace(self)

    def _stream(self, worker: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Worker ``worker``'s (0-based) rows and step times; inside a rank, its own only."""
        self._own(worker + 1, "minibatches and step times")
        return _cached_stream(self, worker)


@dataclass(frozen=True, eq=False)
class AsyncPart(_AsyncSettings, RankPart):
    """One rank's part of an :class:`AsyncBench`, as :func:`run` ships it to that rank.

    The calls the server and the workers make (:meth:`start`, :meth:`step_size`,
    :meth:`gradient`, :meth:`compute_time_s`, :meth:`arrival_order`, the settings), answered
    from what the launching process put here. The server's part (rank 0) holds the settings
    only: no data, no step times, no arrival order, so the gradients reach it as the workers'
    messages and in the order they come. Worker k's part (rank k + 1) also holds the rows of
    the data its gradients use, its step times and, in lockstep, the order of the turns. No
    part holds the seeds, so no method, public or private, can draw another worker's stream
    or the simulator's run. A method of the whole bench that it lacks (``problem``,
    ``reference``, ``_simulate``, ...) is refused (:class:`~distopt.problems.own_data.
    RankPart`).
    """

    rank: int
    pushes: tuple[tuple[np.ndarray, np.ndarray], ...]  # per gradient: features (b, d), targets
    times: np.ndarray  # simulated seconds of each gradient's compute
    order: tuple[int, ...] | None  # lockstep: the ranks whose gradients arrive, in turn
    num_workers: int
    num_updates: int
    lr: float
    staleness_aware: bool
    slowdowns: tuple[float, ...] | None
    lockstep: bool
    synchronous: bool
    time_unit_s: float
    base_s: float
    mean_delay_s: float
    num_examples: int
    num_features: int
    batch_size: int
    patience_s: float

    _whole = AsyncBench
    _instead = _OWN_DATA_ONLY

    def gradient(self, rank: int, push: int, weights: torch.Tensor) -> torch.Tensor:
        """This worker's ``push``-th gradient (0-based) at ``weights`` (d,), float64: the mean
        least-squares gradient over that push's rows, as the bench computes it."""
        self._own(rank, "minibatches")
        features, targets = self.pushes[push]
        w = np.asarray(weights, dtype=np.float64)
        return torch.from_numpy(features.T @ (features @ w - targets) / len(targets))

    def compute_time_s(self, rank: int, push: int) -> float:
        """Real seconds this worker computes its ``push``-th gradient (timed runs)."""
        self._own(rank, "step times")
        return float(self.times[push]) * self.time_unit_s

    def arrival_order(self) -> list[int]:
        """Lockstep, on a worker: the ranks whose gradients reach the server, in turn (see
        :meth:`AsyncBench.arrival_order`). The server's part holds none."""
        if self.rank == SERVER:
            raise ForeignShardError(
                f"rank {self.rank} called bench.arrival_order(): the server receives from "
                f"whichever worker sends, and holds no order. {_OWN_DATA_ONLY}"
            )
        if self.synchronous:
            raise ValueError("a synchronous bench has no arrival order")
        if self.order is None:
            raise ValueError("a timed bench's workers take no turns: its parts hold no order")
        return list(self.order)

    def _own(self, rank: int, what: str) -> None:
        if not 1 <= rank <= self.num_workers:
            raise ValueError(f"workers are ranks 1 .. {self.num_workers}, got {rank}")
        if rank != self.rank:
            raise ForeignShardError(
                f"rank {self.rank} asked for worker rank {rank}'s {what}: a rank holds only its "
                f"own data. {_OWN_DATA_ONLY}"
            )


def _whole_only(bench: Any, what: str) -> None:
    """Refuse ``what`` for a rank's part: the module's caches draw every worker's stream."""
    if isinstance(bench, AsyncPart):
        raise ForeignShardError(
            f"rank {bench.rank} called {what} with its part of the bench: it draws every "
            f"worker's stream, which stays in the launching process. {_OWN_DATA_ONLY}"
        )


def _refuse_on_server(bench: AsyncBench, what: str) -> None:
    """Refuse ``what`` on the server's rank (the student's code) and on a rank that left its
    group: the server holds no data, and what the workers draw, or when, reaches it only as
    their messages."""
    me = current_rank(bench._home_pid)
    if me is not None and not 1 <= me <= bench.num_workers:
        refuse_inside_ranks(what, _OWN_DATA_ONLY, bench._home_pid)


# The module's caches guard inside their bodies: a rank's process starts with empty caches
# (forked from the fork server, which never builds a bench), so a refused call is never
# answered from a cache.


@functools.lru_cache(maxsize=4)
def _least_squares(num_examples: int, num_features: int, seed: int) -> LeastSquares:
    """The workers' dataset (refused on the server's rank)."""
    if current_rank() in (SERVER, NO_RANK):
        refuse_inside_ranks("async_ranks._least_squares()", _OWN_DATA_ONLY)
    return make_least_squares(num_examples, num_features, seed=seed)


@functools.lru_cache(maxsize=8)
def _cached_trace(bench: AsyncBench) -> async_sgd.ServerRun:
    """The simulator's run at step size 0: the same draws and order as at any step size (they
    do not depend on the weights), and no divergence to stop it early. Refused on the
    server's rank; a worker reads its own stream and the lockstep order from it."""
    _whole_only(bench, "async_ranks._cached_trace()")
    _refuse_on_server(bench, "async_ranks._cached_trace()")
    problem = _least_squares(bench.num_examples, bench.num_features, bench.seed)
    if bench.synchronous:
        return async_sgd.simulate_sync_sgd(
            problem,
            num_steps=bench.num_updates,
            lr=0.0,
            eval_every=bench.num_updates,
            **bench._simulator_settings(),
        )
    return async_sgd.simulate_async_sgd(
        problem,
        num_updates=bench.num_updates,
        lr=0.0,
        eval_every=bench.num_updates,
        **bench._simulator_settings(),
    )


@functools.lru_cache(maxsize=32)
def _cached_stream(bench: AsyncBench, worker: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Worker ``worker``'s rows and step times (simulated s) for num_updates + 1 gradients:
    those the simulator gave its gradients, then draws from a generator of its own. Inside a
    rank, worker rank ``worker + 1``'s own only."""
    _whole_only(bench, "async_ranks._cached_stream()")
    if not 0 <= worker < bench.num_workers:
        raise ValueError(f"workers are 0 .. {bench.num_workers - 1}, got {worker}")
    refuse_other_rank(
        worker + 1, f"worker rank {worker + 1}'s stream", _OWN_DATA_ONLY, bench._home_pid
    )
    trace = _cached_trace(bench)
    if bench.synchronous:  # one gradient per step and worker
        rows, times = list(trace.rows[:, worker]), list(trace.compute_s[:, worker])
    else:
        mine = trace.workers == worker
        rows, times = list(trace.rows[mine]), list(trace.compute_s[mine])
    rng = np.random.default_rng([bench.run_seed, 2011, worker])
    factor = 1.0 if bench.slowdowns is None else bench.slowdowns[worker]
    while len(rows) < bench.num_updates + 1:
        times.append(factor * (bench.base_s + rng.exponential(bench.mean_delay_s)))
        rows.append(rng.integers(0, bench.num_examples, bench.batch_size))
    return rows, np.array(times)


class WaitedTooLong(RuntimeError):
    """A worker waited longer than the bench's patience."""


def _wait(work: Any, seconds: float, why: str) -> None:
    """Wait for ``work`` (an isend/irecv request) at most ``seconds``, then raise with ``why``.

    The request is waited for in a thread, not with ``work.wait(timeout)``: a gloo wait that
    times out closes the connection, and the other ranks would fail with "connection closed
    by peer" before this rank's reason reaches the launcher (and gloo's point-to-point
    requests say they are complete only once waited for, so they cannot be polled)."""
    if seconds == math.inf:
        work.wait()
        return
    done, failed = threading.Event(), []

    def waiter() -> None:
        try:
            work.wait()
        except BaseException as error:  # reported in the rank's own thread below
            failed.append(error)
        finally:
            done.set()

    threading.Thread(target=waiter, daemon=True).start()
    if not done.wait(seconds):
        raise WaitedTooLong(why)
    if failed:
        raise failed[0]


# The hint a lockstep worker adds when the server does not answer.
_TAKING_TURNS = (
    ". In this bench the workers take turns, so no other gradient comes until the server has "
    "answered this one: a server that waits for another rank first (for every worker, as "
    "synchronous SGD does, or for the ranks in a fixed order) waits forever. Receive from "
    "whichever worker sends (dist.recv without src), apply its gradient and answer it at once"
)
_LOG_KEYS = ("read_versions", "gradients", "weights_read", "sent_s", "replied_s", "reply_versions")


def bench_worker(
    rank: int, world_size: int, bench: AsyncBench | AsyncPart
) -> dict[str, np.ndarray]:
    """One worker (ranks 1 .. N): receive weights, compute, push, until the server says STOP.

    Returns its log, one entry per gradient it pushed: ``read_versions``, ``gradients``
    (pushes, d), ``weights_read`` (pushes, d), ``sent_s`` and ``replied_s``
    (time.perf_counter() when it pushed and when the answer came), ``reply_versions``; and
    ``started_s``, when the first weights came.
    """
    if world_size != bench.world_size:
        raise ValueError(f"the bench needs {bench.world_size} ranks, got {world_size}")
    order = bench.arrival_order() if bench.lockstep else []
    turns = iter([i for i, r in enumerate(order) if r == rank])
    if isinstance(bench, AsyncBench):  # a whole bench: drawn now, not in the first step's time
        _cached_stream(bench, rank - 1)
    message = torch.empty(bench.num_features + 1, dtype=torch.float64)
    # Timed runs wait without a watch: a thread per message would add to every step.
    patience = bench.patience_s if bench.lockstep else math.inf
    hint = _TAKING_TURNS if bench.lockstep else ""
    first = f"worker rank {rank} waited {patience:g} s for its first weights: the server sends "
    _wait(dist.irecv(message, SERVER), patience, first + "pack(0, w) to every worker first")
    started_s = time.perf_counter()
    version, weights = unpack(message)
    log: dict[str, list] = {key: [] for key in _LOG_KEYS}
    while version != STOP:
        push = len(log["sent_s"])
        if bench.lockstep:
            turn = _take_turn(rank, order, turns, version, bench)
        else:
            time.sleep(bench.compute_time_s(rank, push))  # the compute: frees the core
        gradient = bench.gradient(rank, push, weights)
        outgoing = pack(version, gradient)  # held until the send is done
        log["sent_s"].append(time.perf_counter())
        what = f"its gradient number {push} (computed at version {version})"
        _wait(
            dist.isend(outgoing, SERVER),
            patience,
            f"worker rank {rank} waited {patience:g} s for the server to receive {what}{hint}",
        )
        _wait(
            dist.irecv(message, SERVER),
            patience,
            f"worker rank {rank} sent {what} and got no answer in {patience:g} s{hint}",
        )
        log["replied_s"].append(time.perf_counter())
        log["read_versions"].append(version)
        log["gradients"].append(gradient)
        log["weights_read"].append(weights)
        version, weights = unpack(message)
        log["reply_versions"].append(version)
        if bench.lockstep:
            _hand_on_turn(rank, order, turn, bench)
    found = {key: np.array([np.asarray(v) for v in values]) for key, values in log.items()}
    for key in ("gradients", "weights_read"):
        found[key] = found[key].reshape(-1, bench.num_features)
    found["started_s"] = np.array(started_s)
    return found


def _take_turn(rank: int, order: list[int], turns: Any, version: int, bench: AsyncBench) -> int:
    """Lockstep: wait for the token from the worker whose gradient comes just before this
    one in ``order`` (it hands it on once answered); return this turn's place in ``order``."""
    turn = next(turns, None)
    if turn is None:
        raise WaitedTooLong(
            f"worker rank {rank} got weights (version {version}) after the server should have "
            f"ended: it applies {bench.num_updates} gradients, then answers one more from each "
            f"worker with STOP (stop_workers)"
        )
    if turn > 0 and order[turn - 1] != rank:
        seconds = 2 * bench.patience_s
        _wait(
            dist.irecv(torch.empty(1), order[turn - 1]),
            seconds,
            f"worker rank {rank} waited {seconds:g} s for its turn: an earlier gradient got "
            f"no answer from the server",
        )
    return turn


def _hand_on_turn(rank: int, order: list[int], turn: int, bench: AsyncBench) -> None:
    """Lockstep: this turn's answer came; hand the token to the next turn's worker."""
    if turn + 1 < len(order) and order[turn + 1] != rank:
        token = torch.zeros(1)
        _wait(
            dist.isend(token, order[turn + 1]),
            2 * bench.patience_s,
            f"worker rank {rank} could not hand the turn to rank {order[turn + 1]}",
        )


def stop_workers(world_size: int, bench: AsyncBench | AsyncPart) -> None:
    """The server's ending, after its last update: receive the gradient each worker is
    computing (from whichever comes first; it is not applied) and answer it with STOP."""
    message = torch.empty(bench.num_features + 1, dtype=torch.float64)
    for _ in range(world_size - 1):
        worker = dist.recv(message)
        dist.send(pack(STOP, torch.zeros(bench.num_features)), worker)


def sync_server(
    rank: int, world_size: int, bench: AsyncBench | AsyncPart
) -> tuple[torch.Tensor, list[int], list[int]]:
    """Synchronous SGD through the same workers: each step waits for a gradient from every
    worker, applies their mean with step lr, then answers all (num_updates steps). Returns
    the weights after every step, zeros for the staleness, and no per-update worker."""
    w = bench.start()
    for worker in range(1, world_size):
        dist.send(pack(0, w), worker)
    message = torch.empty(bench.num_features + 1, dtype=torch.float64)
    weights = [w]
    for step in range(1, bench.num_updates + 1):
        gradients = []
        for worker in range(1, world_size):
            dist.recv(message, worker)
            gradients.append(unpack(message)[1])
        w = w - bench.lr * torch.stack(gradients).mean(dim=0)
        weights.append(w)
        for worker in range(1, world_size):
            dist.send(pack(step, w), worker)
    stop_workers(world_size, bench)
    return torch.stack(weights), [0] * bench.num_updates, []


Server = Callable[[int, int, AsyncPart], Any]


@dataclass
class AsyncRun:
    """One run on real processes: what the server returned and what the ranks logged."""

    bench: AsyncBench
    returned: Any  # the server's return value, as it gave it
    server_log: record.Recording  # the server's communication calls
    worker_logs: list[dict[str, np.ndarray]]  # bench_worker's log of ranks 1 .. N

    def update_times_s(self, workers: Sequence[int] | None) -> np.ndarray:
        """Simulated seconds (real / time_unit_s) from the first weights to each update:
        when the gradient it applied was pushed; for a synchronous run (``workers`` None),
        when the last gradient of each step was. Timed runs only."""
        logs = self.worker_logs
        start = min(float(log["started_s"]) for log in logs)
        if workers is None:
            steps = self.bench.num_updates
            pushed = np.max([log["sent_s"][:steps] for log in logs], axis=0)
        else:
            seen = [0] * len(logs)
            pushed = []
            for rank in workers:
                pushed.append(logs[rank - 1]["sent_s"][seen[rank - 1]])
                seen[rank - 1] += 1
        return (np.asarray(pushed) - start) / self.bench.time_unit_s


def _sessions(
    rank: int, world_size: int, servers: list[Server], parts: OwnParts
) -> list[tuple[Any, record.Recording]]:
    """Each server in turn on the same ranks, with this rank's part of its bench (``parts``:
    one list of parts per rank, a part per session, read before any session starts): rank 0
    runs the server, the others bench_worker; each under the recorder, after a barrier that
    it does not record."""
    found = []
    for server, bench in zip(servers, parts.take(rank), strict=True):
        dist.barrier()  # all ranks started and ready: the run's clock starts together
        with record.communication() as log:
            if rank == SERVER:
                value = server(rank, world_size, bench)
            else:
                value = bench_worker(rank, world_size, bench)
        found.append((value, log))
    return found


def run_all(sessions: list[tuple[Server, AsyncBench]], *, timeout: float = 60) -> list[AsyncRun]:
    """Several runs in one launch (benches of one world size), one after the other. Each
    rank gets its own part of every bench only (:meth:`AsyncBench.own_part`), built here."""
    from distopt.engine.launcher import launch  # its ranks import this module

    sizes = {bench.world_size for _, bench in sessions}
    if len(sizes) != 1:
        raise ValueError(f"run_all needs benches of one world size, got {sorted(sizes)}")
    size = sizes.pop()
    servers = [server for server, _ in sessions]
    # every worker's stream drawn here, once: each rank's part is read before the runs start
    per_rank_parts = [[bench.own_part(rank) for _, bench in sessions] for rank in range(size)]
    with OwnParts(per_rank_parts) as parts:
        per_rank = launch(_sessions, size, servers, parts, timeout=timeout)
    return [
        AsyncRun(bench, per_rank[0][i][0], per_rank[0][i][1], [r[i][0] for r in per_rank[1:]])
        for i, (_, bench) in enumerate(sessions)
    ]


def run(server: Server, bench: AsyncBench, *, timeout: float = 30) -> AsyncRun:
    """``server`` on rank 0 and :func:`bench_worker` on ranks 1 .. N, recorded."""
    return run_all([(server, bench)], timeout=timeout)[0]
