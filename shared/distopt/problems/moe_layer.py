"""A seeded mixture-of-experts layer cut by expert parallelism: each rank's part, the unsplit run.

The bench for section 03's expert-parallel rank code. On tokens x of shape (tokens, hidden),
float64 (Shazeer et al. 2017; Lepikhin et al. 2020, "GShard"; Fedus et al. 2021, "Switch
Transformers", Section 2):

    probs  = softmax(router(x))              router: Linear(hidden, E), the same on every rank
    chosen = each token's top_k experts       (highest probability first)
    y      = x + sum over the kept copies (t, e) of probs[t, e] * expert_e(x[t])

with expert_e = Linear(hidden, inner) -> Tanh -> Linear(inner, hidden). Each expert takes at
most ``capacity = ceil(capacity_factor * tokens * top_k / E)`` token copies per step, counted
over every rank's tokens (:func:`distopt.sim.experts.expert_capacity`): the copies sent to an
expert queue in token order, rank 0's tokens first, then rank 1's, and so on, and those after
the first ``capacity`` are dropped. A dropped copy adds nothing: the residual ``x`` carries
the token through the layer.

Under expert parallelism rank r holds experts ``r E/N ... (r+1) E/N - 1`` and the step's tokens
``r T ... (r+1) T - 1`` (T per rank). :meth:`MoELayer.shard` builds a rank's part only, in the
launching process: the checks ship each rank its own part, and inside a process group every
route to the layer's data (its tokens, its router and experts) refuses, so neither another
rank's part nor :meth:`MoELayer.reference` (the whole layer in one process) can be computed
in a rank (:mod:`distopt.problems.own_data`).

    problem = MoELayer(world_size=2, experts_per_rank=2, tokens_per_rank=6)
    problem.shard(rank)        # rank's tokens, its experts, the router, the capacity
    problem.reference()        # the whole layer forward and backward: output, every gradient
    problem.counts()           # token copies rank i sends to rank j's experts, (N, N)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from distopt.problems.own_data import refuse_inside_ranks
from distopt.sim.experts import expert_capacity

__all__ = ["MoELayer", "MoEReference", "MoEShard"]

# What a rank that asked for more than its own part should do instead.
_OWN_PART_ONLY = (
    "Inside a rank, the shard handed to your function holds your own tokens and experts; the "
    "tokens your experts process must reach you by the all-to-all, and their results go back "
    "by it."
)


@dataclass(frozen=True)
class MoEShard:
    """What one expert-parallel rank holds (float64, its own copies)."""

    x: torch.Tensor  # (T, hidden): this rank's tokens, the layer's input
    grad_output: torch.Tensor  # (T, hidden): dloss/dy for those tokens
    router: nn.Linear  # hidden -> num_experts: the router, the same on every rank
    experts: nn.ModuleList  # this rank's E/N experts, global indices first_expert + j
    first_expert: int  # rank * E / N
    num_experts: int  # E, over all ranks
    top_k: int  # experts per token
    capacity: int  # token copies an expert keeps per step, counted over all ranks' tokens


@dataclass(frozen=True)
class MoEReference:
    """The whole layer run forward and backward in one process."""

    output: torch.Tensor  # (N T, hidden)
    input_grad: torch.Tensor  # (N T, hidden): dloss/dx
    expert_grads: list[list[torch.Tensor]]  # per expert, its parameters' gradients in order
    chosen: torch.Tensor  # (N T, top_k) long: each token's experts, best first
    kept: torch.Tensor  # (N T, top_k) bool: whether that copy was within capacity
    expert_outputs: torch.Tensor  # (N T, top_k, hidden): expert_e(x[t]) per copy, 0 if dropped
    gates: torch.Tensor  # (N T, top_k): the router's probability of each copy's expert
    # (N T, top_k, hidden): dloss/d(the expert's input) per copy, 0 if dropped: what the
    # dispatch's backward returns to the copy's rank
    expert_input_grads: torch.Tensor


@dataclass(frozen=True)
class MoELayer:
    """An expert-parallel MoE layer: ranks, experts, tokens, sizes, routing, seed."""

    # Never in a rank whole: its parts (shard, stage) are built here and shipped to their
    # ranks (engine/own_parts.OwnParts); a copy that would travel with rank code (a
    # notebook global the answer names) travels withheld (engine/shipping.py).
    ships_by_parts: ClassVar[bool] = True

    world_size: int = 2  # N: expert-parallel ranks
    experts_per_rank: int = 2  # E / N
    tokens_per_rank: int = 6  # T: tokens each rank starts with
    hidden: int = 4  # h: width of a token (a row of the all-to-all)
    inner: int = 8  # width inside an expert
    top_k: int = 2  # experts per token
    capacity_factor: float = 1.0  # c in capacity = ceil(c * tokens * k / E)
    skew: float = 0.0  # router bias -skew * e / E: larger favours low-numbered experts
    seed: int = 0

    def __post_init__(self) -> None:
        sizes = (self.world_size, self.experts_per_rank, self.tokens_per_rank, self.hidden)
        if min(sizes) < 1 or self.inner < 1:
            raise ValueError(f"every size must be >= 1, got {self}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k must be in 1..{self.num_experts}, got {self.top_k}")

    @property
    def num_experts(self) -> int:
        return self.world_size * self.experts_per_rank

    @property
    def num_tokens(self) -> int:
        return self.world_size * self.tokens_per_rank

    @property
    def capacity(self) -> int:
        """Token copies one expert keeps per step (all ranks' tokens count)."""
        return expert_capacity(self.num_tokens, self.num_experts, self.top_k, self.capacity_factor)

    @property
    def row_bytes(self) -> int:
        """Bytes of one token copy in the all-to-all: hidden float64 values."""
        return 8 * self.hidden

    def shard(self, rank: int) -> MoEShard:
        """What rank ``rank`` is given: its tokens and dloss/dy, the router, its experts."""
        self._check_rank(rank)
        refuse_inside_ranks("MoELayer.shard()", _OWN_PART_ONLY)
        x, grad_output = self._inputs()
        router, experts = self._modules()
        first, mine = rank * self.experts_per_rank, self._rows(rank)
        return MoEShard(
            x=x[mine].clone(),
            grad_output=grad_output[mine].clone(),
            router=router,
            experts=nn.ModuleList(experts[first : first + self.experts_per_rank]),
            first_expert=first,
            num_experts=self.num_experts,
            top_k=self.top_k,
            capacity=self.capacity,
        )

    def reference(self) -> MoEReference:
        """The whole layer, forward and backward from ``grad_output``, in one process."""
        refuse_inside_ranks("problem.reference()", _OWN_PART_ONLY)
        x, grad_output = self._inputs()
        router, experts = self._modules()
        x.requires_grad_()
        probs = torch.softmax(router(x), dim=1)
        chosen = probs.topk(self.top_k, dim=1).indices
        kept = self._kept(chosen)
        y = x
        outputs = torch.zeros(*chosen.shape, self.hidden, dtype=torch.float64)
        input_grads = torch.zeros_like(outputs)
        for e, expert in enumerate(experts):
            tokens, slots = torch.nonzero((chosen == e) & kept, as_tuple=True)
            result = expert(x[tokens])
            outputs[tokens, slots] = result.detach()
            copies = x[tokens].detach().requires_grad_()  # the expert's input, as received
            (grad_in,) = torch.autograd.grad(
                expert(copies), copies, probs[tokens, e, None].detach() * grad_output[tokens]
            )
            input_grads[tokens, slots] = grad_in
            y = y.index_add(0, tokens, probs[tokens, e, None] * result)
        y.backward(grad_output)
        return MoEReference(
            output=y.detach(),
            input_grad=x.grad,
            expert_grads=[[p.grad for p in expert.parameters()] for expert in experts],
            chosen=chosen,
            kept=kept,
            expert_outputs=outputs,
            gates=probs.detach().gather(1, chosen),
            expert_input_grads=input_grads,
        )

    def counts(self) -> np.ndarray:
        """Token copies rank i sends to the experts of rank j, (N, N) ints: the all-to-all's
        rows per pair, dropped copies included (the expert's rank drops them)."""
        chosen = self._chosen()
        source = np.repeat(np.arange(self.world_size), self.tokens_per_rank)[:, None]
        counts = np.zeros((self.world_size, self.world_size), dtype=np.int64)
        np.add.at(
            counts, (np.broadcast_to(source, chosen.shape), chosen // self.experts_per_rank), 1
        )
        return counts

    def dropped(self) -> int:
        """Token copies over their expert's capacity."""
        return int((~self._kept(torch.from_numpy(self._chosen()))).sum())

    def _chosen(self) -> np.ndarray:
        x, _ = self._inputs()
        router, _ = self._modules()
        with torch.no_grad():
            return torch.softmax(router(x), dim=1).topk(self.top_k, dim=1).indices.numpy()

    def _kept(self, chosen: torch.Tensor) -> torch.Tensor:
        """Within capacity: among the copies sent to an expert, in token order, the first
        ``capacity`` (a token picks an expert at most once)."""
        kept = torch.zeros_like(chosen, dtype=torch.bool)
        for e in range(self.num_experts):
            picks = chosen == e
            place = torch.cumsum(picks.any(dim=1).long(), dim=0) - 1  # in e's queue
            kept |= picks & (place < self.capacity)[:, None]
        return kept

    def _inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        refuse_inside_ranks("MoELayer's tokens", _OWN_PART_ONLY)
        rng = np.random.default_rng([self.seed, self.num_tokens, self.hidden, 1])
        x = rng.standard_normal((self.num_tokens, self.hidden))
        grad_output = rng.standard_normal((self.num_tokens, self.hidden))
        return torch.from_numpy(x), torch.from_numpy(grad_output)

    def _modules(self) -> tuple[nn.Linear, list[nn.Module]]:
        """The router and every expert, float64; each depends only on the seed and sizes."""
        refuse_inside_ranks("MoELayer's experts", _OWN_PART_ONLY)
        rng = np.random.default_rng([self.seed, self.num_experts, self.hidden, self.inner, 2])
        h, f, e_count = self.hidden, self.inner, self.num_experts
        with torch.random.fork_rng(devices=[]):  # the layers' own initialisation is replaced
            router = nn.Linear(h, e_count).double()
            experts = [
                nn.Sequential(nn.Linear(h, f), nn.Tanh(), nn.Linear(f, h)).double()
                for _ in range(e_count)
            ]
        bias = -self.skew * np.arange(e_count) / e_count + 0.1 * rng.standard_normal(e_count)
        with torch.no_grad():
            router.weight.copy_(torch.from_numpy(rng.standard_normal((e_count, h)) / np.sqrt(h)))
            router.bias.copy_(torch.from_numpy(bias))
        with torch.no_grad():
            for expert in experts:
                for layer, (fan_in, fan_out) in ((expert[0], (h, f)), (expert[2], (f, h))):
                    weight = rng.standard_normal((fan_out, fan_in)) / np.sqrt(fan_in)
                    layer.weight.copy_(torch.from_numpy(weight))
                    layer.bias.copy_(torch.from_numpy(0.1 * rng.standard_normal(fan_out)))
        return router, experts

    def _rows(self, rank: int) -> slice:
        return slice(rank * self.tokens_per_rank, (rank + 1) * self.tokens_per_rank)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0..{self.world_size - 1}, got {rank}")
