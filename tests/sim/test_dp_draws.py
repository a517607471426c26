import functools

import numpy as np
import pytest

from distopt.sim import dp_draws, federated

SMALL = dict(num_clients=12, examples_per_client=30, dim=4, shift_std=2.0, label_skew=0.5)


def _one_by_one(aggregate_of, runs, **kw):
    """run_federated once per run, each on a fresh problem: what the batch must equal."""
    return [
        federated.run_federated(federated.make_problem(3, **SMALL), aggregate=aggregate_of(r), **kw)
        for r in range(runs)
    ]


@pytest.mark.parametrize("clients_per_round", [None, 5])
def test_each_draw_is_the_run_federated_run_with_its_own_noise(clients_per_round):
    kw = dict(local_steps=3, rounds=6, lr=0.2, batch_size=8, clients_per_round=clients_per_round)
    sigmas = (0.0, 1.0, 4.0)

    def aggregate_of(r):  # three sigmas, two draws each, the noise of draw d from seed d
        return functools.partial(
            federated.dp_mean,
            clip_norm=0.5,
            noise_multiplier=sigmas[r // 2],
            rng=np.random.default_rng(r % 2),
        )

    batch = dp_draws.run_fedavg_draws(
        federated.make_problem(3, **SMALL), aggregates=[aggregate_of(r) for r in range(6)], **kw
    )
    assert batch.w.shape == (6, 4) and batch.loss.shape == (6, 6)
    for r, run in enumerate(_one_by_one(aggregate_of, 6, **kw)):
        np.testing.assert_allclose(batch.w[r], run.w, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(batch.loss[r], run.loss, rtol=1e-10)
    assert not np.allclose(batch.loss[2], batch.loss[3])  # two draws of the noise differ
    np.testing.assert_array_equal(batch.loss[0], batch.loss[1])  # no noise: draws agree


def test_client_streams_and_a_plain_mean_aggregate_are_fedavg():
    problem = federated.make_problem(5, client_streams=True, **SMALL)
    batch = dp_draws.run_fedavg_draws(
        problem, aggregates=[lambda u: u.mean(axis=0)], local_steps=2, rounds=4, batch_size=6
    )
    w = federated.fedavg(federated.make_problem(5, client_streams=True, **SMALL), 2, rounds=4,
                         batch_size=6)  # fmt: skip
    np.testing.assert_allclose(batch.w[0], w, rtol=1e-10, atol=1e-13)


def test_noise_draws_have_their_own_generators_and_more_draws_keep_the_first():
    updates = np.zeros((4, 3))  # nothing to clip: the aggregate is the noise alone
    aggregates = dp_draws.noise_draws(clip_norm=2.0, noise_multiplier=1.5, draws=3, first_seed=7)
    for d, aggregate in enumerate(aggregates):
        expected = np.random.default_rng(7 + d).normal(0, 1.5 * 2.0, 3) / 4
        np.testing.assert_allclose(aggregate(updates), expected)
    kw = dict(local_steps=2, rounds=3, batch_size=8, clients_per_round=4)
    few = dp_draws.run_fedavg_draws(
        federated.make_problem(3, **SMALL),
        aggregates=dp_draws.noise_draws(clip_norm=0.3, noise_multiplier=2.0, draws=2),
        **kw,
    )
    many = dp_draws.run_fedavg_draws(
        federated.make_problem(3, **SMALL),
        aggregates=dp_draws.noise_draws(clip_norm=0.3, noise_multiplier=2.0, draws=5),
        **kw,
    )
    np.testing.assert_allclose(many.loss[:2], few.loss, rtol=1e-12)


def test_a_students_private_mean_is_called_with_its_draws_generator():
    seen = []

    def private_mean(updates, *, clip_norm, noise_multiplier, rng):
        seen.append((updates.shape, clip_norm, noise_multiplier, rng.bit_generator.seed_seq))
        return np.zeros(updates.shape[1])

    aggregates = dp_draws.noise_draws(private_mean, clip_norm=0.3, noise_multiplier=2.0, draws=2)
    run = dp_draws.run_fedavg_draws(
        federated.make_problem(3, **SMALL), aggregates=aggregates, local_steps=1, rounds=2,
        clients_per_round=5,
    )  # fmt: skip
    assert [(shape, clip, sigma) for shape, clip, sigma, _ in seen] == [((5, 4), 0.3, 2.0)] * 4
    assert [s.entropy for *_, s in seen] == [0, 1, 0, 1]  # round by round, draw by draw
    np.testing.assert_array_equal(run.w, 0.0)  # the models moved only as the aggregate said


def test_spread_and_refusals():
    assert dp_draws.spread([0.3, 0.4, 0.5]) == "0.400 (0.300 to 0.500)"
    assert dp_draws.spread([1.0], digits=1) == "1.0 (1.0 to 1.0)"
    with pytest.raises(ValueError):
        dp_draws.spread([])
    with pytest.raises(ValueError):
        dp_draws.noise_draws(clip_norm=1.0, noise_multiplier=1.0, draws=0)
    with pytest.raises(ValueError):
        dp_draws.run_fedavg_draws(
            federated.make_problem(3, **SMALL), aggregates=[], local_steps=1, rounds=1
        )
