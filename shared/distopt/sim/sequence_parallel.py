"""Sequence (context) parallelism: attention computed blockwise with an online softmax.

A long sequence of ``seq_len`` tokens is split into ``world_size`` contiguous blocks, one per
device. Each device keeps its queries and passes its keys and values around a ring; after
``world_size`` steps every query block has seen every key block. The softmax over a row
cannot be formed in one go, so each device keeps, per query row, a running maximum ``m``,
a running sum ``l`` of exp(score - m) and a running output ``o`` (the numerator), and rescales
them whenever a new block raises the maximum (Milakov and Gimelshein 2018, "Online normalizer
calculation for softmax"; Liu et al. 2023, "Ring Attention with Blockwise Transformers").
"""

from __future__ import annotations

import numpy as np

__all__ = ["attention", "attention_activation_bytes", "ring_attention"]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v, non-causal. q, k, v: (seq_len, d). Returns (seq_len, d)."""
    scores = q @ k.T / np.sqrt(q.shape[1])
    scores = np.exp(scores - scores.max(axis=1, keepdims=True))
    return scores / scores.sum(axis=1, keepdims=True) @ v


def ring_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, world_size: int) -> np.ndarray:
    """The same attention, with the sequence split over ``world_size`` simulated devices.

    Device r holds rows r of q, k, v (seq_len / world_size each); at ring step t it uses the
    key/value block of device (r - t) mod world_size and folds it into its running
    maximum, sum and output. Returns the gathered (seq_len, d) output.
    """
    if not isinstance(world_size, int) or world_size < 1 or q.shape[0] % world_size:
        raise ValueError(f"seq_len {q.shape[0]} must split evenly over world_size={world_size}")
    scale = 1 / np.sqrt(q.shape[1])
    q_blocks, k_blocks, v_blocks = (np.split(a, world_size) for a in (q, k, v))
    outputs = []
    for rank, q_block in enumerate(q_blocks):
        running_max = np.full((q_block.shape[0], 1), -np.inf)
        running_sum = np.zeros((q_block.shape[0], 1))
        numerator = np.zeros_like(q_block)
        for step in range(world_size):
            source = (rank - step) % world_size
            scores = q_block @ k_blocks[source].T * scale
            new_max = np.maximum(running_max, scores.max(axis=1, keepdims=True))
            weights = np.exp(scores - new_max)
            correction = np.exp(running_max - new_max)  # rescales what was summed so far
            running_sum = running_sum * correction + weights.sum(axis=1, keepdims=True)
            numerator = numerator * correction + weights @ v_blocks[source]
            running_max = new_max
        outputs.append(numerator / running_sum)
    return np.concatenate(outputs)


def attention_activation_bytes(
    seq_len: int,
    hidden: int,
    heads: int,
    *,
    world_size: int = 1,
    blockwise: bool = True,
    bytes_per_value: int = 2,
) -> float:
    """Bytes one device holds for one attention layer's forward pass, micro-batch of 1.

    Its slice of queries, keys, values and output (4 s h / N values), plus, at one time,
    the scores of its query block against one key block (heads x (s/N)^2) when
    ``blockwise``, or against the whole sequence (heads x s^2 / N) when not.
    """
    if seq_len % world_size:
        raise ValueError(f"seq_len {seq_len} must split evenly over world_size={world_size}")
    local = seq_len / world_size
    scores = heads * local * (local if blockwise else seq_len)
    return (4 * local * hidden + scores) * bytes_per_value
