"""A rank holds only its own data: the benches of sections 05 and 06, tried method by method.

Each bench of :data:`BENCHES` (the gossip ring's, the parameter server's, the federated
clients') is built here and shipped to real ranks in two ways: as its exercise's test ships
it, each rank its own part only (``GossipPart`` by ``record.run_traced``, ``AsyncPart`` as
``async_ranks.run_all`` ships it, ``FederatedPart`` by ``launch`` itself), and whole, as a
demo's plain ``launch`` (or a bench inside a container) would. In each rank every attribute
of what arrived, underscore ones included (and, for a part, every name of the whole bench's
class too), of a copy rebuilt from its pickle and of a ``dataclasses.replace`` copy is read,
and every callable is called with each argument the probe can make for it (every rank's,
worker's or client's number; the rank's own model). Each value that comes back is flattened
into its numbers and compared, back here, with what that rank must never hold: another
rank's data (examples, first model, step times), the simulator's trajectory (what the ranks
must compute), and, on the parameter server, any data at all. A call either refuses
(``ForeignShardError``) or returns none of those numbers. Then each rank leaves its process
group (``dist.destroy_process_group()``) and is probed again: a whole bench does not open up
to a rank that left, and a part holds nothing more to open.

A new method that answers for another rank fails here without being named: the probe finds
it by ``dir``. One whose parameters the probe cannot fill fails too, until its parameter is
added to the bench's ``arguments``. (Sections 01 and 02's benches: tests/ranks/test_own_data.py.)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import pickle
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import torch.distributed as dist

from autograder.references.async_decentralized import async_server
from distopt import launch
from distopt.engine import record
from distopt.engine.own_parts import OwnParts, on_own_part, parts_of
from distopt.problems.own_data import ForeignShardError
from distopt.ranks import async_ranks, gossip_ranks
from distopt.ranks.async_ranks import AsyncBench, AsyncPart
from distopt.ranks.federated_ranks import FederatedBench, FederatedPart
from distopt.ranks.gossip_ranks import GossipPart, GossipProblem

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
    """Every attribute of ``obj`` (of a rank's part, also every name of its whole bench's
    class), read or called with every combination of ``args``: ``(attribute, arguments,
    outcome, numbers)`` into ``out``."""
    whole = getattr(type(obj), "_whole", object)  # a part's whole bench (RankPart)
    for name in sorted(set(dir(obj)) | set(dir(whole))):
        if name in _NOT_CALLED:
            continue
        where = f"{path}.{name}"
        try:
            value = getattr(obj, name)
        except ForeignShardError:
            out.append((where, "", "refused", None))
            continue
        except AttributeError:  # a part lacks it (the seed): nothing to read
            out.append((where, "", "absent", None))
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
    """In a rank: what it received, then every attribute of the bench and of its copies, in
    its group and then after leaving it (``destroy_process_group``): (attribute, arguments,
    outcome, numbers)."""
    args = arguments(bench, rank)
    found = [("received", type(bench).__name__, "type", None)]
    found += _probe_all(bench, args, "in group")
    dist.barrier()  # no rank leaves while another still probes in the group
    dist.destroy_process_group()
    return found + _probe_all(bench, args, "left group")


def _probe_built(rank: int, world_size: int, made: tuple, arguments: Callable) -> list:
    """:func:`_probe` of a whole bench the rank builds itself from its class and fields (a
    bench that ships by parts never reaches a rank whole: ``launch`` cuts the argument and
    withholds any other copy), as rank code could build one with a seed it guessed."""
    cls, fields = made
    return _probe(rank, world_size, cls(**fields), arguments)


# --- how a bench reaches its ranks ---------------------------------------------------------


def _launch_whole(bench: Any, arguments: Callable) -> list:
    """Whole, as a demo's plain ``launch`` ships a bench that does not ship by parts."""
    return launch(_probe, bench.world_size, bench, arguments)


def _launch_built(bench: Any, arguments: Callable) -> list:
    """Whole, built inside each rank from its fields (see :func:`_probe_built`)."""
    fields = {f.name: getattr(bench, f.name) for f in dataclasses.fields(bench)}
    return launch(_probe_built, bench.world_size, (type(bench), fields), arguments)


def _launch_plain(bench: Any, arguments: Callable) -> list:
    """``launch(fn, n, bench)``, as 06's test cell launches it (launch cuts the bench)."""
    return launch(_probe, bench.world_size, bench, arguments)


def _run_traced(bench: Any, arguments: Callable) -> list:
    """As 05's ring_gossip_sgd test ships it: ``record.run_traced`` (each rank its part)."""
    return [value for value, _ in record.run_traced(_probe, bench, arguments)]


def _as_run_all(bench: AsyncBench, arguments: Callable) -> list:
    """As ``async_ranks.run_all`` ships a bench: each rank ``bench.own_part(rank)``, built
    here, through :class:`OwnParts` (the servers and workers of run_all cannot be probed)."""
    with OwnParts(parts_of(bench, bench.world_size)) as parts:
        runner = functools.partial(on_own_part, _probe)
        return launch(runner, bench.world_size, parts, arguments)


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
        "rank": [*range(bench.world_size), None],
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
    """A bench shipped to ranks: how it is built and shipped (``ship``), what each rank must
    find it received (``received``: the class's name), what its ranks may be asked with, and
    what rank r must not hold (``foreign``) beside what it may (``own``)."""

    make: Callable[[], Any]
    ship: Callable[[Any, Callable], list]
    received: str
    arguments: Callable[[Any, int], dict[str, list]]
    foreign: Callable[[Any, int], list]
    own: Callable[[Any, int], list]
    # Rank 1 (a ring node, a worker, a client), in its group: methods that must have
    # answered its own data, and methods that must have been refused.
    answered: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    # Methods that must refuse on the given ranks whatever they return (an answer that is
    # not numbers, such as the order in which the workers' gradients arrive).
    refused_on: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @property
    def is_part(self) -> bool:
        return self.received.endswith("Part")


_GOSSIP = dict(
    make=lambda: GossipProblem(world_size=3, steps=2, num_features=4, examples_per_node=6),
    arguments=_gossip_arguments,
    foreign=_gossip_foreign,
    own=_gossip_own,
)
_ASYNC = dict(
    make=lambda: AsyncBench(
        num_workers=2, num_updates=4, num_examples=16, num_features=3, slowdowns=(1.0, 2.0)
    ),  # fmt: skip
    arguments=_async_arguments,
    foreign=_async_foreign,
    own=_async_own,
    refused_on={"arrival_order": (async_ranks.SERVER,), "_stream": (async_ranks.SERVER,)},
)
_FEDERATED = dict(
    make=lambda: FederatedBench(client_sizes=(4, 6), rounds=2, dim=3),
    arguments=_federated_arguments,
    foreign=_federated_foreign,
    own=_federated_own,
)
# What a part refuses by name: the whole bench's methods that hold more than its own data.
_GOSSIP_WHOLE = ("shards", "starts", "all_rows", "data", "_minibatch")
_ASYNC_WHOLE = ("problem", "_problem", "reference", "_trace", "_simulate", "excess_loss")
_FEDERATED_WHOLE = ("problem", "_problem", "reference_run", "_settings")

BENCHES: dict[str, Registered] = {
    "GossipPart (05 ring_gossip_sgd, as run_traced ships it)": Registered(
        **_GOSSIP,
        ship=_run_traced,
        received="GossipPart",
        answered=("start", "gradient"),
        refused=("start", "gradient", *_GOSSIP_WHOLE, "own_part"),
    ),
    "GossipProblem (05, whole, built by the rank itself)": Registered(
        **_GOSSIP,
        ship=_launch_built,
        received="GossipProblem",
        answered=("start", "gradient", "_minibatch", "own_part"),
        refused=("start", "gradient", "_minibatch", "shards", "starts", "all_rows", "data"),
    ),
    "AsyncPart (05 async_server, as run_all ships it; the server is rank 0)": Registered(
        **_ASYNC,
        ship=_as_run_all,
        received="AsyncPart",
        answered=("gradient", "compute_time_s", "arrival_order"),
        refused=("gradient", "compute_time_s", "_stream", *_ASYNC_WHOLE, "own_part"),
    ),
    "AsyncBench (05, whole, as a plain launch ships it; the server is rank 0)": Registered(
        **_ASYNC,
        ship=_launch_whole,
        received="AsyncBench",
        answered=("gradient", "compute_time_s", "_stream", "_problem", "arrival_order"),
        refused=(
            "gradient",
            "_stream",
            "problem",
            "reference",
            "_trace",
            "_simulate",
            "excess_loss",
        ),
    ),  # fmt: skip
    "FederatedPart (06 fedavg_over_ranks, as launch ships it; the server is rank 0)": Registered(
        **_FEDERATED,
        ship=_launch_plain,
        received="FederatedPart",
        answered=("client_data", "client_rng", "secret_rng", "participants"),
        refused=("client_data", "client_rng", "secret_rng", *_FEDERATED_WHOLE, "own_part"),
    ),
    "FederatedBench (06, whole, built by the rank itself; the server is rank 0)": Registered(
        **_FEDERATED,
        ship=_launch_built,
        received="FederatedBench",
        answered=("client_data", "client_rng", "secret_rng", "participants", "own_part"),
        refused=(
            "client_data",
            "client_rng",
            "secret_rng",
            "problem",
            "_problem",
            "reference_run",
            "own_part",
        ),
    ),  # fmt: skip
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
        found[name] = (bench, entry.ship(bench, entry.arguments))
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


# What every rank may know, in its group or out of it: which clients a round samples.
_PUBLIC = {"participants"}


@pytest.mark.parametrize("name", list(BENCHES))
def test_the_probe_reaches_the_data_methods_and_sees_refusals(name, probed):
    """Rank 1 (a ring node, a worker, a client): its own data answered, the rest refused
    (so the probe is seen to reach the data, not only to find nothing); after it left its
    group, a whole bench refused every data method (a part holds only its own)."""
    entry = BENCHES[name]
    _, per_rank = probed[name]
    outcomes = {(where, outcome) for where, _, outcome, _ in per_rank[1]}
    for method in entry.answered:
        assert (f"in group:bench.{method}", "answered") in outcomes, f"{method} did not answer"
    for method in entry.refused:
        assert (f"in group:bench.{method}", "refused") in outcomes, f"{method} was not refused"
    if entry.is_part:
        return
    for method in set(entry.answered) - _PUBLIC:
        assert (f"left group:bench.{method}", "answered") not in outcomes, (
            f"{method} answered a rank that had left its group"
        )


@pytest.mark.parametrize("name", list(BENCHES))
def test_each_rank_received_what_its_launch_ships_and_a_part_no_seed(name, probed):
    """The exercises' launches ship parts (run_traced, run_all, launch itself): every rank
    received one, with no seed to read, in its group or out of it, nor in a copy."""
    entry = BENCHES[name]
    _, per_rank = probed[name]
    for rank, found in enumerate(per_rank):
        assert found[0] == ("received", entry.received, "type", None), (rank, found[0])
        if not entry.is_part:
            continue
        seeds = {(w, o) for w, _, o, _ in found if w.rsplit(".", 1)[-1] in ("seed", "run_seed")}
        assert seeds and {o for _, o in seeds} == {"absent"}, (rank, sorted(seeds))


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


def test_a_part_that_carries_another_ranks_rows_fails_the_probe():
    """The probe of a part is not vacuous either: rank 0's part made with rank 1's rows
    leaks them through its field (and its pickling methods), and nothing else does."""
    problem = GossipProblem(world_size=3, steps=1, num_features=4, examples_per_node=6)
    part = dataclasses.replace(problem.own_part(0), rows=problem.own_part(1).rows)
    found: list = []
    _probe_object(part, "bench", _gossip_arguments(problem, 0), found)
    foreign = _values(_gossip_foreign(problem, 0)) - _values(_gossip_own(problem, 0))
    leaks, _ = _leaks(found, foreign)
    names = {leak.split("(")[0] for leak in leaks}
    assert "bench.rows" in names and all(n.startswith("bench.__") for n in names - {"bench.rows"})


# --- each bench's part, in this process: no seed, its own data, refusals -------------------


def _no_seed(part: Any) -> None:
    assert not [name for name in dir(part) if "seed" in name], dir(part)
    assert not hasattr(part, "seed")
    fields = {f.name for f in dataclasses.fields(part)}
    assert not fields & {"seed", "run_seed"}, fields


def test_a_gossip_part_holds_no_seed_and_refuses_another_ranks_data():
    problem = GossipProblem(world_size=3, steps=3, num_features=4, examples_per_node=6)
    model = torch.linspace(-1, 1, 4, dtype=torch.float64)
    for rank in range(3):
        part = pickle.loads(pickle.dumps(problem.own_part(rank)))
        assert isinstance(part, GossipPart) and part.rank == rank
        _no_seed(part)
        assert torch.equal(part.start(rank), problem.start(rank))
        for step in range(3):  # the bench's gradient, bit for bit
            assert torch.equal(
                part.gradient(step, rank, model), problem.gradient(step, rank, model)
            )
        other = (rank + 1) % 3
        for ask in (
            functools.partial(part.start, other),
            functools.partial(part.gradient, 0, other, model),
        ):
            with pytest.raises(ForeignShardError, match="holds only its own data"):
                ask()
        for name in ("shards", "starts", "all_rows", "data", "_minibatch"):
            with pytest.raises(ForeignShardError, match="messages"):
                getattr(part, name)


def test_an_async_part_holds_no_seed_and_refuses_another_workers_data():
    bench = AsyncBench(num_workers=3, num_updates=6, slowdowns=(1.0, 2.0, 1.0), run_seed=2)
    weights = torch.linspace(-1, 1, bench.num_features, dtype=torch.float64)
    server = pickle.loads(pickle.dumps(bench.own_part(async_ranks.SERVER)))
    assert isinstance(server, AsyncPart)
    _no_seed(server)
    assert server.pushes == () and len(server.times) == 0 and server.order is None
    assert torch.equal(server.start(), bench.start()) and server.step_size(2) == bench.lr
    for ask in (lambda: server.gradient(1, 0, weights), server.arrival_order):
        with pytest.raises(ForeignShardError):
            ask()
    for rank in range(1, 4):
        part = pickle.loads(pickle.dumps(bench.own_part(rank)))
        _no_seed(part)
        for push in range(bench.num_updates + 1):  # the bench's, bit for bit
            assert torch.equal(
                part.gradient(rank, push, weights), bench.gradient(rank, push, weights)
            )
            assert part.compute_time_s(rank, push) == bench.compute_time_s(rank, push)
        assert part.arrival_order() == bench.arrival_order()
        other = rank % 3 + 1
        for ask in (
            functools.partial(part.gradient, other, 0, weights),
            functools.partial(part.compute_time_s, other, 0),
        ):
            with pytest.raises(ForeignShardError, match="holds only its own data"):
                ask()
        for name in ("problem", "reference", "_simulate", "_trace", "_stream", "own_part"):
            with pytest.raises(ForeignShardError, match="messages"):
                getattr(part, name)
        with pytest.raises(ForeignShardError):
            async_ranks._cached_stream(part, rank - 1)


def test_a_federated_part_holds_no_seed_and_refuses_another_clients_data():
    bench = FederatedBench(client_sizes=(4, 6, 5), clients_per_round=2, rounds=3, dim=3)
    server = pickle.loads(pickle.dumps(bench.own_part(0)))
    assert isinstance(server, FederatedPart)
    _no_seed(server)
    assert server.data is server.stream is server.secrets is None
    assert server.participants() == bench.participants()
    for rank in range(1, 4):
        part = pickle.loads(pickle.dumps(bench.own_part(rank)))
        _no_seed(part)
        client = rank - 1
        X, y = part.client_data(client)
        assert np.array_equal(X, bench.client_data(client)[0])
        assert np.array_equal(y, bench.client_data(client)[1])
        for name in ("client_rng", "secret_rng"):
            mine, whole = getattr(part, name)(client), getattr(bench, name)(client)
            assert mine.integers(0, 99, 8).tolist() == whole.integers(0, 99, 8).tolist()
            rng = getattr(part, name)
            assert rng(client).random() == rng(client).random()  # a fresh copy every time
        assert part.steps_of(client) == bench.steps_of(client)
        assert part.bytes_per_round() == bench.bytes_per_round()
    for rank in range(4):
        part = bench.own_part(rank)
        for client in range(3):
            if client + 1 == rank:
                continue
            for ask in (part.client_data, part.client_rng, part.secret_rng):
                with pytest.raises(ForeignShardError, match=f"stays on rank {client + 1}"):
                    ask(client)
        for name in ("problem", "_problem", "reference_run"):
            with pytest.raises(ForeignShardError, match="models the clients send"):
                getattr(part, name)


def _looks(rank, world_size, bench):
    """What a rank received: its class, whether it has a seed, and whether the whole
    problem is refused to it."""
    try:
        bench.problem()
        refused = False
    except ForeignShardError:
        refused = True
    return type(bench).__name__, hasattr(bench, "seed"), refused


def test_launch_cuts_a_federated_bench_and_needs_its_world_size():
    bench = FederatedBench(client_sizes=(4, 6))
    assert launch(_looks, 3, bench, timeout=60) == [("FederatedPart", False, True)] * 3
    with pytest.raises(ValueError, match="world_size=3, got 2"):
        launch(_looks, 2, bench)


def _looking_server(rank, world_size, bench):
    """The reference server, after noting what it received."""
    return _looks(rank, world_size, bench), async_server(rank, world_size, bench)


def test_run_all_ships_the_server_a_part_without_data():
    bench = AsyncBench(num_workers=2, num_updates=5)
    found = async_ranks.run(_looking_server, bench)
    assert found.returned[0] == ("AsyncPart", False, True)
    assert np.array_equal(np.asarray(found.returned[1][0]), bench.reference().weights)
