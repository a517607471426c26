"""Tests of distopt.optim.recipe: AdamW parameter groups and the two schedules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from distopt.optim import recipe


def test_param_groups_decay_matrices_only():
    model = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4), nn.Linear(4, 3))
    decay, no_decay = recipe.adamw_param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [tuple(p.shape) for p in decay["params"]] == [(10, 4), (3, 4)]
    assert [tuple(p.shape) for p in no_decay["params"]] == [(4,), (4,), (3,)]
    with pytest.raises(ValueError, match="weight_decay"):
        recipe.adamw_param_groups(model, -1.0)


def test_adamw_uses_recipe_betas_and_leaves_biases_undecayed():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    bias_before = model.bias.detach().clone()
    opt = recipe.adamw(model, lr=0.1, weight_decay=0.5)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    model.weight.grad = torch.zeros_like(model.weight)
    model.bias.grad = torch.zeros_like(model.bias)
    weight_before = model.weight.detach().clone()
    opt.step()
    assert torch.allclose(model.weight, weight_before * (1 - 0.1 * 0.5))
    assert torch.equal(model.bias, bias_before)


def test_cosine_schedule_ends_at_ten_percent():
    kw = dict(peak_lr=3e-4, warmup_steps=2000, total_steps=100_000)
    assert recipe.cosine_schedule(1999, **kw) == pytest.approx(3e-4)
    assert recipe.cosine_schedule(100_000, **kw) == pytest.approx(3e-5)
    assert recipe.cosine_schedule(51_000, **kw) == pytest.approx(0.55 * 3e-4)


def test_wsd_schedule_is_flat_then_cools_down_linearly():
    kw = dict(peak_lr=1.0, warmup_steps=10, total_steps=100, cooldown_steps=20)
    lrs = [recipe.wsd_schedule(s, **kw) for s in range(105)]
    assert lrs[9] == 1.0 and lrs[79] == 1.0
    assert lrs[90] == pytest.approx(0.5)
    assert lrs[100:] == [0.0] * 5
    with pytest.raises(ValueError):
        recipe.wsd_schedule(0, peak_lr=1.0, warmup_steps=90, total_steps=100, cooldown_steps=20)
