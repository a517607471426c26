"""No function of the released package computes a graded answer of section 03 (issue 53, item 9).

Every graded exercise of ``03_model_parallel`` is listed (:data:`CASES`, checked against the
notebook's answer cells), with a few of its tests' cases. The reference answer (the solution
notebook's answer cell, run here) gives what each case must return; then every function of
the package students get (``shared/distopt``: every module of ``distopt.costs``,
``distopt.sim``, ``distopt.ranks`` and ``distopt.problems``, private functions included) whose
signature takes the case's arguments (as the tests pass them, or all by the reference's
parameter names) is called on them. A function that returns the
reference's answer in every case computes the exercise's answer.

For the rank exercises the function must take ``(rank, world_size, part)``, the part being
the bench's shard or stage; it runs on real ranks through the exercise's own check, and
passing that check is computing the answer.

Not every answer is gone: the course's simulator and cost model, which the notebooks use as
tools and their tests as references, still compute eight of the formula exercises'
(:data:`STILL_IN_PACKAGE`). The test pins that list, so that a new one fails, and so that
taking one out of the package makes the list shrink; the four rank exercises and the
tensor-parallel degree, which issue 53 names, have none.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import pkgutil
from collections.abc import Callable
from typing import Any

import nbformat
import numpy as np
import pytest

import distopt
from autograder import course
from distopt.costs import planner
from distopt.problems.megatron_mlp import MegatronMLP
from distopt.problems.moe_layer import MoELayer
from distopt.problems.pipeline_stack import PipelineStack
from distopt.problems.sequence_chunks import SequenceChunks
from distopt.ranks import context_checks, expert_checks
from distopt.ranks import model_parallel_checks as mp_checks
from distopt.sim import experts
from distopt.units import GB, H100_MEMORY_BYTES, gbit_per_s
from tests.grader import mutants
from tests.helpers import NoAnswer, call_within, kept_process_state

SECTION, NOTEBOOK = "03_model_parallel", "model_parallel"
PACKAGES = ("distopt.costs", "distopt.sim", "distopt.ranks", "distopt.problems")
_CALL_LIMIT_S = 10  # a package function that takes longer on a case is not the answer

_H100 = dict(gpus_per_server=8, memory_bytes=H100_MEMORY_BYTES, intra_bandwidth=450 * GB,
             inter_bandwidth=gbit_per_s(400), flops_per_s=400e12)  # fmt: skip
_CLUSTER = planner.ClusterSpec(64, **_H100)
_MODEL_1B = planner.ModelSpec(layers=24, hidden=2048, heads=16, vocab=50304, seq_len=2048)
_ROUTED = experts.top_k_experts(experts.router_logits(64, 8, skew=2.0, seed=1), 2)
_LOGITS = experts.router_logits(64, 8, skew=2.0, seed=1)
_QKV = np.random.default_rng(3).standard_normal((3, 8, 4))
_DEGREE = dict(flops_per_s=4e14, intra_bandwidth=16 * GB, inter_bandwidth=gbit_per_s(3200),
               gpus_per_server=2, memory_bytes=40 * GB)  # fmt: skip

# grade_id -> the cases (args, kwargs) of a formula exercise, or a rank exercise's check
CASES: dict[str, Any] = {
    "best_tensor_degree": [
        ((4096, 8192, 64), dict(state_bytes=200 * GB, max_degree=64, **_H100)),
        ((512, 1536, 12), dict(state_bytes=350 * GB, max_degree=8, bytes_per_value=4, **_H100)),
        # the link between servers is the faster: a group across them wins
        ((4096, 4096, 32), dict(state_bytes=120 * GB, max_degree=32, **_DEGREE)),
    ],
    "bubble_fraction_formula": [((4, 8), {}), ((2, 3), {}), ((4, 8, 2), {})],
    "max_in_flight_formula": [(("1f1b", 4, 8, 1), {}), (("gpipe", 4, 8, 0), {})],
    "all_to_all_counts": [((_ROUTED, np.repeat(np.arange(4), 16), 8, 4), {})],
    "dropped_copies_at": [((_ROUTED, 8, 1.0), {}), ((_ROUTED, 8, 0.5), {})],
    "load_balancing_loss": [((_LOGITS, _ROUTED, 8), {})],
    "ring_attention_blocks": [((*_QKV, 2), {}), ((*_QKV, 4), {})],
    "choose_layout": [
        ((_MODEL_1B, _CLUSTER, 512, [planner.Layout(1, 1, 64, s, 4, False) for s in (3, 0)]), {})
    ],
    "servers_for_deadline": [((_MODEL_1B, _CLUSTER, 512, 26e9, 0.25), dict(max_servers=4))],
    "megatron_mlp_rank": "rank",
    "gpipe_stage": "rank",
    "expert_parallel_moe": "rank",
    "ring_attention_rank": "rank",
}

# Formula exercises whose answer the package's simulator and cost model still compute.
STILL_IN_PACKAGE = {
    "bubble_fraction_formula": {"distopt.costs.bubbles.bubble_fraction"},
    "all_to_all_counts": {"distopt.sim.experts.dispatch_counts"},
    "dropped_copies_at": {"distopt.sim.experts.dropped_copies"},
    "load_balancing_loss": {"distopt.sim.experts.load_balancing_loss"},
    "ring_attention_blocks": {"distopt.sim.sequence_parallel.ring_attention"},
}


@pytest.fixture(autouse=True)
def _process_state_kept():
    """The probe calls package functions with foreign arguments: what one changes in this
    process (a rank's float64 default dtype, its mark as a rank) must not reach the tests
    after it."""
    yield from kept_process_state()


def _package_functions() -> dict[str, Callable]:
    """Every function defined in the released package's modules, by qualified name."""
    found = {}
    for root in PACKAGES:
        package = importlib.import_module(root)
        names = [root] + [
            m.name for m in pkgutil.walk_packages(package.__path__, prefix=f"{root}.")
        ]
        for name in names:
            module = importlib.import_module(name)
            for attribute, value in vars(module).items():
                if inspect.isfunction(value) and value.__module__ == name:
                    found[f"{name}.{attribute}"] = value
    return found


def _reference_answers() -> dict[str, Callable]:
    """The solution notebook's answers, run on its set-up cell's imports."""
    nb = nbformat.read(course.SOLUTIONS / SECTION / f"{NOTEBOOK}.ipynb", as_version=4)
    setup = next(c.source for c in nb.cells if c.cell_type == "code")
    namespace: dict[str, Any] = {}
    exec("\n".join(line for line in setup.splitlines() if not line.startswith("%")), namespace)
    answers = mutants.reference_answers(SECTION, NOTEBOOK)
    for source in answers.values():
        exec(source, namespace)
    return {grade_id: namespace[grade_id] for grade_id in answers}


def _call(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)``; an exception or more than the limit: no answer (a marker)."""
    return call_within(_CALL_LIMIT_S, fn, *args, **kwargs)


def _equal(got: Any, want: Any) -> bool:
    if got is NoAnswer:
        return False
    if isinstance(want, tuple | list):
        return (
            isinstance(got, tuple | list)
            and len(got) == len(want)
            and all(_equal(g, w) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, float | np.floating) and not isinstance(got, tuple | list | dict):
        try:
            return math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    if isinstance(want, np.ndarray):
        try:
            got = np.asarray(got, dtype=float)
        except (TypeError, ValueError):
            return False
        return got.shape == want.shape and np.allclose(got, want, rtol=1e-9, atol=1e-12)
    try:
        return bool(got == want)
    except Exception:  # noqa: BLE001  (an array compared with a scalar, ...)
        return False


def _binds(fn: Callable, args: tuple, kwargs: dict) -> bool:
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return True


def test_every_graded_exercise_of_the_section_is_listed():
    nb = nbformat.read(course.SOLUTIONS / SECTION / f"{NOTEBOOK}.ipynb", as_version=4)
    graded = {mutants._grade_id(c) for c in nb.cells if mutants._is_answer(c)}
    assert graded == set(CASES)
    for grade_id, source in mutants.reference_answers(SECTION, NOTEBOOK).items():
        defined = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
        assert grade_id in defined, f"{grade_id}: its answer cell defines {sorted(defined)}"


def _by_name(reference: Callable, cases: list) -> list:
    """The cases with every argument passed by the reference answer's parameter names: a
    package function that takes them as keywords (``interleave=``) is tried that way too."""
    signature = inspect.signature(reference)
    return [((), dict(signature.bind(*args, **kwargs).arguments)) for args, kwargs in cases]


def _computing(grade_id: str, functions: dict[str, Callable]) -> set[str]:
    """The names of ``functions`` that give the reference answer's value in every case."""
    reference = _reference_answers()[grade_id]
    cases = CASES[grade_id]
    wants = [reference(*args, **kwargs) for args, kwargs in cases]
    computing = set()
    for name, fn in functions.items():
        for calls in (cases, _by_name(reference, cases)):
            if all(_binds(fn, args, kwargs) for args, kwargs in calls) and all(
                _equal(_call(fn, args, kwargs), want)
                for (args, kwargs), want in zip(calls, wants, strict=True)
            ):
                computing.add(name)
    return computing


def test_the_probe_finds_an_answer_where_there_is_one():
    """The grader's own best_degree, were it in the package, would be found."""
    from autograder.references.model_parallel import best_degree

    found = _computing("best_tensor_degree", {"best_degree": best_degree, "max": max})
    assert found == {"best_degree"}


@pytest.mark.parametrize("grade_id", [g for g, c in CASES.items() if c != "rank"])
def test_no_package_function_computes_a_formula_answer(grade_id):
    computing = _computing(grade_id, _package_functions())
    assert computing == STILL_IN_PACKAGE.get(grade_id, set()), (
        f"{grade_id}: package functions that compute its answer: {sorted(computing)}"
    )


def _rank_check(grade_id: str) -> tuple[Any, Callable, Callable]:
    """(problem, launcher, check) of a rank exercise: the check raises if fn is wrong."""
    if grade_id == "megatron_mlp_rank":
        problem = MegatronMLP(hidden=4, tokens=3, world_size=2)

        def check(results):
            mp_checks.assert_mlp_matches(results, problem)
            mp_checks.assert_fg_payloads(results, problem)

        return problem, mp_checks.run_megatron_mlp, check
    if grade_id == "gpipe_stage":
        problem = PipelineStack(stages=2, micro_batches=3, width=4)

        def check(results):
            mp_checks.assert_stage_grads_match(results, problem)
            mp_checks.assert_gpipe_messages(results, problem)
            mp_checks.assert_gpipe_timeline(results, problem)

        return problem, mp_checks.run_pipeline, check
    if grade_id == "expert_parallel_moe":
        problem = MoELayer(world_size=2, tokens_per_rank=4, hidden=3, inner=4)

        def check(results):
            expert_checks.assert_moe_matches(results, problem)
            expert_checks.assert_all_to_all_traffic(results, problem)

        return problem, expert_checks.run_expert_parallel, check
    problem = SequenceChunks(world_size=2, seq_len=8, dim=4, causal=True, layout=((0, 3), (1, 2)))

    def check(results):
        context_checks.assert_attention_matches(results, problem)
        context_checks.assert_ring_folds(results, problem)
        context_checks.assert_ring_messages(results, problem)

    return problem, context_checks.run_ring_attention, check


def _takes_a_part(fn: Callable) -> bool:
    """``fn(rank, world_size, part, ...)``: a rank function on a shard or a stage."""
    parameters = list(inspect.signature(fn).parameters.values())
    return (
        len(parameters) >= 3
        and [p.name for p in parameters[:2]] == ["rank", "world_size"]
        and (parameters[2].name in ("shard", "stage", "part") or "Shard" in str(parameters[2]))
        and all(p.default is not p.empty for p in parameters[3:])
    )


@pytest.mark.parametrize("grade_id", [g for g, c in CASES.items() if c == "rank"])
def test_no_package_function_computes_a_rank_answer(grade_id):
    problem, run, check = _rank_check(grade_id)
    check(run(_reference_answers()[grade_id], problem, guard=False))  # the probe can find one
    candidates = {n: f for n, f in _package_functions().items() if _takes_a_part(f)}
    assert "distopt.ranks.pipeline_ranks.one_f_one_b_stage" in candidates  # tried, not GPipe
    computing = []
    for name, fn in candidates.items():
        try:
            check(run(fn, problem, guard=False, timeout=20))
        except Exception:  # noqa: BLE001  (a rank raised, or the check failed: not the answer)
            continue
        computing.append(name)
    assert not computing, f"{grade_id}: package functions that compute its answer: {computing}"


def test_the_package_names_none_of_the_answers():
    """Not even under the exercise's name: the package holds no function or class so named."""
    answer_names = set()
    for source in mutants.reference_answers(SECTION, NOTEBOOK).values():
        answer_names |= {
            n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef | ast.ClassDef)
        }
    answer_names -= {"online_softmax_step"}  # exercise 10's helper, the package's teaching tool
    found = {f"{name}" for name in _package_functions() if name.rsplit(".", 1)[-1] in answer_names}
    for root in PACKAGES:
        package = importlib.import_module(root)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{root}."):
            module = importlib.import_module(info.name)
            found |= {
                f"{info.name}.{n}"
                for n, v in vars(module).items()
                if inspect.isclass(v) and v.__module__ == info.name and n in answer_names
            }
    found -= set().union(*STILL_IN_PACKAGE.values())  # the simulator's, pinned above
    assert not found, f"the package names these answers: {sorted(found)}"
    assert distopt.__name__ == "distopt"
