"""Expert parallelism: top-k routing, the all-to-all dispatch and expert capacity.

A mixture-of-experts layer has ``num_experts`` expert MLPs; a router scores every token
against every expert and sends it to its ``k`` best (Shazeer et al. 2017; Lepikhin et al.
2020, "GShard"; Fedus et al. 2021, "Switch Transformers"). Under expert parallelism the
experts are spread over ``world_size`` devices, ``num_experts / world_size`` each (expert e
on device e // experts_per_device), and tokens start on the device whose data-parallel
batch holds them. An all-to-all sends each token copy to the device of its expert.

Routers are trained with an auxiliary load-balancing loss that is smallest when tokens and
router probability spread evenly over the experts (Switch Transformers, Section 2.2, equations
4-6): :func:`load_balancing_loss`.

Each expert processes at most ``capacity = ceil(capacity_factor * tokens * k / num_experts)``
token copies per step; the copies over capacity are dropped (they skip the layer through the
residual connection). Switch Transformers, Section 2.2.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "dispatch_counts",
    "dropped_copies",
    "expert_capacity",
    "load_balancing_loss",
    "router_logits",
    "top_k_experts",
]


def router_logits(tokens: int, num_experts: int, *, skew: float = 0.0, seed: int = 0) -> np.ndarray:
    """Seeded router scores of shape (tokens, num_experts).

    Standard normal scores plus a bias ``-skew * e / num_experts`` on expert e: with skew 0
    every expert is equally popular, a larger skew favours the low-numbered experts (as a
    router that has collapsed onto a few experts does).
    """
    if tokens < 1 or num_experts < 1:
        raise ValueError(f"tokens and num_experts must be >= 1, got {tokens}, {num_experts}")
    rng = np.random.default_rng(seed)
    bias = -skew * np.arange(num_experts) / num_experts
    return rng.standard_normal((tokens, num_experts)) + bias


def top_k_experts(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of each token's ``k`` highest-scoring experts, best first: (tokens, k) ints."""
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k must be in 1..{logits.shape[1]}, got {k!r}")
    return np.argsort(-logits, axis=1, kind="stable")[:, :k]


def dispatch_counts(
    experts: np.ndarray, token_device: np.ndarray, num_experts: int, world_size: int
) -> np.ndarray:
    """Token copies each device sends to each device in the all-to-all: (world_size, world_size).

    experts: (tokens, k) chosen expert indices; token_device: (tokens,) the device holding
    each token. Entry [i, j] counts the copies that go from device i to device j (the
    diagonal stays local and crosses no link). Rows sum to what each device sends,
    columns to what each receives.
    """
    if num_experts % world_size:
        raise ValueError(f"num_experts ({num_experts}) must be divisible by world_size")
    per_device = num_experts // world_size
    counts = np.zeros((world_size, world_size), dtype=np.int64)
    destinations = experts // per_device
    sources = np.broadcast_to(token_device[:, None], destinations.shape)
    np.add.at(counts, (sources.ravel(), destinations.ravel()), 1)
    return counts


def expert_capacity(tokens: int, num_experts: int, k: int, capacity_factor: float) -> int:
    """Token copies one expert may take per step: ceil(capacity_factor * tokens * k / E).

    The product is rounded to 9 decimals first, so that floating-point error cannot add a
    slot (1.1 * 200 * 3 / 4 is 165.00000000000003, and the capacity is 165, not 166).
    Computed here over all the tokens of the step; real systems compute it per expert on each
    device (or expert-parallel group) from the tokens that device routes.
    """
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
    return math.ceil(round(capacity_factor * tokens * k / num_experts, 9))


def dropped_copies(experts: np.ndarray, num_experts: int, capacity_factor: float) -> int:
    """Token copies that exceed their expert's capacity and are dropped.

    experts: (tokens, k) chosen experts. Each expert keeps at most ``expert_capacity`` copies.
    """
    tokens, k = experts.shape
    load = np.bincount(experts.ravel(), minlength=num_experts)
    capacity = expert_capacity(tokens, num_experts, k, capacity_factor)
    return int(np.maximum(load - capacity, 0).sum())


def load_balancing_loss(logits: np.ndarray, experts: np.ndarray, num_experts: int) -> float:
    """Switch Transformers' auxiliary loss, E * sum_i f_i P_i (Fedus et al. 2021, eq. 4-6).

    logits: (tokens, num_experts) router scores; experts: (tokens, k) the experts chosen.
    f_i is the fraction of the tokens x k copies routed to expert i, P_i the router's softmax
    probability for expert i averaged over the tokens. Both uniform give 1. Only P depends
    smoothly on the router, so the gradient pushes P_i down in proportion to E f_i: the
    busiest experts lose probability first. (For k = 1 this is the paper's loss; for k > 1,
    f counts each token's k copies, so that sum_i f_i = 1 still holds.)
    """
    tokens, k = experts.shape
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    fraction = np.bincount(experts.ravel(), minlength=num_experts) / (tokens * k)
    return float(num_experts * np.sum(fraction * probs.mean(axis=0)))
