"""Tests of distopt.ranks.context_checks: the reference answer passes, typical wrong answers fail
with the named check, and the guard stops the package's answer."""

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from autograder.references.model_parallel import ring_attention_rank, zigzag_chunks
from distopt import LaunchError
from distopt.problems.sequence_chunks import SequenceChunks
from distopt.ranks import context_checks as checks
from distopt.sim.sequence_parallel import online_softmax_step

ZIGZAG3 = tuple(map(tuple, zigzag_chunks(3)))


@pytest.mark.parametrize(
    "problem",
    [
        SequenceChunks(world_size=2, seq_len=8),
        SequenceChunks(world_size=3, seq_len=12, dim=3, causal=True, layout=ZIGZAG3),
    ],
)
def test_the_reference_answer_passes(problem):
    results = checks.run_ring_attention(ring_attention_rank, problem, guard=False)
    checks.assert_attention_matches(results, problem)
    checks.assert_ring_folds(results, problem)
    checks.assert_ring_messages(results, problem)
    if problem.causal:
        checks.assert_balanced(results, problem)


def gathered_then_folded(rank, world_size, shard):
    """Right numbers, folds in ring order, but the keys and values by all-gather."""
    q = shard.q.numpy()
    blocks = [torch.empty_like(shard.k) for _ in range(world_size)]
    values = [torch.empty_like(shard.v) for _ in range(world_size)]
    dist.all_gather(blocks, shard.k)
    dist.all_gather(values, shard.v)
    state = (np.full((len(q), 1), -np.inf), np.zeros((len(q), 1)), np.zeros(q.shape))
    for step in range(world_size):
        source = (rank - step) % world_size
        scores = q @ blocks[source].numpy().T / math.sqrt(q.shape[1])
        state = online_softmax_step(*state, scores, values[source].numpy())
    return state[2] / state[1]


def test_an_all_gather_passes_the_values_and_fails_the_messages():
    problem = SequenceChunks(world_size=3, seq_len=9)
    results = checks.run_ring_attention(gathered_then_folded, problem, guard=False)
    checks.assert_attention_matches(results, problem)
    checks.assert_ring_folds(results, problem)
    with pytest.raises(AssertionError, match=r"called \['all_gather'\]"):
        checks.assert_ring_messages(results, problem)


def test_a_contiguous_causal_layout_is_unbalanced():
    problem = SequenceChunks(world_size=3, seq_len=12, causal=True, layout=((0, 1), (2, 3), (4, 5)))
    results = checks.run_ring_attention(ring_attention_rank, problem, guard=False)
    checks.assert_ring_folds(results, problem)  # right, and skipping what it should
    with pytest.raises(AssertionError, match=r"score pairs computed per rank \[10, 26, 42\]"):
        checks.assert_balanced(results, problem)


def whole_attention(rank, world_size, shard):
    from distopt.sim import sequence_parallel

    q = shard.q.numpy()
    return sequence_parallel.attention(q, q, q)


def test_the_guard_refuses_the_package_attention():
    with pytest.raises(LaunchError, match="NotYourOwnWork"):
        checks.run_ring_attention(whole_attention, SequenceChunks())
