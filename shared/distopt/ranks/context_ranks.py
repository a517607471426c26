"""Context parallelism on real ranks: ring attention, keys and values passed around a ring.

The reference answers of section 03's ring-attention rank exercise (its test forbids calling
them, :mod:`distopt.ranks.context_checks`); the bench is
:class:`distopt.problems.sequence_chunks.SequenceChunks`.

* :func:`zigzag_chunks`: the chunks each rank holds under the zig-zag order, ``[r, 2N-1-r]``,
  which gives every rank the same causal work (the order of Megatron-Core's context
  parallelism and of Llama 3, Dubey et al. 2024);
* :func:`ring_attention_rank`: rank r keeps its queries; at step t it holds the keys and values
  of rank (r - t) mod N, passes them on to rank r + 1 while it folds them into its running
  softmax (:func:`distopt.sim.sequence_parallel.online_softmax_step`), and receives the next
  ones from rank r - 1: N - 1 hops of 2 (s/N) d values (Liu et al. 2023, "Ring Attention with
  Blockwise Transformers"). With a causal mask a pair of chunks whose keys all come after its
  queries is skipped: that is the work the zig-zag order shares out evenly.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from distopt.problems.sequence_chunks import AttentionShard
from distopt.sim.sequence_parallel import online_softmax_step

__all__ = ["ring_attention_rank", "zigzag_chunks"]


def zigzag_chunks(world_size: int) -> list[list[int]]:
    """Rank r's chunks of 2 world_size: ``[r, 2 world_size - 1 - r]``."""
    return [[r, 2 * world_size - 1 - r] for r in range(world_size)]


def ring_attention_rank(rank: int, world_size: int, shard: AttentionShard) -> np.ndarray:
    """Ring attention on rank ``rank``: its (s/N, d) output rows, in the order of ``shard.q``.

    One (chunk x chunk) block of scores per query chunk and key chunk, folded in ring order;
    with a causal mask, keys after their query are masked and blocks with no key at or before
    any query are skipped.
    """
    q = shard.q.numpy()
    length, scale = shard.chunk_len, 1 / math.sqrt(q.shape[1])
    mine = shard.positions[rank].numpy()
    states = [
        (np.full((length, 1), -np.inf), np.zeros((length, 1)), np.zeros((length, q.shape[1])))
        for _ in range(len(q) // length)
    ]
    block = torch.stack((shard.k, shard.v))  # one message per hop: keys and values
    for step in range(world_size):
        source = (rank - step) % world_size
        if step < world_size - 1:  # pass the block on while computing with it
            incoming = torch.empty_like(block)
            transfers = [
                dist.isend(block, (rank + 1) % world_size),
                dist.irecv(incoming, (rank - 1) % world_size),
            ]
        keys, values = block[0].numpy(), block[1].numpy()
        theirs = shard.positions[source].numpy()
        for a in range(len(states)):
            rows = slice(a * length, (a + 1) * length)
            for b in range(len(keys) // length):
                cols = slice(b * length, (b + 1) * length)
                if shard.causal and theirs[cols].min() > mine[rows].max():
                    continue  # every key after every query: nothing to compute
                scores = q[rows] @ keys[cols].T * scale
                if shard.causal:
                    scores = np.where(theirs[None, cols] <= mine[rows, None], scores, -np.inf)
                states[a] = online_softmax_step(*states[a], scores, values[cols])
        if step < world_size - 1:
            for transfer in transfers:
                transfer.wait()
            block = incoming
    return np.concatenate([numerator / row_sum for _, row_sum, numerator in states])
