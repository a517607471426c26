"""Tests of distopt.problems.megatron_mlp: the shards rebuild the block, the reference is right."""

import pytest
import torch
import torch.nn.functional as F

from distopt.problems.megatron_mlp import PARAMS, MegatronMLP, mlp_block

TOL = 1e-12


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_shards_have_the_stated_shapes_and_glue_back(world_size):
    problem = MegatronMLP(hidden=6, tokens=3, world_size=world_size, seed=1)
    shards = [problem.shard(rank) for rank in range(world_size)]
    inner = 4 * 6 // world_size
    assert shards[0].w_in.shape == (6, inner) and shards[0].b_in.shape == (inner,)
    assert shards[0].w_out.shape == (inner, 6) and shards[0].b_out.shape == (6,)
    assert all(getattr(s, name).is_contiguous() for s in shards for name in PARAMS)
    glued = problem.gather([{name: getattr(s, name) for name in PARAMS} for s in shards])
    for name, whole in problem.weights().items():
        assert torch.equal(glued[name], whole), name


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_partial_outputs_of_the_shards_sum_to_the_reference(world_size):
    # Megatron's forward by hand: each rank's GELU(x A_r + b_r) B_r, summed, plus b_out.
    problem = MegatronMLP(hidden=8, tokens=5, world_size=world_size, seed=2)
    shards = [problem.shard(rank) for rank in range(world_size)]
    partial = sum(F.gelu(s.x @ s.w_in + s.b_in) @ s.w_out for s in shards)
    reference = problem.reference()
    assert (partial + shards[0].b_out - reference.output).abs().max() < TOL


def test_reference_gradients_are_autograd_of_the_block():
    problem = MegatronMLP(hidden=4, tokens=2, world_size=2, seed=3)
    weights = {name: w.requires_grad_() for name, w in problem.weights().items()}
    x, grad_output = problem.inputs()
    x.requires_grad_()
    (mlp_block(x, weights) * grad_output).sum().backward()
    reference = problem.reference()
    for name in PARAMS:
        assert (reference.grads[name] - weights[name].grad).abs().max() < TOL, name
    assert (reference.input_grad - x.grad).abs().max() < TOL
    assert problem.activation_bytes == 2 * 4 * 8


def test_bad_sizes_and_ranks_raise():
    with pytest.raises(ValueError, match="divisible"):
        MegatronMLP(hidden=3, world_size=8)
    with pytest.raises(ValueError, match="rank"):
        MegatronMLP(world_size=2).shard(2)
    with pytest.raises(ValueError, match="expected 2"):
        MegatronMLP(world_size=2).gather([{}])


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_partials_sum_to_the_output_and_to_the_input_gradient(world_size):
    # What g and f all-reduce: each rank's partial output and partial dloss/dx, whose sums
    # (plus b_out) are the unsplit block's output and input gradient.
    problem = MegatronMLP(hidden=8, tokens=5, world_size=world_size, seed=4)
    partials = [problem.partials(rank) for rank in range(world_size)]
    reference = problem.reference()
    b_out = problem.weights()["b_out"]
    assert (sum(p for p, _ in partials) + b_out - reference.output).abs().max() < TOL
    assert (sum(g for _, g in partials) - reference.input_grad).abs().max() < TOL
    if world_size > 1:  # each rank's part is its own, not the sum
        assert (partials[0][1] - reference.input_grad).abs().max() > 1e-3
