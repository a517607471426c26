"""Tensor parallelism: column- and row-parallel linear layers and the Megatron MLP.

Simulated on numpy arrays, one array per "device" (Shoeybi et al. 2019, "Megatron-LM",
Section 3, https://arxiv.org/abs/1909.08053). With ``x`` of shape (tokens, d_in) and a weight
``W`` of shape (d_in, d_out), ``y = x @ W``:

* column parallel: device r holds W[:, cols_r]; it computes y[:, cols_r]; the slices are
  all-gathered to form y (or kept split, if the next layer is row parallel);
* row parallel: device r holds W[rows_r, :] and the matching slice x[:, rows_r]; it computes a
  partial sum of shape (tokens, d_out); an all-reduce adds the partial sums.

The Megatron MLP puts a column-parallel layer before the element-wise GELU and a row-parallel
one after it: the hidden activation never needs gathering, so the forward pass costs a single
all-reduce (the operator ``g`` of the paper), and the backward pass one more (``f``).

:func:`distopt.ranks.model_parallel_ranks.dtensor_mlp_check` runs the same MLP with
``torch.distributed.tensor.parallel``; :func:`distopt.ranks.model_parallel_ranks.megatron_mlp_rank`
writes ``f`` and ``g`` by hand as autograd functions on real ranks.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "column_parallel_linear",
    "gelu",
    "megatron_mlp",
    "mlp",
    "row_parallel_linear",
]


def _check_split(size: int, world_size: int, what: str) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if size % world_size:
        raise ValueError(f"{what} ({size}) must be divisible by world_size ({world_size})")


def gelu(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU (Hendrycks and Gimpel 2016), element-wise."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def column_parallel_linear(x: np.ndarray, weight: np.ndarray, world_size: int) -> np.ndarray:
    """``x @ weight`` with the weight's columns split over ``world_size`` devices.

    x: (tokens, d_in); weight: (d_in, d_out), d_out divisible by world_size. Each device
    multiplies the full x by its column block; the output blocks are all-gathered
    (concatenated along the last axis). Returns (tokens, d_out).
    """
    _check_split(weight.shape[1], world_size, "d_out")
    shards = np.split(weight, world_size, axis=1)
    return np.concatenate([x @ shard for shard in shards], axis=1)


def row_parallel_linear(x: np.ndarray, weight: np.ndarray, world_size: int) -> np.ndarray:
    """``x @ weight`` with the weight's rows (and x's columns) split over the devices.

    x: (tokens, d_in); weight: (d_in, d_out), d_in divisible by world_size. Each device
    multiplies its slice of x by its row block, giving a partial (tokens, d_out) result; the
    all-reduce sums the partial results. Returns (tokens, d_out).
    """
    _check_split(weight.shape[0], world_size, "d_in")
    x_slices = np.split(x, world_size, axis=1)
    w_shards = np.split(weight, world_size, axis=0)
    return sum(xs @ ws for xs, ws in zip(x_slices, w_shards, strict=True))


def mlp(x: np.ndarray, w_in: np.ndarray, w_out: np.ndarray) -> np.ndarray:
    """The single-device transformer MLP: gelu(x @ w_in) @ w_out."""
    return gelu(x @ w_in) @ w_out


def megatron_mlp(x: np.ndarray, w_in: np.ndarray, w_out: np.ndarray, world_size: int) -> np.ndarray:
    """The MLP with w_in column parallel and w_out row parallel: one all-reduce in all.

    Device r computes gelu(x @ w_in[:, block_r]) @ w_out[block_r, :] without talking to the
    others (GELU is element-wise, so it applies to each column block separately); the sum
    over r is the all-reduce. x: (tokens, h), w_in: (h, f), w_out: (f, h).
    """
    _check_split(w_in.shape[1], world_size, "the MLP's inner size")
    partials = [
        gelu(x @ a) @ b
        for a, b in zip(
            np.split(w_in, world_size, axis=1), np.split(w_out, world_size, axis=0), strict=True
        )
    ]
    return sum(partials)
