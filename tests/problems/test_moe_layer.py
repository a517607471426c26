"""Tests of distopt.problems.moe_layer: the layer against a token-by-token loop, its counts, and
each rank's own part only."""

import dataclasses

import numpy as np
import pytest
import torch

from distopt import launch
from distopt.problems.moe_layer import MoELayer
from distopt.sim import experts


def _by_hand(problem: MoELayer) -> tuple[torch.Tensor, np.ndarray, int]:
    """The layer token by token: output, chosen experts, dropped copies."""
    parts = [problem.shard(r) for r in range(problem.world_size)]
    x = torch.cat([part.x for part in parts])
    router = parts[0].router
    layer_experts = [e for part in parts for e in part.experts]
    load = [0] * problem.num_experts
    rows, chosen, dropped = [], [], 0
    with torch.no_grad():
        for token in x:
            probs = torch.softmax(router(token), dim=0)
            picks = torch.argsort(probs, descending=True)[: problem.top_k]
            out = token.clone()
            for e in picks.tolist():
                load[e] += 1
                if load[e] <= problem.capacity:
                    out += probs[e] * layer_experts[e](token)
                else:
                    dropped += 1
            rows.append(out)
            chosen.append(picks.numpy())
    return torch.stack(rows), np.array(chosen), dropped


@pytest.mark.parametrize(
    "problem",
    [
        MoELayer(),
        MoELayer(world_size=3, experts_per_rank=1, tokens_per_rank=5, top_k=1, capacity_factor=0.7),
        MoELayer(world_size=4, tokens_per_rank=8, top_k=3, skew=3.0, seed=2),
    ],
)
def test_the_layer_equals_a_token_by_token_loop_with_its_drops(problem):
    reference = problem.reference()
    output, chosen, dropped = _by_hand(problem)
    assert (reference.output - output).abs().max() < 1e-12
    assert np.array_equal(reference.chosen.numpy(), chosen)
    assert problem.dropped() == dropped == int((~reference.kept).sum()) > 0
    device = np.repeat(np.arange(problem.world_size), problem.tokens_per_rank)
    counts = experts.dispatch_counts(chosen, device, problem.num_experts, problem.world_size)
    assert np.array_equal(problem.counts(), counts)
    assert problem.capacity == experts.expert_capacity(
        problem.num_tokens, problem.num_experts, problem.top_k, problem.capacity_factor
    )
    # the dropped copies' outputs are zero, the kept ones are their expert's
    assert (reference.expert_outputs[~reference.kept] == 0).all()


def test_the_gradients_are_those_of_the_layer():
    problem = MoELayer(world_size=2, tokens_per_rank=4, seed=6)
    reference = problem.reference()
    parts = [problem.shard(r) for r in range(2)]
    x = torch.cat([part.x for part in parts]).requires_grad_()
    layer_experts = [e for part in parts for e in part.experts]
    probs = torch.softmax(parts[0].router(x), dim=1)
    y = x
    for e, expert in enumerate(layer_experts):
        tokens, slots = torch.nonzero((reference.chosen == e) & reference.kept, as_tuple=True)
        y = y.index_add(0, tokens, probs[tokens, e, None] * expert(x[tokens]))
    y.backward(torch.cat([part.grad_output for part in parts]))
    assert (x.grad - reference.input_grad).abs().max() < 1e-12
    for expert, grads in zip(layer_experts, reference.expert_grads, strict=True):
        for p, g in zip(expert.parameters(), grads, strict=True):
            assert (p.grad - g).abs().max() < 1e-12


def _ask(rank: int, world_size: int, problem: MoELayer, what: str) -> str:
    try:
        if what == "other":
            problem.shard((rank + 1) % world_size)
        elif what == "reference":
            problem.reference()
        elif what != "own":  # another method, private ones included
            getattr(problem, what)()
        else:
            return f"own {problem.shard(rank).first_expert}"
    except PermissionError as error:
        return type(error).__name__
    return "answered"


def _ask_built(rank: int, world_size: int, made: tuple, what: str) -> str:
    """:func:`_ask` of a whole bench the rank builds itself (as with a seed it guessed): one
    shipped to a rank travels withheld (engine/own_parts.Withheld), never whole."""
    cls, fields = made
    return _ask(rank, world_size, cls(**fields), what)


def test_a_rank_can_build_no_part():
    """The checks build each rank's shard in the launching process and ship only that: inside a
    rank the bench builds nothing, its own shard included, by any route, private ones too."""
    problem = MoELayer()
    made = (type(problem), {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)})
    for what, expected in (
        ("own", ["ForeignShardError"] * 2),
        ("other", ["ForeignShardError"] * 2),
        ("reference", ["ForeignShardError"] * 2),
        ("_inputs", ["ForeignShardError"] * 2),
        ("_modules", ["ForeignShardError"] * 2),
        ("counts", ["ForeignShardError"] * 2),
        ("dropped", ["ForeignShardError"] * 2),
    ):
        assert launch(_ask_built, 2, made, what, timeout=60) == expected
    # shipped, it travels withheld, never whole
    assert launch(_ask, 2, problem, "own", timeout=60) == ["WithheldBench"] * 2


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="top_k"):
        MoELayer(experts_per_rank=1, top_k=3)
    with pytest.raises(ValueError, match=">= 1"):
        MoELayer(tokens_per_rank=0)
    with pytest.raises(ValueError, match="rank"):
        MoELayer().shard(2)
