"""Federated learning on a small logistic-regression problem: data, algorithms, privacy.

The clients hold labelled examples that never leave them; a server repeatedly sends a global
model out, each client improves it on its own data, and the server combines what comes back.
Everything here is plain numpy, seeded, and sized to run in milliseconds:

* the data: ``make_problem`` draws the clients of the lesson (and more heterogeneous ones,
  or clients of unequal sizes), ``make_dirichlet_problem`` clients that differ only in their
  mix of labels (Hsu et al. 2019); the loss and its gradient are those of
  :mod:`distopt.problems.logistic`;
* the algorithms: FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of Deep
  Networks from Decentralized Data", Algorithm 1), FedProx (Li et al. 2020, "Federated
  Optimization in Heterogeneous Networks", the proximal local objective of Algorithm 2) and
  SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated
  Learning", Algorithm 1 with the option II control-variate update), all in ``run_federated``,
  which weights each client by its share of the examples, n_k / sum n_k, as Algorithm 1 of
  McMahan et al. does (``weighting="uniform"`` for the plain mean, to see what it costs),
  and can hand the averaged change to a server optimizer (``ServerOptimizer``: FedAvgM,
  Nesterov, FedAdam; Reddi et al. 2021, "Adaptive Federated Optimization");
* privacy: the pairwise masks of secure aggregation (Bonawitz et al. 2017, "Practical Secure
  Aggregation for Privacy-Preserving Machine Learning", section 3) and the clipped, noised
  mean of DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent Language
  Models", Algorithm 1).

Randomness: a ``FederatedProblem`` carries the generator that drew its data, and every run
draws its minibatches (and client samples, and privacy noise) from that same generator, in
call order, as the lesson's code does. Two runs on one problem therefore see different
minibatches; to repeat a run, make the problem again. With ``make_problem(...,
client_streams=True)`` each client instead draws its minibatches from a generator of its own,
``client_stream(seed, k)``, and the problem's generator only samples clients: a client in a
process of its own (``distopt.ranks.federated_ranks``) can then draw exactly what the
simulator draws for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from distopt.problems.logistic import logistic_grad, logistic_loss, logistic_minimum
from distopt.sim.local_sgd import nesterov_outer_step

ALGORITHMS = ("fedavg", "fedprox", "scaffold")
WEIGHTINGS = ("examples", "uniform")  # how the server weighs client k: n_k / sum n_k, or 1/m
SERVER_KINDS = ("sgd", "momentum", "nesterov", "adam")


@dataclass
class FederatedProblem:
    """Clients with private data for binary logistic regression, and the shared generator."""

    clients: list[tuple[np.ndarray, np.ndarray]]  # per client: X (examples, dim), y (examples,)
    w_true: np.ndarray  # (dim,) the weights the labels were generated from
    rng: np.random.Generator  # drew the data; runs keep drawing from it, in call order
    # one minibatch generator per client, or None: minibatches come from rng (the lesson's)
    client_rngs: list[np.random.Generator] | None = None

    @property
    def dim(self) -> int:
        return len(self.w_true)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def client_sizes(self) -> list[int]:
        """n_k, the number of examples of each client."""
        return [len(y) for _, y in self.clients]

    @cached_property
    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """All examples stacked in client order: X (total, dim), y (total,)."""
        return np.vstack([X for X, _ in self.clients]), np.concatenate([y for _, y in self.clients])


def make_problem(
    seed: int = 6,
    *,
    dim: int = 10,
    num_clients: int | None = None,
    examples_per_client: int = 200,
    client_sizes: Sequence[int] | None = None,
    shift_std: float = 1.0,
    noise_std: float = 0.5,
    label_skew: float = 0.0,
    client_streams: bool = False,
) -> FederatedProblem:
    """The lesson's federated data set: clients whose inputs are shifted differently.

    Draws, from ``np.random.default_rng(seed)`` and in this order: ``w_true`` (dim,), then for
    each client its input shift (dim,) with std ``shift_std``, [its own labelling weights
    ``w_true + label_skew * N(0, I)``, only if ``label_skew > 0``], its inputs
    X = N(0, I) + shift (n_k, dim), and the label noise (n_k,) with std ``noise_std``;
    y = 1 where X @ w + noise > 0, else 0. With the defaults this is exactly the lesson's data
    (10 clients of 200 examples), and the returned ``rng`` is where the lesson's runs continue.

    client_sizes   -- n_k of each client (their number is the number of clients); default:
                      ``num_clients`` (10) clients of ``examples_per_client`` examples
    client_streams -- give client k its own minibatch generator ``client_stream(seed, k)``
                      (``problem.client_rngs``) instead of the shared ``rng``
    """
    if client_sizes is None:
        client_sizes = [examples_per_client] * (10 if num_clients is None else num_clients)
    elif num_clients is not None and num_clients != len(client_sizes):
        raise ValueError(f"num_clients={num_clients} but {len(client_sizes)} client_sizes")
    if min(client_sizes, default=0) < 1:
        raise ValueError(f"every client needs at least one example, got {list(client_sizes)}")
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=dim)
    clients = []
    for size in client_sizes:
        shift = rng.normal(0, shift_std, dim)
        w_client = w_true + label_skew * rng.normal(size=dim) if label_skew > 0 else w_true
        X = rng.normal(size=(size, dim)) + shift
        y = (X @ w_client + rng.normal(0, noise_std, size) > 0).astype(float)
        clients.append((X, y))
    client_rngs = [client_stream(seed, k) for k in range(len(clients))] if client_streams else None
    return FederatedProblem(clients=clients, w_true=w_true, rng=rng, client_rngs=client_rngs)


def client_stream(seed: int, client: int) -> np.random.Generator:
    """Client ``client``'s own minibatch generator for the problem of seed ``seed``.

    numpy's way to give parallel workers independent streams: the ``client``-th child of
    ``SeedSequence(seed)`` (what ``SeedSequence(seed).spawn(n)[client]`` would be), made
    directly, so that a client's process needs nothing but the seed and its own index.
    """
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(client,)))


def make_dirichlet_problem(
    seed: int = 6,
    *,
    alpha: float,
    num_clients: int = 10,
    examples_per_client: int = 200,
    dim: int = 10,
    noise_std: float = 2.0,
) -> FederatedProblem:
    """Clients that differ only in their mix of labels: Dirichlet label skew.

    Hsu, Qi and Brown 2019 ("Measuring the Effects of Non-Identical Data Distribution for
    Federated Visual Classification", section 3) give client k the class proportions
    q_k ~ Dir(alpha * p), p the population's class shares, here p = (1/2, 1/2): alpha -> inf
    gives every client the population's mix, alpha -> 0 one class per client. Every input is
    drawn from the same distribution, x = (N(0, I_{dim-1}), 1) (the last feature is a constant
    1, the intercept), and labelled by one rule, y = 1 where x @ w_true + N(0, noise_std^2) > 0;
    client k keeps the first round(q_k[1] * n) examples of label 1 and the first n - that of
    label 0 that its draws produce (rejection sampling), so only p(y) differs between clients.

    Draws from ``np.random.default_rng(seed)``, in order: w_true (dim,), then per client its
    proportions and its batches of candidate examples. ``problem.rng`` continues from there.
    """
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha}")
    if num_clients < 1 or examples_per_client < 1 or dim < 2:
        raise ValueError("need num_clients >= 1, examples_per_client >= 1 and dim >= 2")
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=dim)
    clients = []
    for _ in range(num_clients):
        share_of_ones = rng.dirichlet([alpha / 2, alpha / 2])[1]
        ones = int(round(share_of_ones * examples_per_client))
        wanted = {0.0: examples_per_client - ones, 1.0: ones}
        kept_X, kept_y = [], []
        while wanted[0.0] or wanted[1.0]:
            X = np.hstack([rng.normal(size=(2 * examples_per_client, dim - 1)),
                           np.ones((2 * examples_per_client, 1))])  # fmt: skip
            y = (X @ w_true + rng.normal(0, noise_std, len(X)) > 0).astype(float)
            keep = np.zeros(len(y), dtype=bool)
            for label in (0.0, 1.0):
                first = np.flatnonzero(y == label)[: wanted[label]]
                keep[first] = True
                wanted[label] -= len(first)
            kept_X.append(X[keep])
            kept_y.append(y[keep])
        clients.append((np.vstack(kept_X), np.concatenate(kept_y)))
    return FederatedProblem(clients=clients, w_true=w_true, rng=rng)


def global_loss(problem: FederatedProblem, w: np.ndarray) -> float:
    """Logistic loss of w on the union of all clients' data (nats per example)."""
    return logistic_loss(w, *problem.pooled)


def minimize_global_loss(problem: FederatedProblem, *, iters: int = 50) -> np.ndarray:
    """The minimizer (dim,) of the global loss, by Newton's method on the pooled data
    (``logistic.logistic_minimum``: RuntimeError if the pooled data are separable)."""
    return logistic_minimum(*problem.pooled, iterations=iters)


def client_drift(models: np.ndarray) -> float:
    """Mean Euclidean distance of the client models (num_clients, dim) from their average."""
    return float(np.mean(np.linalg.norm(models - models.mean(axis=0), axis=1)))


@dataclass
class FederatedRun:
    """The result of ``run_federated``."""

    w: np.ndarray  # (dim,) the global model after the last round
    loss: np.ndarray  # (rounds,) global loss after each round, nats per example
    drift: np.ndarray  # (rounds,) client_drift of the returned client models, each round
    model_transfers: int  # model-sized vectors sent, server to clients and back, in all
    client_models: np.ndarray  # (clients in the last round, dim) what they returned then


@dataclass(frozen=True)
class ServerOptimizer:
    """How the server turns a round's averaged change into a step (FedOpt).

    Reddi et al. 2021 ("Adaptive Federated Optimization", Algorithm 2) treat the round's
    averaged change of the model, Delta = average(w_k) - w, as a pseudo-gradient (-Delta) for
    a server optimizer; FedAvg is ``kind="sgd"`` with ``lr=1``. Per round:

    * sgd:      w <- w + lr * Delta
    * momentum: m <- momentum * m + Delta; w <- w + lr * m (FedAvgM, Hsu et al. 2019)
    * nesterov: SGD with Nesterov momentum on -Delta, as ``torch.optim.SGD(nesterov=True)``
      (:func:`distopt.sim.local_sgd.nesterov_outer_step`: DiLoCo's outer step, lr 0.7,
      momentum 0.9 in Douillard et al. 2023)
    * adam:     m <- b1 m + (1 - b1) Delta; v <- b2 v + (1 - b2) Delta^2;
      w <- w + lr * m / (sqrt(v) + tau) (FedAdam, as in the paper: no bias correction)
    """

    kind: str = "sgd"  # one of SERVER_KINDS
    lr: float = 1.0  # server learning rate (eta in Reddi et al.)
    momentum: float = 0.9  # momentum / nesterov: the velocity's decay; adam: beta_1
    beta2: float = 0.99  # adam only: decay of the second moment
    tau: float = 1e-3  # adam only: the adaptivity floor added to sqrt(v)

    def __post_init__(self):
        if self.kind not in SERVER_KINDS:
            raise ValueError(f"kind must be one of {SERVER_KINDS}, got {self.kind!r}")
        if not self.lr > 0 or not 0 <= self.momentum < 1 or not 0 <= self.beta2 < 1:
            raise ValueError(f"need lr > 0 and 0 <= momentum, beta2 < 1, got {self}")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")

    def step(self, w: np.ndarray, delta: np.ndarray, state: dict[str, np.ndarray]) -> np.ndarray:
        """The new global model from w and the round's averaged change; updates ``state``
        (empty at the first round: the moments start at 0)."""
        first = state.setdefault("first", np.zeros_like(w))
        if self.kind == "sgd":
            return w + self.lr * delta
        if self.kind == "momentum":
            state["first"] = self.momentum * first + delta
            return w + self.lr * state["first"]
        if self.kind == "nesterov":
            w, state["first"] = nesterov_outer_step(
                w, -delta, first, lr=self.lr, momentum=self.momentum
            )
            return w
        second = state.setdefault("second", np.zeros_like(w))
        state["first"] = self.momentum * first + (1 - self.momentum) * delta
        state["second"] = self.beta2 * second + (1 - self.beta2) * delta**2
        return w + self.lr * state["first"] / (np.sqrt(state["second"]) + self.tau)


def _minibatch(rng: np.random.Generator, num_examples: int, batch_size: int | None):
    # rng.integers(0, n, b) draws the same numbers as the lesson's rng.choice(n, b), faster.
    return slice(None) if batch_size is None else rng.integers(0, num_examples, batch_size)


def average_models(models: np.ndarray, client_sizes: Sequence[int], weighting: str) -> np.ndarray:
    """The server's average of the returned models (clients, dim): FedAvg's aggregation.

    ``weighting="examples"``: client k weighs n_k / sum n_k over the clients given (McMahan
    et al. 2017, Algorithm 1), so the average follows the gradient of the loss over all
    their examples; ``"uniform"``: the plain mean, every client alike. Equal sizes give the
    plain mean both ways (computed as ``np.mean``, bit for bit what the lesson computes).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if weighting == "uniform" or len(set(client_sizes)) == 1:
        return np.mean(models, axis=0)
    return np.average(models, axis=0, weights=np.asarray(client_sizes, dtype=float))


def run_federated(
    problem: FederatedProblem,
    *,
    local_steps: int | Sequence[int],
    rounds: int,
    lr: float = 0.1,
    batch_size: int | None = 32,
    algorithm: str = "fedavg",
    mu: float = 0.0,
    clients_per_round: int | None = None,
    aggregate: Callable[[np.ndarray], np.ndarray] | None = None,
    weighting: str = "examples",
    server: ServerOptimizer | None = None,
) -> FederatedRun:
    """Simulate federated training from w = 0.

    Each round the server picks ``clients_per_round`` clients without replacement (all of
    them, drawing nothing, if None), sends them the global model, and each runs
    ``local_steps`` SGD steps (one number for all, or one per client) with minibatches of
    ``batch_size`` examples drawn with replacement (its full data if None), from
    ``problem.client_rngs[k]`` if the problem has them, else from ``problem.rng`` in call
    order; then it returns its model. The local step is

    * fedavg:   w <- w - lr * g(w)
    * fedprox:  w <- w - lr * (g(w) + mu * (w - w_global)), the gradient of
      F_k(w) + mu/2 ||w - w_global||^2 (Li et al. 2020);
    * scaffold: w <- w - lr * (g(w) - c_k + c), with the client's control variate c_k and
      the server's c, both starting at 0; afterwards the client sets (option II)
      c_k <- c_k - c + (w_global - w) / (local_steps * lr) and the server adds the changes
      of c_k to c, each weighted by n_k / n over all n examples (``weighting="uniform"``, or
      equal sizes: their sum over the number of clients, Karimireddy et al. 2020), so that c
      stays the mean of the c_k weighted as the loss it corrects towards weighs the clients.

    The server then replaces the global model by ``average_models`` of the returned models
    (weighted by the clients' sizes, or uniformly, as ``weighting`` says), or, with
    ``aggregate``, adds ``aggregate(updates)`` to it, updates being the returned models minus
    the global model, shape (clients that round, dim); ``aggregate`` does its own weighting.
    With ``server``, that averaged change Delta goes through the server optimizer instead of
    being added as it is (None: FedAvg's w + Delta, computed as the average itself).
    SCAFFOLD sends a control variate with every model, so it counts two vectors per transfer.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    rng, n = problem.rng, problem.num_clients
    steps_of = [local_steps] * n if np.isscalar(local_steps) else list(local_steps)
    if len(steps_of) != n or min(steps_of) < 1:
        raise ValueError(
            f"local_steps: one number >= 1, or one per client ({n}), got {local_steps}"
        )
    batch_rngs = problem.client_rngs or [rng] * n
    sizes = problem.client_sizes
    # SCAFFOLD's server weighs the change of c_k as the models are weighed: n_k / n, or 1/N
    uniform = weighting == "uniform" or len(set(sizes)) == 1
    c_weights = None if uniform else np.asarray(sizes, dtype=float) / sum(sizes)
    server_state: dict[str, np.ndarray] = {}
    w = np.zeros(problem.dim)
    server_c = np.zeros(problem.dim)
    client_c = np.zeros((n, problem.dim))
    losses, drifts, transfers = [], [], 0
    models = np.zeros((0, problem.dim))
    for _ in range(rounds):
        if clients_per_round is None:
            chosen = range(n)
        else:
            chosen = np.sort(rng.choice(n, clients_per_round, replace=False))
        models, c_changes = [], []
        for k in chosen:
            X, y = problem.clients[k]
            local = w.copy()
            for _ in range(steps_of[k]):
                idx = _minibatch(batch_rngs[k], len(y), batch_size)
                step = logistic_grad(local, X[idx], y[idx])
                if algorithm == "fedprox":
                    step = step + mu * (local - w)
                elif algorithm == "scaffold":
                    step = step + (server_c - client_c[k])
                local -= lr * step
            if algorithm == "scaffold":
                new_c = client_c[k] - server_c + (w - local) / (steps_of[k] * lr)
                c_changes.append(new_c - client_c[k])
                client_c[k] = new_c
            models.append(local)
        models = np.array(models)
        drifts.append(client_drift(models))
        if aggregate is None:
            averaged = average_models(models, [sizes[k] for k in chosen], weighting)
        else:
            averaged = w + aggregate(models - w)
        w = averaged if server is None else server.step(w, averaged - w, server_state)
        if algorithm == "scaffold" and c_weights is None:
            server_c = server_c + np.sum(c_changes, axis=0) / n
        elif algorithm == "scaffold":
            server_c = server_c + c_weights[list(chosen)] @ np.array(c_changes)
        transfers += 2 * len(models) * (2 if algorithm == "scaffold" else 1)
        losses.append(global_loss(problem, w))
    return FederatedRun(w, np.array(losses), np.array(drifts), transfers, models)


def fedavg(
    problem: FederatedProblem,
    local_steps: int | Sequence[int],
    *,
    rounds: int = 30,
    lr: float = 0.1,
    batch_size: int | None = 32,
    weighting: str = "examples",
) -> np.ndarray:
    """FedAvg with every client in every round, the models weighted by the clients' sizes
    (or uniformly); returns the final global model (dim,)."""
    return run_federated(
        problem,
        local_steps=local_steps,
        rounds=rounds,
        lr=lr,
        batch_size=batch_size,
        weighting=weighting,
    ).w


def centralized_sgd(
    problem: FederatedProblem, steps: int, *, lr: float = 0.1, batch_size: int = 320
) -> np.ndarray:
    """Minibatch SGD from w = 0 on the pooled data (what the clients would do if they could
    share it); minibatches of ``batch_size`` drawn with replacement from ``problem.rng``."""
    X, y = problem.pooled
    w = np.zeros(problem.dim)
    for _ in range(steps):
        idx = problem.rng.integers(0, len(y), batch_size)
        w -= lr * logistic_grad(w, X[idx], y[idx])
    return w


def make_pair_seeds(num_clients: int, rng: np.random.Generator) -> dict[tuple[int, int], int]:
    """One secret seed for every pair of clients i < j, as {(i, j): seed}.

    Stands in for the key agreement of Bonawitz et al. 2017 (each pair derives a shared secret
    by Diffie-Hellman, so the server never learns it); here the seeds are simply drawn.
    """
    return {
        (i, j): int(rng.integers(2**63))
        for i in range(num_clients)
        for j in range(i + 1, num_clients)
    }


def pair_mask(seed: int, dim: int, *, scale: float) -> np.ndarray:
    """The mask (dim,) both clients of a pair expand from their shared seed: N(0, scale^2).

    Real protocols quantize updates to integers modulo 2^b and use uniform masks, which hide
    an update perfectly and cancel exactly; float masks this large hide it in practice and
    cancel up to rounding (about 1e-16 times ``scale`` per pair).
    """
    return scale * np.random.default_rng(seed).standard_normal(dim)


def dp_mean(
    updates: np.ndarray, *, clip_norm: float, noise_multiplier: float, rng: np.random.Generator
) -> np.ndarray:
    """Differentially private mean of client updates (num_clients, dim), as in DP-FedAvg.

    Each update is scaled to norm at most S = ``clip_norm``, the clipped updates are summed,
    Gaussian noise with std sigma * S (sigma = ``noise_multiplier``) is added to every
    coordinate of the sum by one call ``rng.normal(0, sigma * S, dim)``, and the result is
    divided by the number of updates. One client changes the sum by at most S, so the noise
    hides any single client's contribution (McMahan et al. 2018, Algorithm 1).
    """
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    scale = np.minimum(1.0, clip_norm / np.maximum(norms, np.finfo(float).tiny))
    noisy_sum = (updates * scale).sum(axis=0) + rng.normal(
        0, noise_multiplier * clip_norm, updates.shape[1]
    )
    return noisy_sum / len(updates)
