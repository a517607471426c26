import numpy as np
import pytest

from distopt.sim import federated
from distopt.sim.federated import FederatedProblem, make_problem

HETERO = dict(shift_std=2.0, label_skew=0.5)


def lesson_fedavg_and_centralized(seed=6, dim=10, num_clients=10):
    """The lesson's experiment written out step by step, with rng.choice as in the lesson."""
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=dim)
    data = []
    for _ in range(num_clients):
        shift = rng.normal(0, 1.0, dim)
        X = rng.normal(size=(200, dim)) + shift
        y = (X @ w_true + rng.normal(0, 0.5, 200) > 0).astype(float)
        data.append((X, y))
    models = {}
    for steps in (1, 5, 25):
        w = np.zeros(dim)
        for _ in range(30):
            local_models = []
            for X, y in data:
                local = w.copy()
                for _ in range(steps):
                    idx = rng.choice(len(y), 32)
                    local -= 0.1 * federated.logistic_grad(local, X[idx], y[idx])
                local_models.append(local)
            w = np.mean(local_models, axis=0)
        models[steps] = w
    X_all, y_all = np.vstack([X for X, _ in data]), np.concatenate([y for _, y in data])
    w = np.zeros(dim)
    for _ in range(750):
        idx = rng.choice(len(y_all), 32 * num_clients)
        w -= 0.1 * federated.logistic_grad(w, X_all[idx], y_all[idx])
    models["centralized"] = w
    return data, w_true, models


@pytest.fixture(scope="module")
def lesson():
    return lesson_fedavg_and_centralized()


def test_make_problem_draws_the_lessons_data(lesson):
    data, w_true, _ = lesson
    problem = make_problem(seed=6)
    assert np.array_equal(problem.w_true, w_true)
    for (X, y), (X_ref, y_ref) in zip(problem.clients, data, strict=True):
        assert np.array_equal(X, X_ref) and np.array_equal(y, y_ref)


def test_lesson_table_is_reproduced_in_the_lessons_order(lesson):
    _, _, reference = lesson
    problem = make_problem(seed=6)
    got = {steps: federated.fedavg(problem, steps) for steps in (1, 5, 25)}
    got["centralized"] = federated.centralized_sgd(problem, 750, batch_size=320)
    for key, w in got.items():
        np.testing.assert_allclose(w, reference[key], rtol=1e-12, atol=1e-14)
    printed = {key: f"{federated.global_loss(problem, w):.4f}" for key, w in got.items()}
    assert printed == {1: "0.3477", 5: "0.2016", 25: "0.1204", "centralized": "0.1182"}


def test_fedavg_with_one_client_is_centralized_sgd():
    kw = dict(num_clients=1, examples_per_client=80, dim=5)
    federated_w = federated.fedavg(make_problem(3, **kw), 4, rounds=6, batch_size=16)
    central_w = federated.centralized_sgd(make_problem(3, **kw), 24, batch_size=16)
    np.testing.assert_allclose(federated_w, central_w, rtol=1e-12, atol=1e-15)


def test_one_full_batch_local_step_is_gradient_descent_on_the_global_loss():
    problem = make_problem(4, num_clients=5, examples_per_client=40, **HETERO)
    w_fed = federated.fedavg(problem, 1, rounds=20, lr=0.2, batch_size=None)
    w = np.zeros(problem.dim)
    for _ in range(20):
        w -= 0.2 * federated.logistic_grad(w, *problem.pooled)
    np.testing.assert_allclose(w_fed, w, rtol=1e-10, atol=1e-12)


def test_fedprox_with_mu_zero_is_fedavg_and_larger_mu_drifts_less():
    def run(**kw):
        return federated.run_federated(
            make_problem(5, **HETERO), local_steps=20, rounds=5, algorithm="fedprox", **kw
        )

    np.testing.assert_array_equal(
        run(mu=0.0).w, federated.fedavg(make_problem(5, **HETERO), 20, rounds=5)
    )
    drifts = [run(mu=mu).drift.mean() for mu in (0.0, 0.3, 1.0, 3.0)]
    assert drifts == sorted(drifts, reverse=True), drifts


def test_scaffold_on_identical_clients_is_fedavg():
    X, y = make_problem(6, num_clients=1, examples_per_client=100).clients[0]
    problem = FederatedProblem([(X, y)] * 4, np.zeros(X.shape[1]), np.random.default_rng(0))
    kw = dict(local_steps=5, rounds=10, batch_size=None)
    scaffold = federated.run_federated(problem, algorithm="scaffold", **kw)
    plain = federated.run_federated(problem, **kw)
    np.testing.assert_allclose(scaffold.w, plain.w, rtol=1e-10, atol=1e-12)
    assert scaffold.model_transfers == 2 * plain.model_transfers == 2 * 2 * 4 * 10


def test_scaffold_reaches_the_optimum_where_fedavg_drifts():
    # Full local gradients, so that only drift (no minibatch noise) separates the two.
    problem = make_problem(6, **HETERO)
    best = federated.global_loss(problem, federated.minimize_global_loss(problem))
    kw = dict(local_steps=20, rounds=100, batch_size=None)
    scaffold = federated.run_federated(problem, algorithm="scaffold", **kw)
    plain = federated.run_federated(problem, **kw)
    assert scaffold.loss[-1] - best < 1e-4
    assert plain.loss[-1] - best > 0.03
    assert plain.drift[-1] > 100 * scaffold.drift[-1]


def test_client_sampling_takes_distinct_clients_and_counts_transfers():
    seen = []

    def record(updates):
        seen.append(updates)
        return updates.mean(axis=0)

    problem = make_problem(7, num_clients=12, examples_per_client=30)
    run = federated.run_federated(
        problem, local_steps=2, rounds=6, clients_per_round=4, aggregate=record
    )
    assert [u.shape for u in seen] == [(4, problem.dim)] * 6
    assert run.model_transfers == 2 * 4 * 6
    assert run.client_models.shape == (4, problem.dim)
    assert run.drift[-1] == pytest.approx(federated.client_drift(run.client_models))


def test_mean_aggregate_matches_model_averaging():
    kw = dict(local_steps=3, rounds=4)
    plain = federated.run_federated(make_problem(8, **HETERO), **kw)
    mean = federated.run_federated(
        make_problem(8, **HETERO), aggregate=lambda u: u.mean(axis=0), **kw
    )
    np.testing.assert_allclose(plain.w, mean.w, rtol=1e-12, atol=1e-14)


def test_client_drift_by_hand():
    assert federated.client_drift(np.array([[0.0, 0.0], [6.0, 8.0]])) == pytest.approx(5.0)
    assert federated.client_drift(np.ones((3, 4))) == 0.0


def test_dp_mean_clips_then_adds_noise_of_std_sigma_s_over_n():
    updates = np.array([[3.0, 4.0], [0.3, 0.4]])
    got = federated.dp_mean(
        updates, clip_norm=1.0, noise_multiplier=0.0, rng=np.random.default_rng(0)
    )
    np.testing.assert_allclose(got, [0.45, 0.6])
    zeros = np.zeros((20, 20000))
    noise = federated.dp_mean(
        zeros, clip_norm=0.5, noise_multiplier=2.0, rng=np.random.default_rng(1)
    )
    assert noise.std() == pytest.approx(2.0 * 0.5 / 20, rel=0.02)


def test_pairwise_masks_cancel_in_the_sum():
    n, dim = 6, 7
    seeds = federated.make_pair_seeds(n, np.random.default_rng(2))
    assert sorted(seeds) == [(i, j) for i in range(n) for j in range(i + 1, n)]

    def mask_of(client):  # what one client adds to its update (Bonawitz et al. 2017, sec. 3)
        total = np.zeros(dim)
        for (i, j), seed in seeds.items():
            if client in (i, j):
                sign = 1.0 if client == i else -1.0
                total += sign * federated.pair_mask(seed, dim, scale=1e3)
        return total

    masks = np.array([mask_of(k) for k in range(n)])
    assert np.all(np.linalg.norm(masks, axis=1) > 100)
    np.testing.assert_allclose(masks.sum(axis=0), 0.0, atol=1e-9)
    np.testing.assert_array_equal(
        federated.pair_mask(7, dim, scale=2.0), federated.pair_mask(7, dim, scale=2.0)
    )


def test_minimize_global_loss_finds_a_stationary_point_and_refuses_separable_data():
    problem = make_problem(9, **HETERO)
    w = federated.minimize_global_loss(problem)
    assert np.linalg.norm(federated.logistic_grad(w, *problem.pooled)) < 1e-8
    separable = FederatedProblem(
        [(np.array([[1.0], [-1.0]]), np.array([1.0, 0.0]))], np.ones(1), np.random.default_rng()
    )
    with pytest.raises(RuntimeError):
        federated.minimize_global_loss(separable)


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError):
        federated.run_federated(make_problem(), local_steps=1, rounds=1, algorithm="fedsgd")


UNEQUAL = (500, 300, 100, 50, 20, 10, 10, 5, 5)


def test_client_sizes_draw_in_the_lessons_order():
    same = make_problem(6, client_sizes=[200] * 10)
    lesson = make_problem(6)
    for (X, y), (X_ref, y_ref) in zip(same.clients, lesson.clients, strict=True):
        assert np.array_equal(X, X_ref) and np.array_equal(y, y_ref)
    problem = make_problem(1, client_sizes=(3, 40, 7), dim=4)
    assert problem.client_sizes == [3, 40, 7] and problem.num_clients == 3
    assert problem.pooled[0].shape == (50, 4)
    with pytest.raises(ValueError):
        make_problem(1, client_sizes=(3, 4), num_clients=3)
    with pytest.raises(ValueError):
        make_problem(1, client_sizes=(3, 0))


def test_one_full_batch_step_weighted_by_size_is_gradient_descent_on_unequal_clients():
    kw = dict(client_sizes=UNEQUAL, label_skew=1.0, noise_std=1.0)
    runs = {
        weighting: federated.fedavg(
            make_problem(2, **kw), 1, rounds=15, lr=0.5, batch_size=None, weighting=weighting
        )
        for weighting in federated.WEIGHTINGS
    }
    problem = make_problem(2, **kw)
    w = np.zeros(problem.dim)
    for _ in range(15):
        w -= 0.5 * federated.logistic_grad(w, *problem.pooled)
    np.testing.assert_allclose(runs["examples"], w, rtol=1e-10, atol=1e-12)
    assert np.abs(runs["uniform"] - w).max() > 0.1  # the unweighted mean follows another loss


def test_weighted_fedavg_reaches_the_optimum_and_the_unweighted_one_does_not():
    kw = dict(client_sizes=UNEQUAL, label_skew=1.0, noise_std=1.0)
    problem = make_problem(6, **kw)
    best = federated.global_loss(problem, federated.minimize_global_loss(problem))
    gaps = {}
    for weighting in federated.WEIGHTINGS:
        run = federated.run_federated(
            make_problem(6, **kw),
            local_steps=1,
            rounds=200,
            lr=0.5,
            batch_size=None,
            weighting=weighting,
        )
        gaps[weighting] = run.loss[-1] - best
    assert gaps["examples"] < 1e-4 < 0.05 < gaps["uniform"], gaps


def test_equal_sizes_average_bit_for_bit_as_the_plain_mean():
    models = np.random.default_rng(0).normal(size=(4, 3))
    plain = models.mean(axis=0)
    assert np.array_equal(federated.average_models(models, [7] * 4, "examples"), plain)
    assert np.array_equal(federated.average_models(models, [1, 2, 3, 4], "uniform"), plain)
    np.testing.assert_allclose(
        federated.average_models(models, [1, 2, 3, 4], "examples"),
        (models * np.array([[1], [2], [3], [4]])).sum(axis=0) / 10,
        rtol=1e-14,
    )
    with pytest.raises(ValueError):
        federated.average_models(models, [1] * 4, "steps")


def test_client_streams_are_each_clients_own():
    kw = dict(client_sizes=(20, 30, 40), client_streams=True)
    # client 2's minibatches do not depend on how many steps the others took
    a = federated.run_federated(make_problem(3, **kw), local_steps=(1, 1, 4), rounds=1)
    b = federated.run_federated(make_problem(3, **kw), local_steps=(5, 2, 4), rounds=1)
    np.testing.assert_array_equal(a.client_models[2], b.client_models[2])
    assert not np.array_equal(a.client_models[0], b.client_models[0])
    spawned = np.random.default_rng(np.random.SeedSequence(3).spawn(3)[2])  # numpy's own way
    expected = spawned.integers(0, 9, 5)
    assert np.array_equal(federated.client_stream(3, 2).integers(0, 9, 5), expected)
    assert np.array_equal(make_problem(3, **kw).client_rngs[2].integers(0, 9, 5), expected)


def test_per_client_local_steps_are_checked():
    with pytest.raises(ValueError):
        federated.run_federated(make_problem(1, num_clients=3), local_steps=(1, 2), rounds=1)
    with pytest.raises(ValueError):
        federated.run_federated(make_problem(1), local_steps=1, rounds=1, weighting="steps")


def test_scaffold_weighted_by_size_reaches_the_optimum_of_unequal_clients():
    # c is kept the size-weighted mean of the c_k, which sets the fixed point: the minimum of
    # the global loss (with c the plain mean of the c_k, this run ends 0.0046 above it).
    kw = dict(client_sizes=(120, 30, 10, 60), shift_std=2.0, label_skew=0.5, dim=4)
    problem = make_problem(9, **kw)
    best = federated.global_loss(problem, federated.minimize_global_loss(problem))
    for clients_per_round in (None, 2):
        run = federated.run_federated(
            make_problem(9, **kw),
            local_steps=10,
            rounds=200,
            lr=0.3,
            batch_size=None,
            algorithm="scaffold",
            clients_per_round=clients_per_round,
        )
        assert run.loss[-1] - best < 1e-4, (clients_per_round, run.loss[-1] - best)
    # weighting="uniform": c the plain mean, and the fixed point the mean client loss's minimum
    uniform = federated.run_federated(
        make_problem(9, **kw),
        local_steps=10,
        rounds=200,
        lr=0.3,
        batch_size=None,
        algorithm="scaffold",
        weighting="uniform",
    )
    mean_grad = np.mean([federated.logistic_grad(uniform.w, X, y) for X, y in problem.clients], 0)
    # (the size-weighted run leaves this gradient at 0.028)
    assert np.linalg.norm(mean_grad) < 1e-3 and uniform.loss[-1] - best > 1e-3


def _fedopt_by_hand(kind, *, rounds, server_lr, momentum=0.9, beta2=0.99, tau=1e-3):
    """FedOpt written out: run_federated's aggregate returns the server's step itself."""
    state = {"m": 0.0, "v": 0.0}

    def step(updates):
        delta = updates.mean(axis=0)
        if kind == "momentum":
            state["m"] = momentum * state["m"] + delta
            return server_lr * state["m"]
        if kind == "nesterov":  # torch's SGD(nesterov=True) on the gradient -delta
            state["m"] = momentum * state["m"] - delta
            return -server_lr * (-delta + momentum * state["m"])
        state["m"] = momentum * state["m"] + (1 - momentum) * delta
        state["v"] = beta2 * state["v"] + (1 - beta2) * delta**2
        return server_lr * state["m"] / (np.sqrt(state["v"]) + tau)

    run = federated.run_federated(
        make_problem(4, num_clients=5, examples_per_client=40, **HETERO),
        local_steps=3,
        rounds=rounds,
        aggregate=step,
    )
    return run.w


@pytest.mark.parametrize(
    ("kind", "server_lr"), [("momentum", 0.5), ("nesterov", 0.7), ("adam", 0.05)]
)
def test_server_optimizers_step_on_the_averaged_change(kind, server_lr):
    server = federated.ServerOptimizer(kind, lr=server_lr)
    run = federated.run_federated(
        make_problem(4, num_clients=5, examples_per_client=40, **HETERO),
        local_steps=3,
        rounds=6,
        server=server,
    )
    expected = _fedopt_by_hand(kind, rounds=6, server_lr=server_lr)
    np.testing.assert_allclose(run.w, expected, rtol=1e-10, atol=1e-13)


def test_server_sgd_at_lr_1_is_fedavg_and_momentum_is_heavy_ball_on_one_full_step():
    kw = dict(local_steps=1, rounds=8, lr=0.5, batch_size=None)
    plain = federated.run_federated(make_problem(2, num_clients=4, **HETERO), **kw)
    sgd = federated.run_federated(
        make_problem(2, num_clients=4, **HETERO), server=federated.ServerOptimizer("sgd"), **kw
    )
    np.testing.assert_allclose(sgd.w, plain.w, rtol=1e-12, atol=1e-14)
    # one full-batch step per round: Delta = -lr grad F(w), so FedAvgM is Polyak's heavy ball
    heavy = federated.run_federated(
        make_problem(2, num_clients=4, **HETERO),
        server=federated.ServerOptimizer("momentum", lr=1.0, momentum=0.8),
        **kw,
    )
    problem = make_problem(2, num_clients=4, **HETERO)
    w, previous = np.zeros(problem.dim), np.zeros(problem.dim)
    for _ in range(8):
        w, previous = (
            w - 0.5 * federated.logistic_grad(w, *problem.pooled) + 0.8 * (w - previous),
            w,
        )
    np.testing.assert_allclose(heavy.w, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "bad", [dict(kind="lamb"), dict(lr=0.0), dict(momentum=1.0), dict(beta2=-0.1), dict(tau=0)]
)
def test_server_optimizer_refuses_bad_settings(bad):
    with pytest.raises(ValueError):
        federated.ServerOptimizer(**bad)


def test_dirichlet_label_skew_changes_only_the_mix_of_labels():
    n = 60
    skewed = federated.make_dirichlet_problem(3, alpha=0.05, num_clients=8, examples_per_client=n)
    even = federated.make_dirichlet_problem(3, alpha=1e5, num_clients=8, examples_per_client=n)
    for problem in (skewed, even):
        assert problem.client_sizes == [n] * 8 and problem.dim == 10
        X, y = problem.pooled
        assert np.array_equal(X[:, -1], np.ones(len(X)))  # the intercept feature
        assert set(np.unique(y)) <= {0.0, 1.0}
    shares = lambda p: np.array([y.mean() for _, y in p.clients])  # noqa: E731
    assert np.all(np.abs(shares(even) - 0.5) < 0.05)  # alpha -> inf: the population's mix
    assert np.mean(np.minimum(shares(skewed), 1 - shares(skewed)) < 0.05) >= 0.75  # one class
    # the same draws give the same clients; the shares are Dir(alpha/2, alpha/2)'s, rounded
    again = federated.make_dirichlet_problem(3, alpha=0.05, num_clients=8, examples_per_client=n)
    assert all(
        np.array_equal(a[0], b[0]) for a, b in zip(skewed.clients, again.clients, strict=True)
    )
    rng = np.random.default_rng(3)
    rng.normal(size=10)
    first = round(rng.dirichlet([0.025, 0.025])[1] * n)
    assert skewed.clients[0][1].sum() == first
    with pytest.raises(ValueError):
        federated.make_dirichlet_problem(alpha=0.0)
