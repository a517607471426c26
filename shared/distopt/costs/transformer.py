"""Parameter and FLOP counts of a GPT-style transformer (Narayanan et al. 2021).

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", Section 5.1: with l layers, hidden size h, vocabulary V and sequence length s,

* equation (2), parameters: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h));
* equation (3), FLOPs of one training step on a batch of B sequences, with activation
  recomputation (forward, forward again, backward = 4 forward passes):
  F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).

Without recomputation the transformer layers run 3 forward passes' worth of work instead of 4
(72 instead of 96); the logit layer is never recomputed, so its 6 B s h V FLOPs stay the same.
"""

from __future__ import annotations

__all__ = ["param_count", "training_flops"]


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")


def param_count(layers: int, hidden: int, vocab: int, seq_len: int) -> float:
    """Number of parameters, Narayanan et al. 2021, equation (2).

    Per layer 12 h^2 weights (attention 4 h^2, MLP 8 h^2) and 13 h biases and norm gains;
    plus the token embedding (V h, shared with the output layer) and learned positions (s h).
    """
    _check_positive(layers=layers, hidden=hidden, vocab=vocab, seq_len=seq_len)
    n, h = layers, hidden
    return 12 * n * h**2 * (1 + 13 / (12 * h) + (vocab + seq_len) / (12 * n * h))


def training_flops(
    batch: int,
    seq_len: int,
    layers: int,
    hidden: int,
    vocab: int,
    *,
    recompute: bool = False,
) -> float:
    """FLOPs of one training step (forward and backward) on ``batch`` sequences.

    Narayanan et al. 2021, equation (3) when ``recompute`` is True (full activation
    recomputation); 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) without it. Only matrix
    multiplications are counted, 2 FLOPs per multiply-add.
    """
    _check_positive(batch=batch, seq_len=seq_len, layers=layers, hidden=hidden, vocab=vocab)
    b, s, n, h = batch, seq_len, layers, hidden
    passes = 4 if recompute else 3  # forward (+ recomputed forward) + backward (= 2 forwards)
    layer_flops = passes * 24 * b * s * n * h**2 * (1 + s / (6 * h))
    logit_flops = 6 * b * s * h * vocab
    return layer_flops + logit_flops
