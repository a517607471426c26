"""A rank holds only its own data: every bench shipped to a rank, tried method by method.

Each bench of :data:`BENCHES` is built here (the test's process), shipped to real ranks as an
exercise's rank code gets it, and there every attribute of it, underscore ones included, and
of every package object reachable from it (``bench.problem``, a copy rebuilt from its pickle),
is read; every callable is called with each argument the probe can make for it (every rank's
number for a ``rank``, ``None`` too; every step and layer; the rank's own batch and model).
Every value that comes back is flattened into its numbers and compared, back here, with what
that rank must never hold: another rank's examples or starting weights, the single-process
references (weights, gradient shares, Adam's state). A call either refuses
(``ForeignShardError``) or returns none of those numbers.

A new method that answers for another rank fails here without being named: the probe finds it
by ``dir``. One whose parameters the probe cannot fill fails too, until its parameter is
added to :data:`ARGUMENTS` (or the bench's own ``arguments``). To cover another section's
bench, add a :class:`Registered` entry: how to build it, how it is shipped (the launch its
exercise uses) and what each rank must not hold.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from distopt import launch
from distopt.problems.own_data import ForeignShardError
from distopt.problems.shards import RankShard, ShardedProblem, flat
from distopt.ranks import data_parallel_checks
from distopt.ranks.fsdp_ranks import FsdpBench, run_on_bench

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
# Numbers too common to tell data apart by (padding, ones, labels are not compared).
_COMMON = {0.0, 1.0, -1.0}


def _own_args(bench: Any, rank: int) -> dict[str, list]:
    """What the probe passes for each parameter name, in rank ``rank``: everything a rank
    might ask for, its own and other ranks' numbers alike."""
    problem = bench if isinstance(bench, ShardedProblem | RankShard) else bench.problem
    n = problem.world_size
    try:
        model = problem.new_model(rank)
    except ForeignShardError:  # a part that ships no whole model (FSDP's): one of any weights
        from distopt.problems.mlp import build_mlp

        model = build_mlp(problem.layer_sizes, seed=12345).double()
    x, y = problem.batch(0, rank)
    found = {
        "rank": [*range(n), None],
        "step": sorted({0, problem.steps - 1}),
        "index": list(range(problem.micro_batches)),
        "k": list(range(problem.micro_batches)),
        "model": [model],
        "model_or_weights": [model],
        "x": [x],
        "y": [y],
        "optimizer_name": ["sgd", "adam"],
        "what": ["shard"],
        "instead": [""],
        "other": [bench],
        "value": [bench],
    }
    if isinstance(bench, FsdpBench):
        layers = list(range(bench.num_layers))
        found["layer"] = layers
        found["vector"] = [torch.zeros(bench.layer_numel(0), dtype=torch.float64)]
        found["tensor"] = [torch.zeros(3, dtype=torch.float64)]
    return found


def _numbers(value: Any, depth: int = 0) -> list[np.ndarray]:
    """Every number a value carries: tensors, arrays, a module's parameters, containers."""
    if depth > 6:
        return []
    if isinstance(value, torch.Tensor):
        return [value.detach().to(torch.float64).reshape(-1).numpy().copy()]
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return [value.astype(np.float64).reshape(-1)]
    if isinstance(value, nn.Module):
        return [_numbers(t, depth + 1)[0] for t in value.state_dict().values()]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _numbers(v, depth + 1)]
    if isinstance(value, list | tuple | set | frozenset):
        return [a for v in value for a in _numbers(v, depth + 1)]
    return []


def _probe_object(obj: Any, path: str, rank: int, bench: Any, out: list, seen: set) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    args = _own_args(bench, rank)
    for name in sorted(dir(obj)):
        if name in _NOT_CALLED:
            continue
        where = f"{path}.{name}"
        try:
            value = getattr(obj, name)
        except ForeignShardError:
            out.append((where, "", "refused", None))
            continue
        if type(value).__module__.startswith("distopt.") and not callable(value):
            _probe_object(value, where, rank, bench, out, seen)  # a package object inside
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


def _short(value: Any) -> str:
    plain = value is None or isinstance(value, int | str | float)
    return repr(value) if plain else type(value).__name__


def _join(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0)


def _probe(rank: int, world_size: int, bench: Any) -> list:
    """In a rank: every attribute of the bench, of what it holds, and of a copy rebuilt from
    its pickle (as rank code could rebuild it): (attribute, arguments, outcome, numbers)."""
    found: list = []
    seen: set = set()
    _probe_object(bench, "bench", rank, bench, found, seen)
    _probe_object(pickle.loads(pickle.dumps(bench)), "rebuilt", rank, bench, found, seen)
    if dataclasses.is_dataclass(bench):
        _probe_object(dataclasses.replace(bench), "replaced", rank, bench, found, seen)
    return found


def _problem_foreign(problem: ShardedProblem, rank: int) -> list[torch.Tensor]:
    """What rank ``rank`` of a ShardedProblem must never hold."""
    foreign = [p.detach() for r in range(problem.world_size) if r != rank
               for p in problem.new_model(r).parameters()]  # fmt: skip
    for step in range(problem.steps):
        foreign += [problem.batch(step, r)[0] for r in range(problem.world_size) if r != rank]
    foreign += problem.reference_sgd() + problem.reference_adam()
    foreign += [problem.reference_shares(), problem.reference_adam_shares()]
    foreign += [v for state in problem.reference_adam_states() for v in state.values()]
    return foreign


def _problem_own(problem: ShardedProblem, rank: int) -> list[torch.Tensor]:
    own = [p.detach() for p in problem.new_model(rank).parameters()]
    return own + [problem.batch(step, rank)[0] for step in range(problem.steps)]


def _fsdp_foreign(bench: FsdpBench, rank: int) -> list[torch.Tensor]:
    return _problem_foreign(bench.problem, rank)


def _fsdp_own(bench: FsdpBench, rank: int) -> list[torch.Tensor]:
    return _problem_own(bench.problem, rank) + [
        bench.start_shard(rank, i) for i in range(bench.num_layers)
    ]


def _probe_built(rank: int, world_size: int, made: tuple) -> list:
    cls, fields = made
    return _probe(rank, world_size, cls(**fields))


def _launch_built(bench: Any) -> list:
    """Whole, built inside each rank from its fields, as rank code could build one with a
    seed it guessed: a bench that ships by parts never reaches a rank whole (``launch``
    cuts the argument and withholds any other copy); its own guards are tried there."""
    fields = {f.name: getattr(bench, f.name) for f in dataclasses.fields(bench)}
    return launch(_probe_built, bench.world_size, (type(bench), fields))


def _launch_own_part(problem: ShardedProblem) -> list:
    """As the checks of 01 and 02 ship it (and any launch): each rank its own part."""
    return [value for value, _ in data_parallel_checks.run_traced(_probe, problem)]


def _launch_on_bench(bench: FsdpBench) -> list:
    return [run.value for run in run_on_bench(_probe, bench)]


@dataclasses.dataclass(frozen=True)
class Registered:
    """A bench shipped to ranks: how it is built, shipped, and what rank r must not hold."""

    make: Callable[[], Any]
    ship: Callable[[Any], list]  # runs _probe on its ranks as the exercise's launch does
    foreign: Callable[[Any, int], list[torch.Tensor]]
    own: Callable[[Any, int], list[torch.Tensor]]


# Every bench shipped to the ranks of a graded exercise. Sections 01 and 02: naive, bucketed
# and accumulating data parallelism and ZeRO-1 get a ShardedProblem; fsdp_sgd an FsdpBench.
BENCHES: dict[str, Registered] = {
    "ShardedProblem (whole, built by the rank itself: its own guards)": Registered(
        make=lambda: ShardedProblem(shard_sizes=(3, 5, 4), steps=2, micro_batches=2),
        ship=_launch_built,
        foreign=_problem_foreign,
        own=_problem_own,
    ),
    "RankShard (01 data parallelism, 02 zero1_adam, as their checks ship it)": Registered(
        make=lambda: ShardedProblem(shard_sizes=(3, 5, 4), steps=2, micro_batches=2),
        ship=_launch_own_part,
        foreign=_problem_foreign,
        own=_problem_own,
    ),
    "FsdpBench (02 fsdp_sgd)": Registered(
        make=lambda: FsdpBench(ShardedProblem(shard_sizes=(3, 5), layer_sizes=(4, 5, 3), steps=2)),
        ship=_launch_on_bench,
        foreign=_fsdp_foreign,
        own=_fsdp_own,
    ),
}


def _values(tensors: list[torch.Tensor]) -> set[float]:
    found: set[float] = set()
    for t in tensors:
        found.update(flat([t]).tolist())
    return found - _COMMON


@pytest.mark.parametrize("name", list(BENCHES))
def test_no_method_of_a_shipped_bench_answers_for_another_rank(name):
    entry = BENCHES[name]
    bench = entry.make()
    per_rank = entry.ship(bench)
    for rank, found in enumerate(per_rank):
        foreign = _values(entry.foreign(bench, rank)) - _values(entry.own(bench, rank))
        assert foreign, "the foreign numbers of a bench cannot be empty"
        leaks, unfilled = [], []
        for where, shown, outcome, numbers in found:
            if outcome.startswith("no argument"):
                unfilled.append(f"{where}: {outcome}")
            elif numbers is not None and len(numbers):
                hits = foreign.intersection(numbers.tolist())
                if hits:
                    leaks.append(f"{where}({shown}) -> {len(hits)} numbers of other ranks' data "
                                 "or of the references")  # fmt: skip
        assert not unfilled, (
            f"{name}, rank {rank}: the probe cannot call {unfilled}; add the parameter to "
            "_own_args so that the method is tried"
        )
        assert not leaks, f"{name}, rank {rank}: answered for another rank: {leaks}"


@pytest.mark.parametrize("name", list(BENCHES))
def test_the_probe_tries_every_method_and_sees_refusals(name):
    """The probe is not empty-handed: it called the data methods, some were refused (the
    whole batch, other ranks' shards), others answered the rank its own data."""
    entry = BENCHES[name]
    bench = entry.make()
    found = entry.ship(bench)[1]
    outcomes = {(where, outcome) for where, _, outcome, _ in found}
    names = {where.rsplit(".", 1)[-1] for where, _ in outcomes}
    if name.startswith("ShardedProblem"):  # the whole bench, shipped as demos do: it refuses
        for method in ("_rows", "_global_batch", "_run", "_bare_model", "reference_sgd"):
            assert method in names, f"{method} was not tried"
        assert ("bench._run", "refused") in outcomes
        assert ("bench._global_batch", "refused") in outcomes
        problem_path = "bench"
    else:  # a rank's part: no whole batch, no references, no seed even to refuse
        assert not names & {"seed", "reference_sgd", "_run", "_global_batch"}, names
        problem_path = "bench" if name.startswith("RankShard") else "bench.problem"
        assert (f"{problem_path}.new_model", "refused") in outcomes  # rank 0's start, on rank 1
    assert (f"{problem_path}.batch", "answered") in outcomes  # its own shard
    assert (f"{problem_path}.batch", "refused") in outcomes  # the others'
    if name.startswith("FsdpBench"):
        assert ("bench.start_shard", "answered") in outcomes
        assert ("bench.start_shard", "refused") in outcomes


def test_a_new_method_that_answers_for_another_rank_fails_the_probe():
    """The test is not vacuous: a subclass with one unguarded private method is caught."""

    @dataclasses.dataclass(frozen=True)
    class Leaky(ShardedProblem):
        def _unguarded_whole_batch(self, step: int) -> tuple:
            import numpy as np_

            rng = np_.random.default_rng([self.seed, step])
            return torch.from_numpy(rng.standard_normal((self.global_batch, self.layer_sizes[0])))

    problem = Leaky(shard_sizes=(3, 4), steps=1)
    found = _probe_in_process(problem, rank=0)
    foreign = _values(_problem_foreign(problem, 0)) - _values(_problem_own(problem, 0))
    leaked = [where for where, _, _, numbers in found
              if numbers is not None and foreign.intersection(numbers.tolist())]  # fmt: skip
    assert "bench._unguarded_whole_batch" in leaked


def _probe_in_process(problem: ShardedProblem, rank: int) -> list:
    """The probe run in this process as if it were rank ``rank`` (for the self-test above:
    a subclass defined in a test function does not travel to a rank by name)."""
    from unittest import mock

    with mock.patch("distopt.problems.own_data.current_rank", lambda home_pid=None: rank):
        found: list = []
        _probe_object(problem, "bench", rank, problem, found, set())
    return found
