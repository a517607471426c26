"""Context parallelism: attention over a sequence split across devices, with an online softmax.

A long sequence of ``seq_len`` tokens is split into ``world_size`` contiguous blocks, one per
device. Each device keeps its queries and passes its keys and values around a ring; after
``world_size`` steps every query block has seen every key block. The softmax over a row
cannot be formed in one go, so each device keeps, per query row, a running maximum ``m``,
a running sum ``l`` of exp(score - m) and a running output ``o`` (the numerator), and rescales
them whenever a new block raises the maximum (Milakov and Gimelshein 2018, "Online normalizer
calculation for softmax"; Liu et al. 2023, "Ring Attention with Blockwise Transformers").

Besides the simulator, closed-form counts for the notebook: the attention memory of one device
with and without blockwise scores, the FLOPs of a layer's matrix products against its
attention, the causal-mask work of each device for contiguous and zig-zag chunk orders, and the
key/value traffic of a ring step against its compute, beside the all-to-all traffic of
DeepSpeed-Ulysses (Jacobs et al. 2023), which splits attention by heads instead of passing keys
and values around.

This is *context* parallelism, which splits attention itself. Megatron's "sequence parallelism"
(Korthikanti et al. 2022) is another thing: it splits only the LayerNorm and dropout regions
inside a tensor-parallel group; its memory is in ``distopt.costs.memory``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "CHUNK_ORDERS",
    "attention",
    "attention_activation_bytes",
    "causal_attention_work",
    "device_chunks",
    "layer_forward_flops",
    "online_softmax_step",
    "ring_attention",
    "ring_kv_bytes",
    "ring_overlap_tokens_per_device",
    "ring_step_flops",
    "ulysses_bytes",
]

CHUNK_ORDERS = ("contiguous", "zigzag")


def _check_split(seq_len: int, world_size: int, parts: int = 1) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if seq_len < 1 or seq_len % (parts * world_size):
        raise ValueError(
            f"seq_len {seq_len} must split evenly into {parts * world_size} chunks "
            f"(world_size={world_size})"
        )


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v, non-causal. q, k, v: (seq_len, d). Returns (seq_len, d)."""
    scores = q @ k.T / np.sqrt(q.shape[1])
    scores = np.exp(scores - scores.max(axis=1, keepdims=True))
    return scores / scores.sum(axis=1, keepdims=True) @ v


def online_softmax_step(
    row_max: np.ndarray,
    row_sum: np.ndarray,
    numerator: np.ndarray,
    scores: np.ndarray,
    v_block: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fold one block of scores into a device's running softmax state.

    row_max, row_sum: (rows, 1), the running maximum m and sum l of exp(score - m) (start at
    -inf and 0); numerator: (rows, d), the running sum o of exp(score - m) v (starts at 0);
    scores: (rows, c), this block's scaled scores; v_block: (c, d). Returns (m', l', o').
    """
    new_max = np.maximum(row_max, scores.max(axis=1, keepdims=True))
    weights = np.exp(scores - new_max)
    correction = np.exp(row_max - new_max)  # rescales what was summed so far
    row_sum = row_sum * correction + weights.sum(axis=1, keepdims=True)
    numerator = numerator * correction + weights @ v_block
    return new_max, row_sum, numerator


def ring_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, world_size: int) -> np.ndarray:
    """The same attention, with the sequence split over ``world_size`` simulated devices.

    Device r holds rows r of q, k, v (seq_len / world_size each); at ring step t it uses the
    key/value block of device (r - t) mod world_size and folds it into its running
    maximum, sum and output (:func:`online_softmax_step`). Returns the gathered (seq_len, d)
    output.
    """
    if not isinstance(world_size, int) or world_size < 1 or q.shape[0] % world_size:
        raise ValueError(f"seq_len {q.shape[0]} must split evenly over world_size={world_size}")
    scale = 1 / np.sqrt(q.shape[1])
    q_blocks, k_blocks, v_blocks = (np.split(a, world_size) for a in (q, k, v))
    outputs = []
    for rank, q_block in enumerate(q_blocks):
        state = (
            np.full((q_block.shape[0], 1), -np.inf),
            np.zeros((q_block.shape[0], 1)),
            np.zeros_like(q_block),
        )
        for step in range(world_size):
            source = (rank - step) % world_size
            scores = q_block @ k_blocks[source].T * scale
            state = online_softmax_step(*state, scores, v_blocks[source])
        outputs.append(state[2] / state[1])
    return np.concatenate(outputs)


def attention_activation_bytes(
    seq_len: int,
    hidden: int,
    heads: int,
    *,
    world_size: int = 1,
    blockwise: bool = True,
    tile: int = 128,
    bytes_per_value: int = 2,
) -> float:
    """Bytes one device holds for one attention layer's forward pass, micro-batch of 1.

    Every device holds its slice of queries, keys, values and output, 4 s h / N values, and,
    when ``world_size`` > 1, the next key/value block arriving from its ring neighbour
    (2 s h / N more), so that the transfer can overlap the compute. On top come the scores:

    * not ``blockwise`` (naive): the scores of its s/N queries against all s keys at once,
      heads x s^2 / N values;
    * ``blockwise`` (FlashAttention-style, online softmax): one ``tile`` x ``tile`` block of
      scores per head at a time (smaller if s/N is), plus the running maximum and sum of each
      query row, 2 x heads x s / N values. This is O(s h), even on one device.
    """
    _check_split(seq_len, world_size)
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile!r}")
    local = seq_len // world_size
    slices = (4 if world_size == 1 else 6) * local * hidden
    if blockwise:
        side = min(tile, local)
        scores = heads * side * side + 2 * heads * local
    else:
        scores = heads * local * seq_len
    return float((slices + scores) * bytes_per_value)


def layer_forward_flops(
    seq_len: int, hidden: int, *, micro_batch: int = 1, causal: bool = False
) -> dict[str, float]:
    """Forward FLOPs of one transformer layer on ``micro_batch`` sequences, in two parts.

    ``"matmuls"``: the weight matrix products (Q, K, V and output projections, the two MLP
    matrices), 24 s h^2 per sequence; ``"attention"``: the scores Q K^T and their product with
    V, 2 s^2 h each, 4 s^2 h per sequence with no mask. ``causal=True``: a kernel that skips the
    masked half computes 2 s^2 h. The attention part is the larger once s > 6 h, or s > 12 h
    with a causal mask.
    """
    for name, value in (("seq_len", seq_len), ("hidden", hidden), ("micro_batch", micro_batch)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    s, h, b = seq_len, hidden, micro_batch
    attention = (2.0 if causal else 4.0) * b * s * s * h
    return {"matmuls": 24.0 * b * s * h * h, "attention": attention}


def device_chunks(world_size: int, order: str = "contiguous") -> list[list[int]]:
    """The chunks of the sequence each device holds, for a chunk ``order``.

    ``"contiguous"``: N chunks, device i holds chunk i. ``"zigzag"``: 2N chunks, device i
    holds chunks i and 2N - 1 - i, one from the start and one from the end of the sequence.
    """
    if order not in CHUNK_ORDERS:
        raise ValueError(f"order must be one of {CHUNK_ORDERS}, got {order!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if order == "contiguous":
        return [[i] for i in range(world_size)]
    return [[i, 2 * world_size - 1 - i] for i in range(world_size)]


def causal_attention_work(seq_len: int, world_size: int, order: str = "contiguous") -> list[int]:
    """Causal attention work per device: the (query, key) score pairs with key <= query.

    Each device computes the scores of its own queries against all earlier keys (the ring
    brings it every key block). A pair costs the same FLOPs everywhere (4 h: 2 h for the score,
    2 h for its share of the output), so the counts are proportional to each device's attention
    FLOPs. Chunks follow :func:`device_chunks`; ``seq_len`` must split into them evenly.
    """
    chunks = device_chunks(world_size, order)
    num_chunks = sum(len(c) for c in chunks)
    _check_split(seq_len, world_size, parts=num_chunks // world_size)
    length = seq_len // num_chunks

    def pairs(chunk: int) -> int:
        # queries q = chunk * length ... (chunk + 1) * length - 1 each see q + 1 keys
        first = chunk * length
        return length * first + length * (length + 1) // 2

    return [sum(pairs(c) for c in held) for held in chunks]


def _kv_width(hidden: int, heads: int | None, kv_heads: int | None) -> float:
    """The width of the keys (and of the values): hidden x kv_heads / heads."""
    if heads is None and kv_heads is None:
        return float(hidden)
    if heads is None or kv_heads is None or not (1 <= kv_heads <= heads) or heads % kv_heads:
        raise ValueError(
            f"give heads and kv_heads together, kv_heads dividing heads; got {heads}, {kv_heads}"
        )
    return hidden * kv_heads / heads


def ring_kv_bytes(
    seq_len: int,
    hidden: int,
    world_size: int,
    *,
    bytes_per_value: int = 2,
    heads: int | None = None,
    kv_heads: int | None = None,
) -> dict[str, float]:
    """Key/value bytes one device sends in ring attention, one layer's forward pass.

    At each of the N - 1 ring steps a device passes on a key block and a value block of
    s/N tokens x the key width: ``"per_step"`` = 2 (s/N) h bytes_per_value, ``"per_layer"``
    = (N - 1) times that = (N - 1)/N x 2 s h bytes_per_value. With grouped-query attention
    (``kv_heads`` < ``heads``) the keys and values are h kv_heads / heads wide: the traffic
    falls by heads / kv_heads.
    """
    _check_split(seq_len, world_size)
    width = _kv_width(hidden, heads, kv_heads)
    per_step = 2 * (seq_len // world_size) * width * bytes_per_value
    return {"per_step": float(per_step), "per_layer": float((world_size - 1) * per_step)}


def ulysses_bytes(
    seq_len: int,
    hidden: int,
    world_size: int,
    *,
    bytes_per_value: int = 2,
    heads: int | None = None,
    kv_heads: int | None = None,
) -> float:
    """Bytes one device sends in DeepSpeed-Ulysses attention, one layer's forward pass.

    Each device holds s/N tokens of Q, K and V. An all-to-all over the N devices regroups them
    by heads (each device gets all s tokens of heads/N heads), attention runs locally, and a
    fourth all-to-all returns the output to the sequence split (Jacobs et al. 2023). Each
    all-to-all sends (N - 1)/N of the device's s/N x width block: (N - 1)/N^2 x s (2 h + 2 w)
    values, w = h kv_heads / heads the key and value width. It needs N to divide the heads
    (and the key/value heads, else they are copied): ValueError otherwise, when heads are given.
    """
    _check_split(seq_len, world_size)
    width = _kv_width(hidden, heads, kv_heads)
    if heads is not None and (heads % world_size or kv_heads % world_size):
        raise ValueError(
            f"Ulysses splits heads: {world_size} devices must divide heads ({heads}) and "
            f"kv_heads ({kv_heads})"
        )
    n = world_size
    return float((n - 1) / n**2 * seq_len * (2 * hidden + 2 * width) * bytes_per_value)


def ring_step_flops(seq_len: int, hidden: int, world_size: int) -> float:
    """FLOPs of one ring step on one device: its s/N queries against one block of s/N keys.

    Scores and their product with the values, 2 (s/N)^2 h each: 4 (s/N)^2 h (non-causal).
    """
    _check_split(seq_len, world_size)
    local = seq_len // world_size
    return 4.0 * local * local * hidden


def ring_overlap_tokens_per_device(
    flops_per_s: float, bandwidth: float, *, bytes_per_value: int = 2
) -> float:
    """The block length s/N above which a ring step's compute hides its key/value transfer.

    Compute time 4 (s/N)^2 h / F >= transfer time 2 (s/N) h bytes_per_value / beta holds when
    s/N >= F bytes_per_value / (2 beta), with F = ``flops_per_s`` and beta = ``bandwidth``
    (bytes/s). The hidden size cancels: both sides are linear in h.
    """
    if flops_per_s <= 0 or bandwidth <= 0 or bytes_per_value <= 0:
        raise ValueError(
            "flops_per_s, bandwidth and bytes_per_value must be > 0, got "
            f"{flops_per_s!r}, {bandwidth!r}, {bytes_per_value!r}"
        )
    return flops_per_s * bytes_per_value / (2 * bandwidth)
