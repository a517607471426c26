"""Tests of distopt.problems.stacked_runs: K runs at once equal the same runs one by one."""

from __future__ import annotations

import math

import pytest
import torch

from distopt.problems import classify, stacked_runs
from distopt.problems.stacked_runs import RunSpec

BATCH, TARGET, MAX_STEPS, EVAL_EXAMPLES = 64, 0.75, 80, 256


@pytest.fixture(scope="module")
def data():
    return classify.make_classification_data(1024, 256, num_features=6, num_classes=3, seed=1)


def one_run(data, spec: RunSpec) -> classify.History:
    """The same run with the task's own loop and torch's optimizer, evaluated at the same steps."""
    model = classify.make_mlp(6, 3, hidden=16, seed=spec.seed)
    if spec.betas is None:
        opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=spec.lr, betas=spec.betas, eps=spec.eps)
    warm = max(1, spec.warmup_steps)
    return classify.train(
        model, opt, data, batch_size=BATCH, num_steps=MAX_STEPS, seed=spec.seed,
        eval_every_examples=EVAL_EXAMPLES, lr_at=lambda s: spec.lr * min(1.0, (s + 1) / warm),
    )  # fmt: skip


def stacked(data, specs, **kwargs):
    return stacked_runs.steps_to_loss(
        data, specs, batch_size=BATCH, target_loss=TARGET, max_steps=MAX_STEPS,
        eval_every_examples=EVAL_EXAMPLES, hidden=16, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize(
    "specs",
    [
        [RunSpec(0.05), RunSpec(0.05, seed=1, warmup_steps=20), RunSpec(0.2, seed=2, momentum=0.5)],
        [RunSpec(0.01, betas=(0.9, 0.999)), RunSpec(0.003, seed=3, betas=(0.6, 0.99), eps=1e-6)],
    ],
    ids=["sgd", "adam"],
)  # fmt: skip
def test_stacked_runs_follow_the_single_runs(data, specs):
    """Each run's test losses match its own loop with torch.optim.SGD/Adam; the steps too."""
    results = stacked(data, specs)
    for spec, result in zip(specs, results, strict=True):
        alone = one_run(data, spec)
        curve = alone.test_loss[1:]  # [0] is before training
        assert len(result.test_loss) >= 3
        assert result.test_loss == pytest.approx(curve[: len(result.test_loss)], abs=2e-5), spec
        reached = [k for k, loss in enumerate(curve) if loss <= TARGET]
        expected = (reached[0] + 1) * (EVAL_EXAMPLES // BATCH) if reached else None
        assert result.steps == expected and not result.diverged, spec
    assert any(r.steps is not None for r in results)


def test_a_diverging_run_stops_alone(data):
    specs = [RunSpec(0.05, seed=0), RunSpec(1e6, seed=1), RunSpec(0.05, seed=2)]
    results = stacked(data, specs)
    assert results[1].diverged and results[1].steps is None
    alone = stacked(data, [specs[0], specs[2]])
    assert [r.steps for r in alone] == [results[0].steps, results[2].steps]
    assert alone[0].test_loss == results[0].test_loss


def test_giving_up_on_the_mean(data):
    specs = [RunSpec(0.05, seed=s) for s in range(3)]
    full = stacked(data, specs)
    mean = stacked_runs.mean_steps(full)
    assert math.isfinite(mean)
    # A bound above the mean changes nothing; below it, the stack stops before the end.
    assert [r.steps for r in stacked(data, specs, give_up_mean=mean + 1)] == [r.steps for r in full]
    cut = stacked(data, specs, give_up_mean=mean - 1)
    assert None in [r.steps for r in cut] and stacked_runs.mean_steps(cut) == math.inf
    assert max(len(r.test_loss) for r in cut) <= max(len(r.test_loss) for r in full)
    # A diverged run makes the mean infinite: with a bound, the stack stops.
    stopped = stacked(data, [RunSpec(0.05, seed=0), RunSpec(1e6, seed=1)], give_up_mean=1e9)
    assert stopped[1].diverged and stopped[0].steps is None


def test_a_stack_is_all_sgd_or_all_adam(data):
    with pytest.raises(ValueError):
        stacked(data, [RunSpec(0.1), RunSpec(0.01, betas=(0.9, 0.999))])
    with pytest.raises(ValueError):
        stacked(data, [])
