"""Tests of distopt.project.diagnose: rules on synthetic curves, edge cases, bad histories."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distopt.project import diagnose as dg


@pytest.mark.parametrize("problem", dg.PROBLEMS)
@pytest.mark.parametrize("steps", [50, 173, 400, 1500])
def test_synthetic_histories_are_recognised(problem, steps):
    for seed in range(25):
        history = dg.synthetic_history(problem, steps=steps, seed=seed)
        assert dg.diagnose(history) == problem, (problem, steps, seed)


def test_synthetic_history_is_seeded_and_well_formed():
    a = dg.synthetic_history("loss_spikes", steps=200, seed=3)
    b = dg.synthetic_history("loss_spikes", steps=200, seed=3)
    c = dg.synthetic_history("loss_spikes", steps=200, seed=4)
    assert a == b and a != c
    for problem in dg.PROBLEMS:
        history = dg.synthetic_history(problem, steps=120, seed=1)
        dg.check_history(history)
        assert history["step"] == list(range(len(history["step"])))
        assert all(v in history["step"] for v in history["val_step"])


def test_divergence_ends_at_the_first_non_finite_loss():
    for seed in range(10):
        history = dg.synthetic_history("divergence", steps=300, seed=seed)
        loss = history["loss"]
        assert len(loss) < 300 and not math.isfinite(loss[-1])
        assert all(math.isfinite(x) for x in loss[:-1])


def test_slow_throughput_logs_timings_that_add_up():
    history = dg.synthetic_history("slow_throughput", steps=100, seed=0)
    compute, comm = np.array(history["compute_time"]), np.array(history["comm_time"])
    np.testing.assert_allclose(np.array(history["step_time"]), compute + comm, rtol=1e-12)


def _flat_history(loss, val_loss=None, **extra):
    n = len(loss)
    history = {
        "step": list(range(n)),
        "loss": list(loss),
        "grad_norm": [1.0] * n,
        "lr": [1e-3] * n,
        "step_time": [0.1] * n,
        "val_step": [0, n // 2, n - 1],
        "val_loss": val_loss or [loss[0], loss[n // 2], loss[-1]],
    }
    history.update(extra)
    return history


def test_rules_on_hand_made_curves():
    falling = list(np.linspace(5.0, 2.0, 40))
    assert dg.diagnose(_flat_history(falling)) == "healthy"
    assert dg.diagnose(_flat_history([5.0] * 40)) == "plateau"
    spiky = falling.copy()
    spiky[25] *= 1.5
    assert dg.diagnose(_flat_history(spiky)) == "loss_spikes"
    assert dg.diagnose(_flat_history(falling[:5] + [math.nan])) == "divergence"
    grew = list(np.linspace(3.0, 6.0, 40))
    assert dg.diagnose(_flat_history(grew)) == "divergence"
    overfit = _flat_history(falling, val_loss=[5.0, 2.5, 3.0])
    assert dg.diagnose(overfit) == "overfitting"
    slow = _flat_history(falling, compute_time=[0.04] * 40)
    assert dg.diagnose(slow) == "slow_throughput"
    only_comm = _flat_history(falling, comm_time=[0.01] * 40)
    assert dg.diagnose(only_comm) == "healthy"


def test_non_finite_gradient_or_validation_is_divergence():
    falling = list(np.linspace(5.0, 2.0, 40))
    history = _flat_history(falling)
    history["grad_norm"][-1] = math.inf
    assert dg.diagnose(history) == "divergence"
    assert dg.diagnose(_flat_history(falling, val_loss=[5.0, 3.0, math.nan])) == "divergence"


@pytest.mark.parametrize("key", dg.REQUIRED_KEYS)
def test_missing_key_is_named(key):
    history = dg.synthetic_history("healthy", steps=60, seed=0)
    del history[key]
    with pytest.raises(ValueError, match=repr(key)):
        dg.diagnose(history)


def test_malformed_histories_raise():
    history = dg.synthetic_history("healthy", steps=60, seed=0)
    with pytest.raises(ValueError, match="same length"):
        dg.diagnose({**history, "lr": history["lr"][:-1]})
    with pytest.raises(ValueError, match="val_step"):
        dg.diagnose({**history, "val_loss": history["val_loss"][:-1]})
    with pytest.raises(ValueError, match="no logged steps"):
        dg.diagnose({key: [] for key in dg.REQUIRED_KEYS})
    with pytest.raises(ValueError, match="too few"):
        dg.diagnose(_flat_history([5.0, 4.0, 3.0]))
    with pytest.raises(ValueError, match="numbers"):
        dg.diagnose({**history, "loss": ["a"] * 60})
    with pytest.raises(ValueError, match="dict"):
        dg.diagnose([1, 2, 3])
    with pytest.raises(ValueError, match="problem"):
        dg.synthetic_history("exploding")
    with pytest.raises(ValueError, match="steps"):
        dg.synthetic_history("healthy", steps=10)


def test_every_problem_has_a_remedy():
    assert set(dg.REMEDIES) == set(dg.PROBLEMS)
    assert all(len(text) > 40 for text in dg.REMEDIES.values())
