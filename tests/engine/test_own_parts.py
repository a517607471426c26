"""distopt.engine.own_parts and the launch: a bench that ships by parts reaches each rank as its
own part only, and never whole by another route (a notebook global, a closure, a container)."""

import pytest

from distopt import LaunchError, launch
from distopt.engine.own_parts import Withheld, WithheldBench
from distopt.problems.shards import RankShard, ShardedProblem

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Rank code as a notebook cell defines it: a module that cannot be imported, so cloudpickle
# ships the functions by value, with the globals they name (issue 53: a red team passed four
# exercises by naming the test cell's global ``problem`` inside the answer).
_CELL = """
def what_it_got(rank, world_size, part, boxed):
    return type(part).__name__, type(boxed[0]).__name__, type(problem).__name__

def asks_the_global(rank, world_size, part):
    return problem.reference_sgd()

def asks_the_closure(rank, world_size, part):
    held = problem
    def inner():
        return held.global_batch_at(0)
    return inner()
"""


def _cell(problem):
    namespace = {"__name__": "notebook_cell", "problem": problem}
    exec(_CELL, namespace)  # noqa: S102
    return namespace


def test_the_arguments_arrive_as_the_ranks_parts_and_every_other_copy_withheld():
    """In the arguments (there, or in tuples and lists of them, as ``runs = [(fn, problem)]``)
    each bench becomes the rank's own part; the global the code names is withheld."""
    problem = ShardedProblem(shard_sizes=(2, 3), steps=1)
    got = launch(_cell(problem)["what_it_got"], 2, problem, (problem,))
    assert got == [("RankShard", "RankShard", "Withheld")] * 2


@pytest.mark.parametrize("fn", ["asks_the_global", "asks_the_closure"])
def test_a_whole_bench_reached_outside_the_arguments_answers_nothing(fn):
    problem = ShardedProblem(shard_sizes=(2, 3), steps=1)
    with pytest.raises(LaunchError, match="WithheldBench") as raised:
        launch(_cell(problem)[fn], 2, problem)
    assert "use that argument instead" in str(raised.value)


def test_withheld_refuses_every_attribute_and_pickles_as_itself():
    import pickle

    held = pickle.loads(pickle.dumps(Withheld("ShardedProblem")))
    for name in ("seed", "reference_sgd", "_rows", "own_part"):
        with pytest.raises(WithheldBench, match="whole ShardedProblem"):
            getattr(held, name)
    assert "withheld" in repr(held)
    assert not isinstance(held, RankShard)


def test_section_03s_benches_never_travel_whole_either():
    """03's problems are cut by their checks (OwnParts of shards and stages); the global an
    answer names travels withheld all the same."""
    from distopt.problems.megatron_mlp import MegatronMLP
    from distopt.ranks import model_parallel_checks

    problem = MegatronMLP(hidden=4, tokens=3, world_size=2)
    namespace = {"__name__": "notebook_cell", "problem": problem}
    exec(  # noqa: S102
        "def megatron_mlp_rank(rank, world_size, shard):\n    return problem.seed\n", namespace
    )
    with pytest.raises(LaunchError, match="WithheldBench"):
        model_parallel_checks.run_megatron_mlp(namespace["megatron_mlp_rank"], problem)
