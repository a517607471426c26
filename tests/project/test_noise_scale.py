"""distopt.project.noise_scale: B_simple from two batch sizes."""

import numpy as np
import pytest
import torch

from distopt.costs import critical_batch
from distopt.project.loop import batch_loss, build_data, make_model
from distopt.project.noise_scale import noise_scale
from tests.project.tiny import TINY

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_two_batch_sizes_agree_with_per_sequence_gradients():
    model = make_model(TINY)
    tokens = torch.cat([build_data(TINY).batch(100 + k, 8) for k in range(8)])  # 64 sequences
    per_sequence = []
    for row in tokens.split(1):
        model.zero_grad()
        batch_loss(model, row).backward()
        per_sequence.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
    grads = torch.stack(per_sequence).numpy()
    # unbiased |G|^2 = |mean|^2 - tr(Sigma) / n; tr(Sigma) from the sample variance
    trace_sigma = ((grads - grads.mean(0)) ** 2).sum() / (len(grads) - 1)
    grad_sq = grads.mean(0) @ grads.mean(0) - trace_sigma / len(grads)
    got = noise_scale(model, tokens, small=8)
    # both are estimates from the same 64 sequences: they agree to their sampling error
    assert got["trace_sigma"] == pytest.approx(trace_sigma, rel=0.3)
    assert got["noise_scale"] == pytest.approx(trace_sigma / grad_sq, rel=0.5)
    # the per-example estimator of section 01 is biased low: it cannot exceed about n
    assert critical_batch.simple_noise_scale(grads) < len(grads)
    assert np.isfinite(got["grad_sq"]) and got["grad_sq"] > 0


def test_the_small_batch_must_divide_the_batch():
    tokens = build_data(TINY).batch(0, 8)
    with pytest.raises(ValueError, match="divide"):
        noise_scale(make_model(TINY), tokens, small=3)
