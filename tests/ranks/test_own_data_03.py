"""A rank of section 03 holds only its own data (issue 53, item 1), proved for every bench.

Section 03's checks build each rank's part (a Megatron shard, a pipeline stage, an expert
shard, a ring-attention shard) in the launching process and ship each rank its own only
(:class:`distopt.ranks.model_parallel_checks.OwnParts`). For every bench of :data:`BENCHES`,
run through the real check's launcher, a probe in the place of the rank code

* walks everything reachable from what the rank was handed (fields, lists, modules'
  parameters and buffers) and
* calls every method of every course object among it, underscore ones included, with every
  argument it may take (none, each rank, its own tensors, the object itself),

and hands back every tensor it found or was given. The test then compares them with what only
other ranks, or only the test, hold (other ranks' blocks, rows, layers and experts, the
single-process reference): no value of those may appear. A method that raises refuses; a
method that answers must answer from the rank's own data. A new method, or a new field, of a
shipped bench that answers for another rank fails here (:func:`test_a_leaky_bench_is_caught`
shows that the probe catches one).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from distopt import launch
from distopt.problems.megatron_mlp import MegatronMLP, MLPShard
from distopt.problems.moe_layer import MoELayer
from distopt.problems.pipeline_stack import PipelineStack
from distopt.problems.sequence_chunks import SequenceChunks
from distopt.ranks import context_checks, expert_checks, model_parallel_checks


def _tensors(value: Any, path: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor reachable from ``value`` (numpy arrays as tensors), with its path."""
    if id(value) in seen or value is None or isinstance(value, str | bytes | int | float | bool):
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield path, value.detach()
    elif isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
        yield path, torch.from_numpy(np.array(value))
    elif isinstance(value, torch.nn.Module):
        for name, tensor in [*value.named_parameters(), *value.named_buffers()]:
            yield from _tensors(tensor, f"{path}.{name}", seen)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{path}[{i}]", seen)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{path}[{key!r}]", seen)
    elif hasattr(value, "__dict__") or hasattr(type(value), "__slots__"):
        names = set(getattr(value, "__dict__", {})) | set(getattr(type(value), "__slots__", ()))
        for name in sorted(names):
            if hasattr(value, name):
                yield from _tensors(getattr(value, name), f"{path}.{name}", seen)


_LIBRARIES = {"builtins", "torch", "numpy", "collections"}  # their classes hold no course data


def _course_objects(value: Any, seen: set[int]) -> Iterator[Any]:
    """The objects of the course's own classes reachable from ``value`` (the benches)."""
    if id(value) in seen or isinstance(value, str | bytes | int | float | bool | torch.Tensor):
        return
    seen.add(id(value))
    if type(value).__module__.split(".")[0] not in _LIBRARIES:
        yield value
    if isinstance(value, list | tuple):
        for item in value:
            yield from _course_objects(item, seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _course_objects(getattr(value, field.name), seen)


def _methods(obj: Any) -> list[tuple[str, Callable]]:
    """Every method of ``obj``'s class and its course bases, underscore ones included (what
    ``object`` itself defines left out: it holds no data)."""
    found = []
    for name in sorted(dir(type(obj))):
        owner = next((c for c in type(obj).__mro__ if name in vars(c)), object)
        if owner is object:
            continue
        attribute = getattr(obj, name, None)
        if callable(attribute) and not isinstance(attribute, type):
            found.append((name, attribute))
    return found


def probe(rank: int, world_size: int, part: Any) -> dict[str, Any]:
    """In the place of rank code: what the rank can reach, and every method's answers."""
    found = dict(_tensors(part, "part", set()))
    called, refused = [], []
    own = [t for t in found.values() if t.is_floating_point()][:2]
    for obj in _course_objects(part, set()):
        for name, method in _methods(obj):
            arguments = [(), *[(r,) for r in range(world_size)], (obj,), tuple(own[:1]), tuple(own)]
            for args in arguments:
                try:
                    with np.errstate(all="ignore"):
                        answer = method(*args)
                except Exception as error:  # noqa: BLE001  (refusals and wrong arguments)
                    refused.append(
                        f"{type(obj).__name__}.{name}{args!r:.40}: {type(error).__name__}"
                    )
                    continue
                called.append(f"{type(obj).__name__}.{name}")
                where = f"{type(obj).__name__}.{name}{tuple(type(a).__name__ for a in args)}"
                found.update(_tensors(answer, where, set()))
    return {"tensors": found, "called": sorted(set(called)), "refused": refused, "pid": os.getpid()}


def _values(tensors: list[torch.Tensor]) -> set[float]:
    values: set[float] = set()
    for tensor in tensors:
        if tensor.is_floating_point():
            values.update(tensor.detach().to(torch.float64).flatten().tolist())
    return values


def _foreign(own: list[torch.Tensor], others: list[torch.Tensor]) -> set[float]:
    """Values only others hold: not the rank's own, and not a small integer (a count)."""
    return {v for v in _values(others) - _values(own) if not float(v).is_integer()}


def _megatron(problem: MegatronMLP, rank: int) -> tuple[list, list]:
    own = list(dict(_tensors(problem.shard(rank), "", set())).values())
    reference = problem.reference()
    others = [
        getattr(problem.shard(r), n)
        for r in range(problem.world_size)
        if r != rank
        for n in ("w_in", "b_in", "w_out")
    ]
    others += [reference.output, reference.input_grad, *reference.grads.values()]
    others += [t for r in range(problem.world_size) if r != rank for t in problem.partials(r)]
    return own, others


def _pipeline(problem: PipelineStack, rank: int) -> tuple[list, list]:
    stage = problem.stage(rank)
    own = list(dict(_tensors(stage, "", set())).values())
    others = [
        t
        for r in range(problem.stages)
        if r != rank
        for t in dict(_tensors(problem.stage(r), "", set())).values()
    ]
    activations, gradients = problem.boundaries()
    others += [g for grads in problem.reference_grads() for g in grads]
    others += [t for s in range(problem.stages) for t in activations[s] + gradients[s]]
    return own, others


def _moe(problem: MoELayer, rank: int) -> tuple[list, list]:
    own = list(dict(_tensors(problem.shard(rank), "", set())).values())
    others = [
        t
        for r in range(problem.world_size)
        if r != rank
        for t in dict(_tensors(problem.shard(r), "", set())).values()
    ]
    reference = problem.reference()
    others += [
        reference.output,
        reference.input_grad,
        reference.expert_outputs,
        reference.expert_input_grads,
        *[g for e in reference.expert_grads for g in e],
    ]
    return own, others


def _ring(problem: SequenceChunks, rank: int) -> tuple[list, list]:
    own = list(dict(_tensors(problem.shard(rank), "", set())).values())
    others = [torch.from_numpy(a) for a in problem.qkv()]
    others.append(torch.from_numpy(problem.reference()))
    return own, others


# (name, problem, the check's launcher, what rank r holds and what only others hold)
BENCHES = [
    (
        "megatron_mlp_rank",
        MegatronMLP(hidden=4, tokens=3, world_size=2),
        model_parallel_checks.run_megatron_mlp,
        _megatron,
    ),
    (
        "gpipe_stage",
        PipelineStack(stages=3, micro_batches=2, width=3),
        model_parallel_checks.run_pipeline,
        _pipeline,
    ),
    (
        "expert_parallel_moe",
        MoELayer(world_size=2, tokens_per_rank=3, hidden=3, inner=4),
        expert_checks.run_expert_parallel,
        _moe,
    ),
    (
        "ring_attention_rank",
        SequenceChunks(world_size=2, seq_len=8, dim=3, causal=True, layout=((0, 3), (1, 2))),
        context_checks.run_ring_attention,
        _ring,
    ),
]


@pytest.mark.parametrize(("name", "problem", "run", "split"), BENCHES, ids=[b[0] for b in BENCHES])
def test_a_rank_can_reach_and_compute_only_its_own_data(name, problem, run, split):
    results = run(probe, problem, guard=False, timeout=60)
    for rank, result in enumerate(results):
        found = result[0]
        own, others = split(problem, rank)
        foreign = _foreign(own, others)
        assert foreign, f"{name}: no data held by other ranks only? the probe proves nothing"
        leaks = {
            path: int(sum(v in foreign for v in t.to(torch.float64).flatten().tolist()))
            for path, t in found["tensors"].items()
            if t.is_floating_point()
        }
        leaks = {path: n for path, n in leaks.items() if n}
        assert not leaks, (
            f"{name}, rank {rank}: values that only other ranks or the test hold were reachable "
            f"or computed in the rank: {leaks}"
        )
        assert found["tensors"], f"{name}, rank {rank}: the probe found nothing it was given"
        assert found["called"], f"{name}, rank {rank}: no method of the shipped bench answered"
        assert found["pid"] != os.getpid()  # it ran in a rank


def test_the_parts_leave_no_file_behind_once_every_rank_has_taken_its_own():
    with model_parallel_checks.OwnParts(["zero", "one", "two"]) as parts:
        listed = launch(_take_and_list, 3, parts, timeout=60)
        assert listed == [("zero", []), ("one", []), ("two", [])]
        assert "zero" not in repr(parts.__getstate__())  # only paths travel
    assert not os.path.exists(parts.folder)


def _take_and_list(rank: int, world_size: int, parts: Any) -> tuple[Any, list[str]]:
    part = parts.take(rank)  # then a barrier: every rank has deleted its file
    return part, sorted(os.listdir(parts.folder))


@dataclasses.dataclass(frozen=True)
class _LeakyShard(MLPShard):
    """A shard that keeps another rank's block and has a private method that answers it."""

    _neighbour: torch.Tensor | None = None

    def _peek(self, rank: int) -> torch.Tensor:
        return self._neighbour


def test_a_leaky_bench_is_caught():
    """The probe's own check: a shard holding rank 1's w_in behind a private method leaks."""
    problem = MegatronMLP(hidden=4, tokens=3, world_size=2)
    fields = {f.name: getattr(problem.shard(0), f.name) for f in dataclasses.fields(MLPShard)}
    leaky = _LeakyShard(**fields, _neighbour=problem.shard(1).w_in)
    found = probe(0, 2, leaky)
    assert "_LeakyShard._peek" in found["called"]
    own, others = _megatron(problem, 0)
    foreign = _foreign(own, others)
    leaks = [
        path
        for path, t in found["tensors"].items()
        if t.is_floating_point() and any(v in foreign for v in t.flatten().tolist())
    ]
    assert "part._neighbour" in leaks
    assert any(path.startswith("_LeakyShard._peek") for path in leaks)


def test_every_method_of_every_shipped_bench_is_tried():
    """The benches' classes as shipped, and the methods the probe calls on each."""
    problem = PipelineStack(stages=2)
    found = probe(1, 2, problem.stage(1))
    assert "Stage.loss_sum" in found["called"] and "Stage.__repr__" in found["called"]
    assert all(
        name in {n for n, _ in _methods(problem.stage(0))}
        for name in ("loss_sum", "__eq__", "__repr__")
    )
    assert inspect.isfunction(type(problem.stage(0)).loss_sum)
