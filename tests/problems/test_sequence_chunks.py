"""Tests of distopt.problems.sequence_chunks: layouts, positions, the reference attention, the
causal work per rank against the simulator's count, and each rank's own rows only."""

import dataclasses

import numpy as np
import pytest

from distopt import launch
from distopt.problems.sequence_chunks import SequenceChunks
from distopt.sim import sequence_parallel


def test_the_reference_is_full_attention_and_causal_rows_see_only_the_past():
    problem = SequenceChunks(world_size=2, seq_len=8, dim=3, seed=1)
    q, k, v = problem.qkv()
    assert np.abs(problem.reference() - sequence_parallel.attention(q, k, v)).max() < 1e-12
    causal = SequenceChunks(world_size=2, seq_len=8, dim=3, causal=True, seed=1).reference()
    for i in range(8):  # row i: attention over keys 0..i only
        assert (
            np.abs(
                causal[i] - sequence_parallel.attention(q[i : i + 1], k[: i + 1], v[: i + 1])
            ).max()
            < 1e-12
        )


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_the_work_per_rank_is_the_simulator_s_for_both_orders(n):
    for order in sequence_parallel.CHUNK_ORDERS:
        layout = tuple(map(tuple, sequence_parallel.device_chunks(n, order)))
        problem = SequenceChunks(world_size=n, seq_len=4 * n, causal=True, layout=layout)
        assert problem.work() == sequence_parallel.causal_attention_work(4 * n, n, order)
        rows = np.sort(np.concatenate([problem.positions(r) for r in range(n)]))
        assert rows.tolist() == list(range(4 * n)) and problem.rows == 4
    assert SequenceChunks(world_size=2, seq_len=8).work() == [32, 32]


def test_a_shard_holds_its_rows_and_every_rank_s_positions():
    problem = SequenceChunks(world_size=2, seq_len=8, dim=3, layout=((0, 3), (1, 2)))
    q, k, v = problem.qkv()
    shard = problem.shard(1)
    assert problem.positions(1).tolist() == [2, 3, 4, 5] and shard.chunk_len == 2
    assert np.array_equal(shard.k.numpy(), k[[2, 3, 4, 5]])
    assert [p.tolist() for p in shard.positions] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert problem.message_bytes == 2 * 4 * 3 * 8


def _ask(rank: int, world_size: int, problem: SequenceChunks, what: str) -> str:
    try:
        if what == "other":
            problem.shard((rank + 1) % world_size)
        elif what == "reference":
            problem.reference()
        elif what != "own":  # another method, private ones included
            getattr(problem, what)()
        else:
            return f"own {problem.shard(rank).positions[rank].tolist()}"
    except PermissionError as error:
        return type(error).__name__
    return "answered"


def _ask_built(rank: int, world_size: int, made: tuple, what: str) -> str:
    """:func:`_ask` of a whole bench the rank builds itself (as with a seed it guessed): one
    shipped to a rank travels withheld (engine/own_parts.Withheld), never whole."""
    cls, fields = made
    return _ask(rank, world_size, cls(**fields), what)


def test_a_rank_can_build_no_rows():
    """The checks build each rank's shard in the launching process and ship only that: inside a
    rank the bench builds nothing, its own shard included, by any route, private ones too."""
    problem = SequenceChunks(world_size=2, seq_len=4)
    made = (type(problem), {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)})
    for what, expected in (
        ("own", ["ForeignShardError"] * 2),
        ("other", ["ForeignShardError"] * 2),
        ("reference", ["ForeignShardError"] * 2),
        ("_qkv", ["ForeignShardError"] * 2),
        ("qkv", ["ForeignShardError"] * 2),
    ):
        assert launch(_ask_built, 2, made, what, timeout=60) == expected
    # shipped, it travels withheld, never whole
    assert launch(_ask, 2, problem, "own", timeout=60) == ["WithheldBench"] * 2


def test_bad_layouts_raise():
    with pytest.raises(ValueError, match="as many chunks"):
        SequenceChunks(world_size=2, seq_len=8, layout=((0, 1), (1, 2)))
    with pytest.raises(ValueError, match="gives 1 ranks"):
        SequenceChunks(world_size=2, seq_len=8, layout=((0, 1),))
    with pytest.raises(ValueError, match="equal chunks"):
        SequenceChunks(world_size=2, seq_len=6, layout=((0, 3), (1, 2)))
