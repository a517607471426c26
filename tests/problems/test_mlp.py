"""Tests of distopt.problems.mlp: the one seeded MLP builder."""

import pytest
import torch

from distopt.problems import classify
from distopt.problems.mlp import build_mlp


def test_the_seed_alone_decides_the_weights_and_the_global_rng_is_untouched():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b = build_mlp([4, 8, 3], seed=5), build_mlp([4, 8, 3], seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    c = build_mlp([4, 8, 3], seed=6)
    assert not torch.equal(a[0].weight, c[0].weight)


def test_layers_alternate_linear_and_relu():
    net = build_mlp([4, 8, 8, 3], seed=0)
    kinds = [type(m).__name__ for m in net]
    assert kinds == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert net(torch.zeros(2, 4)).shape == (2, 3)


def test_init_gain_scales_the_weight_matrices_only():
    plain, sharp = build_mlp([4, 8, 3], seed=1), build_mlp([4, 8, 3], seed=1, init_gain=4.0)
    assert torch.allclose(sharp[0].weight, 4.0 * plain[0].weight)
    assert torch.equal(sharp[0].bias, plain[0].bias)


def test_section_04s_mlp_is_this_builder():
    ours = classify.make_mlp(6, 3, hidden=16, depth=2, init_gain=2.0, seed=7)
    same = build_mlp([6, 16, 16, 3], seed=7, init_gain=2.0)
    for p, q in zip(ours.parameters(), same.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize(
    ("sizes", "gain"), [([4], 1.0), ([4, 0, 2], 1.0), ([4, 2], 0.0), ([4, 2], -1.0)]
)
def test_bad_shapes_and_gains_are_refused(sizes, gain):
    with pytest.raises(ValueError):
        build_mlp(sizes, init_gain=gain)
