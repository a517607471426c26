"""A seeded attention input split over ranks by chunks of the sequence: each rank's rows, the
full attention.

The bench for section 03's ring-attention rank code. Queries, keys and values of ``seq_len``
tokens and width ``dim`` (float64) are cut into chunks of ``chunk_len`` consecutive tokens;
``layout[r]`` lists the chunks rank r holds, in order. One chunk per rank is the contiguous
split of ring attention (Liu et al. 2023); two, ``[r, 2N - 1 - r]``, is the zig-zag order that
balances a causal mask (:func:`distopt.sim.sequence_parallel.device_chunks`). Every rank holds
``seq_len / world_size`` rows of each.

:meth:`SequenceChunks.shard` builds a rank's own rows, with the layout's token positions of
every rank (which tokens a rank holds is the plan every rank knows, not data), in the launching
process: the checks ship each rank its own shard, and inside a process group every route to
the sequence's data refuses (:mod:`distopt.problems.own_data`). The full attention
(:meth:`SequenceChunks.reference`) is for the test alone.

    problem = SequenceChunks(world_size=2, seq_len=8, dim=4, causal=True, layout=((0, 3), (1, 2)))
    problem.shard(rank)        # its q, k, v rows, every rank's positions, the chunk length
    problem.reference()        # the full (causal) attention, (seq_len, dim)
    problem.qkv()              # the whole sequence's q, k, v (for the test)
    problem.work()             # score pairs each rank computes: key <= query if causal
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from distopt.problems.own_data import refuse_inside_ranks

__all__ = ["AttentionShard", "SequenceChunks"]

_OWN_ROWS_ONLY = (
    "Inside a rank, the shard handed to your function holds your own queries, keys and "
    "values; the other ranks' keys and values must reach you around the ring, as messages."
)


@dataclass(frozen=True)
class AttentionShard:
    """What one rank of the ring holds: its rows of q, k and v (float64), and the plan."""

    q: torch.Tensor  # (seq_len / N, dim): its queries, its chunks' rows one chunk after another
    k: torch.Tensor  # (seq_len / N, dim): its keys, the same rows
    v: torch.Tensor  # (seq_len / N, dim): its values, the same rows
    positions: list[torch.Tensor]  # positions[j]: token positions of rank j's rows, in order
    chunk_len: int  # tokens per chunk: a rank's rows are len(q) / chunk_len chunks
    causal: bool  # query i attends to keys j <= i only


@dataclass(frozen=True)
class SequenceChunks:
    """Attention over a sequence split into chunks held by ranks: sizes, mask, layout, seed."""

    # Never in a rank whole: its parts (shard, stage) are built here and shipped to their
    # ranks (engine/own_parts.OwnParts); a copy that would travel with rank code (a
    # notebook global the answer names) travels withheld (engine/shipping.py).
    ships_by_parts: ClassVar[bool] = True

    world_size: int = 2  # N: ranks of the ring
    seq_len: int = 8  # s: tokens in the sequence
    dim: int = 4  # d: width of a query, key and value
    causal: bool = False  # mask keys after their query
    layout: tuple[tuple[int, ...], ...] | None = None  # chunks per rank; None: ((0,), (1,), ...)
    scale: float = 1.0  # queries and keys are scale * standard normal (scores ~ scale^2)
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.world_size, self.seq_len, self.dim) < 1:
            raise ValueError(f"world_size, seq_len and dim must be >= 1, got {self}")
        chunks = self.chunks
        if len(chunks) != self.world_size:
            raise ValueError(f"the layout gives {len(chunks)} ranks chunks, not {self.world_size}")
        held = sorted(c for rank in chunks for c in rank)
        if held != list(range(len(held))) or len({len(rank) for rank in chunks}) != 1:
            raise ValueError(
                f"the layout {chunks} must give every rank as many chunks, each chunk 0.."
                f"{len(held) - 1} to one rank"
            )
        if self.seq_len % len(held):
            raise ValueError(f"seq_len {self.seq_len} must split into {len(held)} equal chunks")

    @property
    def chunks(self) -> tuple[tuple[int, ...], ...]:
        """Each rank's chunks (the layout, contiguous by default)."""
        if self.layout is None:
            return tuple((r,) for r in range(self.world_size))
        return tuple(tuple(int(c) for c in rank) for rank in self.layout)

    @property
    def chunk_len(self) -> int:
        return self.seq_len // sum(len(rank) for rank in self.chunks)

    @property
    def rows(self) -> int:
        """Rows of q, k and v on each rank: seq_len / world_size."""
        return self.seq_len // self.world_size

    @property
    def message_bytes(self) -> int:
        """One ring hop: a rank's keys and values, 2 (s/N) d float64 values."""
        return 2 * self.rows * self.dim * 8

    def positions(self, rank: int) -> np.ndarray:
        """Token positions of rank ``rank``'s rows, chunk after chunk."""
        length = self.chunk_len
        return np.concatenate([np.arange(c * length, (c + 1) * length) for c in self.chunks[rank]])

    def shard(self, rank: int) -> AttentionShard:
        """What rank ``rank`` is given: its rows of q, k, v, and every rank's positions."""
        self._check_rank(rank)
        refuse_inside_ranks("SequenceChunks.shard()", _OWN_ROWS_ONLY)
        q, k, v = (torch.from_numpy(a[self.positions(rank)].copy()) for a in self._qkv())
        return AttentionShard(
            q=q,
            k=k,
            v=v,
            positions=[torch.from_numpy(self.positions(j)) for j in range(self.world_size)],
            chunk_len=self.chunk_len,
            causal=self.causal,
        )

    def qkv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole sequence's queries, keys and values, (seq_len, dim) each (outside the
        ranks only)."""
        refuse_inside_ranks("problem.qkv()", _OWN_ROWS_ONLY)
        return self._qkv()

    def reference(self) -> np.ndarray:
        """softmax(q k^T / sqrt(d)) v over the whole sequence, masked if causal: (s, d)."""
        refuse_inside_ranks("problem.reference()", _OWN_ROWS_ONLY)
        q, k, v = self._qkv()
        scores = q @ k.T / np.sqrt(self.dim)
        if self.causal:
            scores = np.where(np.tril(np.ones((self.seq_len, self.seq_len), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        return weights / weights.sum(axis=1, keepdims=True) @ v

    def work(self) -> list[int]:
        """Score pairs each rank computes: its queries against every key, or, causal, against
        the keys at or before them (what :func:`distopt.sim.sequence_parallel.
        causal_attention_work` counts for its chunk orders)."""
        if not self.causal:
            return [self.rows * self.seq_len] * self.world_size
        return [int((self.positions(r) + 1).sum()) for r in range(self.world_size)]

    def _qkv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        refuse_inside_ranks("SequenceChunks' queries, keys and values", _OWN_ROWS_ONLY)
        rng = np.random.default_rng([self.seed, self.seq_len, self.dim, 3])
        q, k, v = rng.standard_normal((3, self.seq_len, self.dim))
        return self.scale * q, self.scale * k, v

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0..{self.world_size - 1}, got {rank}")
