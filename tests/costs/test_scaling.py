"""distopt.costs.scaling: the Chinchilla split and loss law."""

import math

import pytest

from distopt.costs import scaling


def test_the_lessons_plan_against_twenty_tokens_per_parameter():
    compute = scaling.training_flops(1e9, 100e9)
    assert compute == 6e20
    n, d = scaling.compute_optimal_split(compute)
    assert math.isclose(n, math.sqrt(6e20 / 120))  # 2.24B parameters
    assert math.isclose(d / n, 20) and math.isclose(6 * n * d, compute)


def test_the_fitted_law_at_the_plan():
    # 1.69 + 406.4 / 1e9**0.34 + 410.7 / 1e11**0.28
    assert scaling.fitted_loss(1e9, 100e9) == pytest.approx(2.386, abs=5e-4)


@pytest.mark.parametrize("compute", [1e18, 6e20, 5.76e23])
def test_the_fitted_optimum_is_the_minimum_along_the_budget(compute):
    n, d = scaling.fitted_optimum(compute)
    assert math.isclose(6 * n * d, compute)
    best = scaling.fitted_loss(n, d)
    for factor in (0.8, 0.95, 1.05, 1.25):  # other splits of the same compute lose
        assert scaling.fitted_loss(n * factor, d / factor) > best


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="num_tokens must be > 0"):
        scaling.fitted_loss(1e9, 0)
    with pytest.raises(ValueError, match="compute_flops"):
        scaling.compute_optimal_split(-1)


def test_kaplans_critical_batch_grows_as_the_loss_falls():
    # 2e8 / 2.38**(1/0.21): about 3 million tokens at the plan's predicted loss
    assert scaling.kaplan_critical_batch(2.38) == pytest.approx(2e8 / 2.38 ** (1 / 0.21))
    assert 2e6 < scaling.kaplan_critical_batch(2.38) < 4e6
    assert scaling.kaplan_critical_batch(2.0) > scaling.kaplan_critical_batch(3.0)
    with pytest.raises(ValueError, match="loss_nats"):
        scaling.kaplan_critical_batch(0)


def test_besiroglu_refit_at_the_plan():
    # Besiroglu et al. 2024's refit: the lesson's 1B plan against the compute-optimal split
    n, d = scaling.fitted_optimum(6e20, fit=scaling.BESIROGLU_FIT)
    assert 20 < d / n < 23  # the refit's optimum agrees with approaches 1 and 2
    plan = scaling.fitted_loss(1e9, 100e9, fit=scaling.BESIROGLU_FIT)
    assert plan > scaling.fitted_loss(n, d, fit=scaling.BESIROGLU_FIT)
    assert scaling.fitted_loss(1e9, 100e9) != plan  # fit= is used, not Hoffmann's constants


@pytest.mark.parametrize("fit", [scaling.FIT, scaling.BESIROGLU_FIT])
def test_compute_to_reach_inverts_the_optimal_loss(fit):
    for compute in (1e18, 6e20):
        loss = scaling.fitted_loss(*scaling.fitted_optimum(compute, fit=fit), fit=fit)
        assert scaling.compute_to_reach(loss, fit=fit) == pytest.approx(compute, rel=1e-9)
    # a suboptimal split's loss is reached by its optimum with less compute
    plan = scaling.fitted_loss(1e9, 100e9, fit=fit)
    assert scaling.compute_to_reach(plan, fit=fit) < 6e20
    with pytest.raises(ValueError, match="above the fit's E"):
        scaling.compute_to_reach(fit["E"], fit=fit)
