"""Checks of a student's ring-attention rank code (section 03), each failure saying what differed.

* :func:`run_ring_attention`: ``fn(rank, world_size, problem.shard(rank))`` on the ranks of a
  :class:`~distopt.problems.sequence_chunks.SequenceChunks`, each shard built in the launching
  process and shipped to its rank only (:class:`~distopt.ranks.model_parallel_checks.
  OwnParts`), each rank under the recorder with the payloads kept, its
  ``online_softmax_step`` replaced by the package's, which also records every block of scores
  and values folded (an earlier exercise's mistake costs nothing here:
  :func:`distopt.grading.own_work`'s ``given``); with ``guard=True`` a call of the package's
  answers or whole-sequence attention fails;
* :func:`assert_attention_matches`: each rank's rows against full (causal) attention;
* :func:`assert_ring_folds`: every rank folds one (chunk x chunk) block per query chunk and key
  chunk, in ring order (at step t the keys of rank (r - t) mod N), with the causal mask
  applied and the blocks whose keys all follow their queries skipped; :func:`measured_work`
  counts the score pairs each rank computed, and :func:`assert_balanced` wants them equal;
* :func:`assert_ring_messages`: N - 1 hops per rank, each one message of 2 (s/N) d float64 to
  rank r + 1 carrying the keys and values of rank (r - t) mod N, as many received from r - 1,
  and no collective.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from distopt.engine import record
from distopt.engine.launcher import launch
from distopt.engine.own_parts import OwnParts
from distopt.engine.record import Recording
from distopt.grading import own_work
from distopt.problems.sequence_chunks import SequenceChunks
from distopt.sim import sequence_parallel

__all__ = [
    "ANSWERS",
    "assert_attention_matches",
    "assert_balanced",
    "assert_ring_folds",
    "assert_ring_messages",
    "measured_work",
    "run_ring_attention",
]

# What the rank code may not call: the package's answers, attention over the whole sequence,
# and the problem's methods (own_work watches every method of a class).
ANSWERS: tuple[Callable, ...] = (
    sequence_parallel.attention,
    sequence_parallel.ring_attention,
    sequence_parallel.online_softmax_step,
    sequence_parallel.device_chunks,
    SequenceChunks,
)

Fold = tuple[np.ndarray, np.ndarray]  # the scores and the values handed to one step


def _ring_rank(fn: Callable, guard: bool, rank: int, world_size: int, parts: OwnParts):
    shard = parts.take(rank)
    folds: list[Fold] = []

    def recording_step(row_max, row_sum, numerator, scores, v_block):
        scores, v_block = np.asarray(scores, dtype=float), np.asarray(v_block, dtype=float)
        folds.append((scores.copy(), v_block.copy()))
        return sequence_parallel.online_softmax_step(
            np.asarray(row_max, dtype=float),
            np.asarray(row_sum, dtype=float),
            np.asarray(numerator, dtype=float),
            scores,
            v_block,
        )

    checked = own_work(
        fn, *(ANSWERS if guard else ()), given={"online_softmax_step": recording_step}
    )
    with record.communication(payloads=True) as log:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            value = checked(rank, world_size, shard)
    return value, log, folds


def run_ring_attention(
    fn: Callable, problem: SequenceChunks, *, guard: bool = True, timeout: float = 30
) -> list[tuple[Any, Recording, list[Fold]]]:
    """``fn(rank, world_size, problem.shard(rank))`` on ``problem.world_size`` ranks.

    Returns ``(fn's value, its Recording, its folds)`` per rank, in rank order; the folds are
    the (scores, values) of each ``online_softmax_step`` call, in order.
    """
    runner = functools.partial(_ring_rank, fn, guard)
    with OwnParts([problem.shard(r) for r in range(problem.world_size)]) as parts:
        return launch(runner, problem.world_size, parts, timeout=timeout)


def assert_attention_matches(
    results: Sequence[tuple[Any, Recording, list[Fold]]],
    problem: SequenceChunks,
    *,
    tolerance: float = 1e-10,
) -> None:
    """Every rank's output equals full attention at its rows' positions."""
    full = problem.reference()
    mask = "causal " if problem.causal else ""
    for rank, (value, _, _) in enumerate(results):
        want = full[problem.positions(rank)]
        got = np.asarray(torch.as_tensor(np.asarray(value, dtype=float)), dtype=float)
        worst = np.abs(got - want).max() if got.shape == want.shape else math.inf
        assert worst <= tolerance * max(1.0, np.abs(want).max()), (
            f"rank {rank} of {problem.world_size}, {problem.seq_len} tokens: output of shape "
            f"{got.shape} differs from full {mask}attention at its rows (positions "
            f"{problem.positions(rank).tolist()}, shape {want.shape}) by {worst:.3g}. Hint: "
            "one running state per query chunk; divide each numerator by its row sum at the end"
        )


def _blocks(problem: SequenceChunks) -> dict[tuple[int, int], Fold]:
    """(query chunk, key chunk) -> the scores (masked if causal) and values of that block."""
    q, k, v = problem.qkv()
    n_chunks, length = sum(len(c) for c in problem.chunks), problem.chunk_len
    found = {}
    for a in range(n_chunks):
        rows = slice(a * length, (a + 1) * length)
        for b in range(n_chunks):
            cols = slice(b * length, (b + 1) * length)
            scores = q[rows] @ k[cols].T / math.sqrt(problem.dim)
            if problem.causal:
                keep = (
                    np.arange(b * length, (b + 1) * length)[None, :]
                    <= np.arange(a * length, (a + 1) * length)[:, None]
                )
                scores = np.where(keep, scores, -np.inf)
            found[(a, b)] = (scores, v[cols])
    return found


def _identify(fold: Fold, candidates: dict[tuple[int, int], Fold]) -> tuple[int, int] | None:
    scores, values = fold
    for key, (want_scores, want_values) in candidates.items():
        if (
            scores.shape == want_scores.shape
            and values.shape == want_values.shape
            and np.allclose(scores, want_scores, rtol=1e-9, atol=1e-9)
            and np.allclose(values, want_values, rtol=1e-12, atol=1e-12)
        ):
            return key
    return None


def measured_work(results: Sequence[tuple[Any, Recording, list[Fold]]]) -> list[int]:
    """Score pairs each rank folded in: the finite entries of the score blocks it handed to
    ``online_softmax_step`` (masked entries are -inf)."""
    return [sum(int(np.isfinite(s).sum()) for s, _ in folds) for _, _, folds in results]


def assert_ring_folds(
    results: Sequence[tuple[Any, Recording, list[Fold]]], problem: SequenceChunks
) -> None:
    """One block per query chunk and key chunk, in ring order, masked and skipped as causal
    attention needs; the score pairs computed are those the problem counts (:meth:`work`)."""
    blocks, n, length = _blocks(problem), problem.world_size, problem.chunk_len
    for rank, (_, _, folds) in enumerate(results):
        who = f"rank {rank} of {n}"
        mine = problem.chunks[rank]
        candidates = {key: block for key, block in blocks.items() if key[0] in mine}
        order: dict[int, list[int]] = {a: [] for a in mine}
        for scores, values in folds:
            assert scores.shape == (length, length), (
                f"{who}: online_softmax_step got scores of shape {scores.shape}; fold one block "
                f"of one query chunk ({length} tokens) against one key chunk ({length} keys) "
                "at a time"
            )
            key = _identify((scores, values), candidates)
            assert key is not None, (
                f"{who}: online_softmax_step got a block that is no q_a k_b^T / sqrt(d) of one "
                "of its query chunks a and a key chunk b, with the values of chunk b"
                + (", keys after their query set to -inf" if problem.causal else "")
            )
            assert np.isfinite(scores).any(), (
                f"{who}: it folded query chunk {key[0]} against key chunk {key[1]}, every key of "
                "which comes after every query: a fully masked block is work to skip"
            )
            order[key[0]].append(key[1])
        for a in mine:
            expected = [
                b
                for t in range(n)
                for b in problem.chunks[(rank - t) % n]
                if not (problem.causal and b > a)
            ]
            assert order[a] == expected, (
                f"{who}: its query chunk {a} folded the key chunks {order[a]}, in this order; "
                f"expected {expected}: at step t the chunks of rank (r - t) mod N, each once"
                + (", skipping those after the query chunk" if problem.causal else "")
            )
    got, expected = measured_work(results), problem.work()
    assert got == expected, f"score pairs computed per rank {got}; expected {expected}" + (
        " (keys at or before each query)" if problem.causal else ""
    )


def assert_balanced(
    results: Sequence[tuple[Any, Recording, list[Fold]]], problem: SequenceChunks
) -> None:
    """Every rank computed as many score pairs as every other."""
    work = measured_work(results)
    assert len(set(work)) == 1, (
        f"causal attention over {problem.seq_len} tokens with the chunks {problem.chunks} "
        f"per rank: score pairs computed per rank {work}, the busiest "
        f"{max(work) / np.mean(work):.3f} x the mean. Each rank should hold one chunk from "
        "the start of the sequence and one from the end, so that every rank does the same work"
    )


def assert_ring_messages(
    results: Sequence[tuple[Any, Recording, list[Fold]]], problem: SequenceChunks
) -> None:
    """N - 1 hops: each a message of a rank's keys and values (2 (s/N) d float64) to rank r + 1,
    the one it received at the hop before (its own first), and N - 1 received from r - 1."""
    n, size = problem.world_size, problem.message_bytes
    _, k, v = problem.qkv()
    for rank, (_, log, _) in enumerate(results):
        who = f"rank {rank} of {n}"
        collectives = sorted({c.name for c in log.collectives()})
        assert not collectives, (
            f"{who} called {collectives}: ring attention passes keys and values to a neighbour "
            f"only, with dist.isend / dist.irecv. Its traffic: {log.summary()}"
        )
        right, left = (rank + 1) % n, (rank - 1) % n
        for calls, verb, peer in ((log.sent(), "sent", right), (log.received(), "received", left)):
            described = [(c.peer, c.payload_bytes) for c in calls]
            assert described == [(peer, size)] * (n - 1), (
                f"{who} {verb} (peer, bytes) {described}; expected {n - 1} hops, each one "
                f"message of its current keys and values stacked, 2 x {problem.rows} x "
                f"{problem.dim} float64 = {size} bytes, {'to' if verb == 'sent' else 'from'} "
                f"rank {peer}: {'(rank + 1)' if verb == 'sent' else '(rank - 1)'} % world_size "
                "(no message at the last step)"
            )
        for hop, call in enumerate(log.sent()):
            source = (rank - hop) % n
            rows = problem.positions(source)
            want = np.stack((k[rows], v[rows]))
            got = call.payload[0].numpy() if call.payload else None
            assert (
                got is not None
                and got.size == want.size
                and np.allclose(got.reshape(want.shape), want, rtol=0, atol=0)
            ), (
                f"{who}: its message at hop {hop} did not carry the keys and values of rank "
                f"{source} ((rank - hop) mod N, stacked as torch.stack((k, v))): at each hop a "
                "rank passes on the block it has just used"
            )
