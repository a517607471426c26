"""A rank holds only its own data: the benches of sections 05 and 06, tried method by method.

Each bench of :data:`BENCHES` (the gossip ring's, the parameter server's, the federated
clients') is built here, shipped to real ranks as its exercise ships it, and there every
attribute of it, underscore ones included, of a copy rebuilt from its pickle and of a
``dataclasses.replace`` copy is read, and every callable is called with each argument the
probe can make for it (every rank's, worker's or client's number; the rank's own model). Each
value that comes back is flattened into its numbers and compared, back here, with what that
rank must never hold: another rank's data (examples, first model, step times), the
simulator's trajectory (what the ranks must compute), and, on the parameter server, any
data at all. A call either refuses (``ForeignShardError``) or returns none of those numbers.
Then each rank leaves its process group (``dist.destroy_process_group()``) and is probed
again: a bench does not open up to a rank that left.

A new method that answers for another rank fails here without being named: the probe finds
it by ``dir``. One whose parameters the probe cannot fill fails too, until its parameter is
added to the bench's ``arguments``. (Sections 01 and 02's benches: tests/ranks/test_own_data.py.)
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import torch.distributed as dist

from distopt import launch
from distopt.problems.own_data import ForeignShardError
from distopt.ranks import async_ranks, gossip_ranks
from distopt.ranks.async_ranks import AsyncBench
from distopt.ranks.federated_ranks import FederatedBench
from distopt.ranks.gossip_ranks import GossipProblem

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Attributes not tried: they rebuild, mutate or introspect the object itself (and answer
# nothing of its data), or are tried another way (a rebuilt copy is probed whole).
_NOT_CALLED = frozenset(
    {
        "__init__", "__new__", "__setattr__", "__delattr__", "__init_subclass__",
        "__subclasshook__", "__class__", "__getattribute__", "__getattr__", "__dir__",
        "__format__", "__sizeof__", "__setstate__", "__reduce_ex__", "__replace__",
    }
)  # fmt: skip
# Numbers too common to tell data apart by (zeros, ones, 0/1 labels are not compared).
_COMMON = {0.0, 1.0, -1.0}


def _numbers(value: Any, depth: int = 0) -> list[np.ndarray]:
    """Every float a value carries: tensors, arrays, Python floats, containers, and the
    fields of the package's records (a LeastSquares, a simulator's run)."""
    if depth > 6:
        return []
    if isinstance(value, torch.Tensor):
        return [value.detach().to(torch.float64).reshape(-1).numpy().copy()]
    if isinstance(value, np.ndarray):
        return [value.astype(np.float64).reshape(-1)] if value.dtype.kind == "f" else []
    if isinstance(value, float | np.floating):
        return [np.array([float(value)])]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _numbers(v, depth + 1)]
    if isinstance(value, list | tuple | set | frozenset):
        return [a for v in value for a in _numbers(v, depth + 1)]
    if type(value).__module__.startswith("distopt.") and hasattr(value, "__dict__"):
        return [a for v in vars(value).values() for a in _numbers(v, depth + 1)]
    return []


def _join(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0)


def _short(value: Any) -> str:
    return repr(value) if isinstance(value, int | str | float) or value is None else (
        type(value).__name__
    )  # fmt: skip


def _probe_object(obj: Any, path: str, args: dict[str, list], out: list) -> None:
    """Every attribute of ``obj``, read or called with every combination of ``args``:
    ``(attribute, arguments, outcome, numbers)`` into ``out``."""
    for name in sorted(dir(obj)):
        if name in _NOT_CALLED:
            continue
        where = f"{path}.{name}"
        try:
            value = getattr(obj, name)
        except ForeignShardError:
            out.append((where, "", "refused", None))
            continue
        if not callable(value) or isinstance(value, type):
            out.append((where, "", "read", _join(_numbers(value))))
            continue
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):
            signature = None
        calls: list[dict] = [{}]
        for param in signature.parameters.values() if signature else ():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if param.name not in args:
                if param.default is param.empty:
                    out.append((where, "", f"no argument for parameter {param.name!r}", None))
                    calls = []
                    break
                continue
            calls = [{**c, param.name: a} for c in calls for a in args[param.name]]
        for kwargs in calls:
            shown = ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())
            try:
                result = value(**kwargs)
            except ForeignShardError:
                out.append((where, shown, "refused", None))
            except Exception as exc:  # a call that fails returns nothing either
                out.append((where, shown, f"raised {type(exc).__name__}", None))
            else:
                out.append((where, shown, "answered", _join(_numbers(result))))


def _probe_all(bench: Any, args: dict[str, list], phase: str) -> list:
    found: list = []
    _probe_object(bench, f"{phase}:bench", args, found)
    _probe_object(pickle.loads(pickle.dumps(bench)), f"{phase}:rebuilt", args, found)
    _probe_object(dataclasses.replace(bench), f"{phase}:replaced", args, found)
    return found


def _probe(rank: int, world_size: int, bench: Any, arguments: Callable) -> list:
    """In a rank: every attribute of the bench and of its copies, in its group and then
    after leaving it (``destroy_process_group``): (attribute, arguments, outcome, numbers)."""
    args = arguments(bench, rank)
    found = _probe_all(bench, args, "in group")
    dist.barrier()  # no rank leaves while another still probes in the group
    dist.destroy_process_group()
    return found + _probe_all(bench, args, "left group")


# --- what each bench's ranks may ask for, and what they must never hold --------------------


def _gossip_arguments(problem: GossipProblem, rank: int) -> dict[str, list]:
    return {
        "rank": [*range(problem.world_size), None],
        "step": sorted({0, problem.steps - 1}),
        "model": [problem.start(rank)],
        "what": ["probe"],
        "other": [problem],
        "value": [problem],
    }


def _gossip_foreign(problem: GossipProblem, rank: int) -> list:
    others = [r for r in range(problem.world_size) if r != rank]
    shards = problem.shards()
    trajectory = gossip_ranks.reference_models(problem)
    return [
        *(problem.starts()[r] for r in others),
        *(shards[r].features for r in others),
        *(shards[r].targets for r in others),
        trajectory[1:],  # every model after the first step: what the ranks must compute
    ]


def _gossip_own(problem: GossipProblem, rank: int) -> list:
    shard = problem.shards()[rank]
    return [problem.starts()[rank], shard.features, shard.targets]


def _async_arguments(bench: AsyncBench, rank: int) -> dict[str, list]:
    return {
        "rank": [*range(bench.world_size), None],
        "worker": list(range(bench.num_workers)),
        "push": [0, 1],
        "weights": [torch.zeros(bench.num_features, dtype=torch.float64)],
        "staleness": [0, 2],
        "lr": [0.1],
        "what": ["probe"],
        "other": [bench],
        "value": [bench],
    }


def _streams(bench: AsyncBench) -> list[np.ndarray]:
    return [async_ranks._cached_stream(bench, w)[1] for w in range(bench.num_workers)]


def _async_foreign(bench: AsyncBench, rank: int) -> list:
    """The server holds no data: the dataset, every worker's step times and the simulator's
    weights are foreign to it. A worker shares the dataset and has its own step times."""
    streams = _streams(bench)
    others = [w for w in range(bench.num_workers) if w != rank - 1]
    foreign = [bench.reference().weights[1:]]
    foreign += [streams[w] for w in others] + [streams[w] * bench.time_unit_s for w in others]
    if rank == async_ranks.SERVER:
        problem = bench.problem()
        foreign += [problem.features, problem.targets]
    return foreign


def _async_own(bench: AsyncBench, rank: int) -> list:
    if rank == async_ranks.SERVER:
        return [bench.start()]
    times = _streams(bench)[rank - 1]
    problem = bench.problem()
    return [times, times * bench.time_unit_s, problem.features, problem.targets]


def _federated_arguments(bench: FederatedBench, rank: int) -> dict[str, list]:
    return {
        "client": list(range(bench.num_clients)),
        "client_streams": [False, True],
        "weighting": ["examples"],
        "what": ["probe"],
        "other": [bench],
        "value": [bench],
    }


def _federated_foreign(bench: FederatedBench, rank: int) -> list:
    others = [k for k in range(bench.num_clients) if k != rank - 1]
    return [bench.client_data(k)[0] for k in others] + [bench.reference_run().w]


def _federated_own(bench: FederatedBench, rank: int) -> list:
    return [bench.client_data(rank - 1)[0]] if rank > 0 else []


@dataclasses.dataclass(frozen=True)
class Registered:
    """A bench shipped to ranks: how it is built, what its ranks may be asked with, and what
    rank r must not hold (``foreign``) beside what it may (``own``)."""

    make: Callable[[], Any]
    arguments: Callable[[Any, int], dict[str, list]]
    foreign: Callable[[Any, int], list]
    own: Callable[[Any, int], list]
    # Methods that must refuse on the given ranks whatever they return (an answer that is
    # not numbers, such as the order in which the workers' gradients arrive).
    refused_on: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)


BENCHES: dict[str, Registered] = {
    "GossipProblem (05 ring_gossip_sgd)": Registered(
        make=lambda: GossipProblem(world_size=3, steps=2, num_features=4, examples_per_node=6),
        arguments=_gossip_arguments,
        foreign=_gossip_foreign,
        own=_gossip_own,
    ),
    "AsyncBench (05 async_server; the server is rank 0)": Registered(
        make=lambda: AsyncBench(
            num_workers=2, num_updates=4, num_examples=16, num_features=3, slowdowns=(1.0, 2.0)
        ),  # fmt: skip
        arguments=_async_arguments,
        foreign=_async_foreign,
        own=_async_own,
        refused_on={"arrival_order": (async_ranks.SERVER,), "_stream": (async_ranks.SERVER,)},
    ),
    "FederatedBench (06 fedavg_over_ranks; the server is rank 0)": Registered(
        make=lambda: FederatedBench(client_sizes=(4, 6), rounds=2, dim=3),
        arguments=_federated_arguments,
        foreign=_federated_foreign,
        own=_federated_own,
    ),
}


def _values(arrays: list) -> set[float]:
    found: set[float] = set()
    for a in arrays:
        found.update(np.asarray(a, dtype=np.float64).reshape(-1).tolist())
    return found - _COMMON


def _leaks(found: list, foreign: set[float]) -> tuple[list[str], list[str]]:
    leaks, unfilled = [], []
    for where, shown, outcome, numbers in found:
        if outcome.startswith("no argument"):
            unfilled.append(f"{where}: {outcome}")
        elif numbers is not None and len(numbers):
            hits = foreign.intersection(numbers.tolist())
            if hits:
                leaks.append(f"{where}({shown}) -> {len(hits)} numbers of other ranks' data "
                             "or of the simulator's run")  # fmt: skip
    return leaks, unfilled


@pytest.fixture(scope="module")
def probed() -> dict[str, tuple[Any, list]]:
    """Each bench and what its ranks found (one launch per bench, shared by the tests)."""
    found = {}
    for name, entry in BENCHES.items():
        bench = entry.make()
        found[name] = (bench, launch(_probe, bench.world_size, bench, entry.arguments))
    return found


@pytest.mark.parametrize("name", list(BENCHES))
def test_no_method_of_a_shipped_bench_answers_for_another_rank(name, probed):
    entry = BENCHES[name]
    bench, per_rank = probed[name]
    for rank, found in enumerate(per_rank):
        foreign = _values(entry.foreign(bench, rank)) - _values(entry.own(bench, rank))
        assert foreign, "the foreign numbers of a bench cannot be empty"
        leaks, unfilled = _leaks(found, foreign)
        assert not unfilled, (
            f"{name}, rank {rank}: the probe cannot call {unfilled}; add the parameter to "
            "the bench's arguments so that the method is tried"
        )
        assert not leaks, f"{name}, rank {rank}: answered for another rank: {leaks}"
        for method, ranks in entry.refused_on.items():
            if rank in ranks:
                outcomes = {o for w, _, o, _ in found if w.endswith(f"bench.{method}")}
                assert outcomes == {"refused"}, (
                    f"{name}, rank {rank}: {method} gave {sorted(outcomes)}; it must refuse"
                )


# Per bench: methods that must have answered its own rank, and methods that must have been
# refused, in the group (so the probe is seen to reach the data, not only to find nothing).
_SEEN = {
    "GossipProblem (05 ring_gossip_sgd)": (
        ["start", "gradient", "_minibatch"],
        ["start", "gradient", "_minibatch", "shards", "starts", "all_rows", "data"],
    ),
    "AsyncBench (05 async_server; the server is rank 0)": (
        ["gradient", "compute_time_s", "_stream", "_problem", "arrival_order"],
        ["gradient", "_stream", "problem", "reference", "_trace", "_simulate", "excess_loss"],
    ),
    "FederatedBench (06 fedavg_over_ranks; the server is rank 0)": (
        ["client_data", "client_rng", "participants"],
        ["client_data", "client_rng", "problem", "_problem", "reference_run"],
    ),
}


# What every rank may know, in its group or out of it: which clients a round samples.
_PUBLIC = {"participants"}


@pytest.mark.parametrize("name", list(BENCHES))
def test_the_probe_reaches_the_data_methods_and_sees_refusals(name, probed):
    """Rank 1 (a ring node, a worker, a client): its own data answered, the rest refused;
    after it left its group, every data method refused."""
    _, per_rank = probed[name]
    outcomes = {(where, outcome) for where, _, outcome, _ in per_rank[1]}
    answered, refused = _SEEN[name]
    for method in answered:
        assert (f"in group:bench.{method}", "answered") in outcomes, f"{method} did not answer"
    for method in refused:
        assert (f"in group:bench.{method}", "refused") in outcomes, f"{method} was not refused"
    for method in set(answered) - _PUBLIC:
        assert (f"left group:bench.{method}", "answered") not in outcomes, (
            f"{method} answered a rank that had left its group"
        )


def test_a_new_method_that_answers_for_another_rank_fails_the_probe():
    """The test is not vacuous: a subclass with one unguarded private method is caught."""

    @dataclasses.dataclass(frozen=True)
    class Leaky(GossipProblem):
        def _unguarded_starts(self) -> np.ndarray:
            rng = np.random.default_rng([self.seed, 1])
            return self.start_spread * rng.standard_normal((self.world_size, self.num_features))

    problem = Leaky(world_size=3, steps=1, num_features=4, examples_per_node=6)
    with mock.patch("distopt.problems.own_data.current_rank", lambda home_pid=None: 0):
        found: list = []
        _probe_object(problem, "bench", _gossip_arguments(problem, 0), found)
    foreign = _values(_gossip_foreign(problem, 0)) - _values(_gossip_own(problem, 0))
    leaks, _ = _leaks(found, foreign)
    assert [leak.split("(")[0] for leak in leaks] == ["bench._unguarded_starts"]
