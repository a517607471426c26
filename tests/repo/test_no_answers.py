"""No function of the released package computes a graded answer, in every section (issue 53,
item 9); section 03 has its own test with cases by hand and its rank exercises run
(test_no_answers_03.py).

The cases are the tests' own. Each section's tests run here on the reference answers (the
set-up cells, answers and graded tests of the solution notebook, in one namespace), each
answer wrapped so that its first calls are kept: the arguments, the value, and the arguments
again after the call (for answers that update a tensor in place). Then every function of the
package students get (``shared/distopt``, private functions included, the machinery that
starts ranks and the explorers left out) that takes those arguments (as the tests pass them,
or all by the answer's parameter names) is called on them. A function that gives the answer's
value and leaves the arguments as the answer does, in every kept case, computes the answer.

Rank exercises (``fn(rank, world_size, ...)``) are not probed here: their calls happen inside
ranks. What each gets is its own part (tests/ranks/test_own_data*.py).

Not every answer is gone. The cost models, simulators and the training project's tools, which
the notebooks use as tools and their tests as references, still compute these formula
exercises' answers (:data:`STILL_IN_PACKAGE`); the graded cells refuse a call of each
(``own_work``), and the list is pinned so that a new one fails here and taking one out of the
package makes it shrink.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import math
import pkgutil
from collections.abc import Callable
from typing import Any

import nbformat
import numpy as np
import pytest
import torch

import distopt
from autograder import course
from tests.grader import mutants
from tests.helpers import NoAnswer, call_within, kept_process_state

SECTIONS = [s for s, _ in mutants.sections() if s != "03_model_parallel"]
# Not probed: they start ranks or processes, write files, draw or time this machine (none
# computes a formula).
_LEFT_OUT = ("distopt.engine", "distopt.explore", "distopt.project.train",
             "distopt.project.checkpoint", "distopt.machine")  # fmt: skip
_CASES_KEPT = 8  # calls kept per answer: the visible tests' first, then the hidden ones'
_CALL_LIMIT_S = 2  # a package function that takes longer on a case is not the answer

# answer -> the package functions that compute it (the course's tools, refused in the tests)
STILL_IN_PACKAGE = {
    "01_data_parallel": {
        "fit_alpha_beta": {"distopt.costs.comm.fit_alpha_beta"},
        "exposed_communication_s": {"distopt.costs.buckets.exposed_allreduce_s"},
        "gradient_noise_scale": {"distopt.costs.critical_batch.simple_noise_scale"},
    },
    "02_memory_sharding": {
        "state_bytes_per_gpu": {"distopt.costs.memory.training_state_bytes"},
        "bytes_sent_per_step": {"distopt.costs.comm.sharded_step_bytes_sent"},
        "layer_activation_bytes": {"distopt.costs.memory.activation_bytes_per_layer"},
        "peak_bytes_per_gpu": {"distopt.costs.memory.peak_training_bytes"},
    },
    "04_large_batch": {
        "linear_scaled_lr": {"distopt.optim.schedules.linear_scaled_lr"},
        "warmup_cosine_lr": {"distopt.optim.schedules.warmup_cosine_lr"},
    },
    "05_async_decentralized": {
        "metropolis_hastings": {"distopt.sim.gossip.metropolis_weights"},
        "second_largest_eigenvalue_magnitude": {"distopt.sim.gossip.mixing_rate"},
    },
    "06_federated": {
        "fedavg": {"distopt.sim.federated.fedavg"},
        "centralized_sgd": {"distopt.sim.federated.centralized_sgd"},
        "client_drift": {"distopt.sim.federated.client_drift"},
        "private_mean": {"distopt.sim.federated.dp_mean"},
    },
    "07_training_project": {
        "decay_groups": {"distopt.optim.recipe.adamw_param_groups"},
        "promote": {"distopt.project.hpsearch.promote"},
        "diagnose": {"distopt.project.diagnose.diagnose"},
    },
}


@pytest.fixture(autouse=True)
def _process_state_kept():
    """The probe calls package functions with foreign arguments: what one changes in this
    process (a rank's float64 default dtype, its mark as a rank) must not reach the tests
    after it."""
    yield from kept_process_state()


@functools.cache
def _package_functions() -> dict[str, Callable]:
    """Every function defined in the released package's modules, by qualified name."""
    found = {}
    for info in pkgutil.walk_packages(distopt.__path__, prefix="distopt."):
        if info.name.startswith(_LEFT_OUT):
            continue
        module = importlib.import_module(info.name)
        for attribute, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == info.name:
                found[f"{info.name}.{attribute}"] = value
    return found


def _snapshot(value: Any) -> Any:
    """A deep copy; where torch cannot copy a tensor inside a graph, its values, detached."""
    try:
        return copy.deepcopy(value)
    except RuntimeError:
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        if isinstance(value, tuple | list):
            return type(value)(_snapshot(v) for v in value)
        if isinstance(value, dict):
            return {k: _snapshot(v) for k, v in value.items()}
        return value


def _is_rank_code(fn: Callable) -> bool:
    names = list(inspect.signature(fn).parameters)
    return names[:2] == ["rank", "world_size"]


def _defined(source: str) -> list[str]:
    return [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]


@functools.cache
def _recorded(section: str) -> tuple[dict[str, Callable], dict[str, list]]:
    """The section's answers (name -> function) and their kept calls: (args, kwargs, (value,
    args after, kwargs after)) each. The tests of rank exercises are not run."""
    notebook = course.section_notebooks(section)[0]
    path = course.SOLUTIONS / section / f"{notebook}.ipynb"
    nb = mutants.tests_only(nbformat.read(path, as_version=4))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    answers: dict[str, Callable] = {}
    calls: dict[str, list] = {}
    rank_tests = set()
    owner = {t: a for a, ts in mutants.tests_of_answers(section, notebook).items() for t in ts}

    def keeping(name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def kept(*args: Any, **kwargs: Any) -> Any:
            before = _snapshot((args, kwargs))
            value = fn(*args, **kwargs)
            if len(calls.setdefault(name, [])) < _CASES_KEPT:
                calls[name].append((*before, _snapshot((value, args, kwargs))))
            return value

        return kept

    for cell in nb.cells:
        if course.is_test(cell) and owner.get(mutants._grade_id(cell)) in rank_tests:
            continue
        source = "\n".join(
            line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))
        )
        exec(compile(source, f"<{section} cell>", "exec"), namespace)  # noqa: S102
        if mutants._is_answer(cell):
            for name in _defined(cell.source):
                if _is_rank_code(namespace[name]):
                    rank_tests.add(mutants._grade_id(cell))
                    continue
                answers[name] = namespace[name]
                namespace[name] = keeping(name, namespace[name])
    return answers, calls


def _call(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """(value, args after, kwargs after) of ``fn`` on copies; NoAnswer on an error or timeout."""
    args, kwargs = _snapshot((args, kwargs))
    value = call_within(_CALL_LIMIT_S, fn, *args, **kwargs)
    return NoAnswer if value is NoAnswer else (value, args, kwargs)


def _close(got: Any, want: Any) -> bool:
    try:
        if isinstance(want, torch.Tensor):
            return (isinstance(got, torch.Tensor) and got.shape == want.shape
                    and bool(torch.allclose(got.double(), want.double(), rtol=1e-9, atol=1e-12,
                                            equal_nan=True)))  # fmt: skip
        got = np.asarray(got, dtype=float)
        return got.shape == want.shape and np.allclose(got, want, 1e-9, 1e-12, equal_nan=True)
    except (TypeError, ValueError, RuntimeError):
        return False


def _equal(got: Any, want: Any) -> bool:
    """The value an answer returned, compared: numbers within 1e-9, containers item by item."""
    if isinstance(want, tuple | list):
        return (isinstance(got, tuple | list) and len(got) == len(want)
                and all(_equal(g, w) for g, w in zip(got, want, strict=True)))  # fmt: skip
    if isinstance(want, dict):
        return (isinstance(got, dict) and got.keys() == want.keys()
                and all(_equal(got[k], want[k]) for k in want))  # fmt: skip
    if isinstance(want, torch.Tensor) or (isinstance(want, np.ndarray) and want.dtype.kind in "fc"):
        return _close(got, want)
    if isinstance(want, float | np.floating) and not isinstance(got, tuple | list | dict):
        try:
            return math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-12) or (
                math.isnan(float(got)) and math.isnan(float(want))
            )
        except (TypeError, ValueError):
            return False
    try:
        return bool(got == want)
    except Exception:  # noqa: BLE001  (an array compared with a scalar, ...)
        return False


def _same_state(got: Any, want: Any) -> bool:
    """The tensors and float arrays among the arguments, after the call (in-place answers)."""
    if isinstance(want, torch.Tensor) or (isinstance(want, np.ndarray) and want.dtype.kind in "fc"):
        return _close(got, want)
    if isinstance(want, tuple | list):
        return (isinstance(got, tuple | list) and len(got) == len(want)
                and all(_same_state(g, w) for g, w in zip(got, want, strict=True)))  # fmt: skip
    if isinstance(want, dict):
        return isinstance(got, dict) and all(_same_state(got.get(k), want[k]) for k in want)
    return True


def _binds(fn: Callable, args: tuple, kwargs: dict) -> bool:
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return True


def _does(fn: Callable, args: tuple, kwargs: dict, want: tuple) -> bool:
    got = _call(fn, args, kwargs)
    return got is not NoAnswer and _equal(got[0], want[0]) and _same_state(got[1:], want[1:])


def _computing(answer: Callable, cases: list, functions: dict[str, Callable]) -> set[str]:
    """The names of ``functions`` that do what ``answer`` did in every kept case."""
    signature = inspect.signature(answer)

    def by_name(args: tuple, kwargs: dict) -> dict:
        return dict(signature.bind(*args, **kwargs).arguments)

    ways = [
        [(a, k, after) for a, k, after in cases],
        [((), by_name(a, k), (after[0], (), by_name(*after[1:]))) for a, k, after in cases],
    ]
    found = set()
    for name, fn in functions.items():
        for way in ways:
            if not all(_binds(fn, a, k) for a, k, _ in way):
                continue
            if all(_does(fn, a, k, want) for a, k, want in way):  # stops at the first miss
                found.add(name)
                break
    return found


@pytest.mark.parametrize("section", SECTIONS)
def test_every_formula_answer_is_probed_on_its_tests_calls(section):
    answers, calls = _recorded(section)
    assert answers, f"{section}: no formula answer found"
    missing = sorted(set(answers) - set(calls))
    assert not missing, f"{section}: answers its tests never called: {missing}"


@pytest.mark.parametrize("section", SECTIONS)
def test_no_package_function_computes_a_formula_answer(section):
    answers, calls = _recorded(section)
    found = {}
    for name, answer in answers.items():
        computing = _computing(answer, calls[name], _package_functions())
        if computing:
            found[name] = computing
    assert found == STILL_IN_PACKAGE[section], (
        f"{section}: package functions that compute an answer: {found}; pinned: "
        f"{STILL_IN_PACKAGE[section]}"
    )


def test_the_probe_finds_an_answer_where_there_is_one():
    """A reference answer, were it a package function, would be found; its neighbours not."""
    answers, calls = _recorded("04_large_batch")
    planted = {"planted.clip_by_global_norm": answers["clip_by_global_norm"]}
    planted["planted.lars_step"] = answers["lars_step"]
    found = _computing(answers["clip_by_global_norm"], calls["clip_by_global_norm"], planted)
    assert found == {"planted.clip_by_global_norm"}
    found = _computing(answers["lars_step"], calls["lars_step"], planted)
    assert found == {"planted.lars_step"}  # in place: the updated tensors are compared


# --- the rank exercises of 01, 02, 05 and 06 ---------------------------------------------------


# Rank exercise -> its bench's class names and a check that raises unless ``fn`` is an answer.
def _rank_exercises() -> dict[str, tuple[tuple[str, ...], Callable[[Callable], None]]]:
    from distopt import launch
    from distopt.engine import record
    from distopt.problems.shards import ShardedProblem
    from distopt.ranks import (
        async_checks,
        async_ranks,
        federated_checks,
        fsdp_checks,
        fsdp_ranks,
        gossip_checks,
    )
    from distopt.ranks import data_parallel_checks as dp
    from distopt.ranks.federated_ranks import FederatedBench
    from distopt.ranks.gossip_ranks import GossipProblem

    def sgd(fn: Callable, micro_batches: int = 1) -> None:
        problem = ShardedProblem(shard_sizes=(3, 5), steps=2, micro_batches=micro_batches)
        results = dp.run_traced(fn, problem, timeout=20)
        dp.assert_weights_match(results, problem.reference_sgd(), what="one process")
        dp.assert_own_shares_sent(results, problem)

    def accumulating(fn: Callable) -> None:
        sgd(fn, micro_batches=2)

    def zero1(fn: Callable) -> None:
        problem = ShardedProblem(shard_sizes=(3, 5), steps=2)
        results = dp.run_traced(fn, problem, timeout=20)
        dp.assert_weights_match(results, problem.reference_adam(), what="one process's Adam")
        dp.assert_zero1_state(results, problem)

    def fsdp(fn: Callable) -> None:
        bench = fsdp_ranks.FsdpBench(ShardedProblem(shard_sizes=(3, 5), steps=2))
        fsdp_checks.assert_shards_match(fsdp_ranks.run_on_bench(fn, bench, timeout=20), bench)

    def gossip(fn: Callable) -> None:
        bench = GossipProblem(world_size=3, steps=2)
        gossip_checks.assert_models_match(record.run_traced(fn, bench, timeout=20), bench)

    def server(fn: Callable) -> None:
        bench = async_ranks.AsyncBench(num_workers=2, num_updates=4, lr=0.2)
        async_checks.assert_matches_simulator(async_ranks.run(fn, bench, timeout=20))

    def fedavg(fn: Callable) -> None:
        bench = FederatedBench(client_sizes=(20, 30), rounds=2)
        results = launch(record.traced(fn, payloads=True), bench.world_size, bench, timeout=20)
        federated_checks.assert_models_match(results, bench)

    data = ("ShardedProblem", "RankShard")
    return {
        "naive_data_parallel": (data, sgd),
        "accumulating_data_parallel": (data, accumulating),
        "zero1_adam": (data, zero1),
        "fsdp_sgd": (("FsdpBench",), fsdp),
        "ring_gossip_sgd": (("GossipProblem", "GossipPart"), gossip),
        "async_server": (("AsyncBench", "AsyncPart"), server),
        "fedavg_over_ranks": (("FederatedBench", "FederatedPart"), fedavg),
    }


# Rank exercise -> the package's rank code that passes its checks; the graded test refuses a
# call of it (own_work). 01's naive exercise was passed by exercise 10's run until stop 67.
STILL_PASSING = {
    "naive_data_parallel": {"distopt.ranks.timeline_ranks.layerwise_overlapped_sgd"},
}


def _takes_the_bench(fn: Callable, benches: tuple[str, ...]) -> bool:
    """``fn(rank, world_size, bench)`` with the exercise's bench (by annotation, or none)."""
    parameters = list(inspect.signature(fn).parameters.values())
    required = [p for p in parameters if p.default is p.empty and p.kind != p.VAR_POSITIONAL]
    if [p.name for p in parameters[:2]] != ["rank", "world_size"] or len(required) != 3:
        return False
    annotation = parameters[2].annotation
    return annotation is parameters[2].empty or any(b in str(annotation) for b in benches)


def test_the_rank_exercises_are_those_of_the_notebooks():
    found = set()
    for section in ("01_data_parallel", "02_memory_sharding", "05_async_decentralized",
                    "06_federated"):  # fmt: skip
        notebook = course.section_notebooks(section)[0]
        for source in mutants.reference_answers(section, notebook).values():
            tree = ast.parse(source)
            found |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                      and [a.arg for a in n.args.args[:2]] == ["rank", "world_size"]}  # fmt: skip
    assert found - {"bucketed_data_parallel"} == set(_rank_exercises())  # bucketed: 4 arguments


@pytest.mark.parametrize("exercise", sorted(_rank_exercises()))
def test_no_package_function_passes_a_rank_exercise(exercise):
    benches, check = _rank_exercises()[exercise]
    candidates = {n: f for n, f in _package_functions().items() if _takes_the_bench(f, benches)}
    passing = set()
    for name, fn in candidates.items():
        try:
            check(fn)
        except Exception:  # noqa: BLE001  (a rank raised, or the check failed: not an answer)
            continue
        passing.add(name)
    assert passing == STILL_PASSING.get(exercise, set()), (
        f"{exercise}: package rank code that passes its checks: {sorted(passing)}; "
        f"candidates tried: {sorted(candidates)}"
    )


def _reference_rank_answers() -> dict[str, Callable]:
    """The solution notebooks' answers to the rank exercises, on their set-up's imports."""
    found: dict[str, Callable] = {}
    for section in ("01_data_parallel", "02_memory_sharding", "05_async_decentralized",
                    "06_federated"):  # fmt: skip
        notebook = course.section_notebooks(section)[0]
        nb = nbformat.read(course.SOLUTIONS / section / f"{notebook}.ipynb", as_version=4)
        setup = next(c.source for c in nb.cells if c.cell_type == "code")
        namespace: dict[str, Any] = {}
        lines = [line for line in setup.splitlines() if not line.lstrip().startswith(("%", "!"))]
        exec("\n".join(lines), namespace)  # noqa: S102
        for source in mutants.reference_answers(section, notebook).values():
            exec(source, namespace)  # noqa: S102
        found.update({name: namespace[name] for name in _rank_exercises() if name in namespace})
    return found


def test_the_rank_checks_pass_the_reference_answers():
    """The checks above are not failing everything: each passes its exercise's answer."""
    answers = _reference_rank_answers()
    assert set(answers) == set(_rank_exercises())
    for exercise, (_, check) in _rank_exercises().items():
        check(answers[exercise])
