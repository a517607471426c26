"""Partly right answers of section 05 (asynchronous and decentralized optimization): each is
right for its exercise's visible cases and wrong for a hidden one (see
tests/grader/mutants/heldout.py, ``partly``). Never learned from."""

from tests.grader.mutants import bug, shortcut
from tests.grader.mutants.heldout import partly

PARTLY = [
    # Exercise 1: right with no backup or one (the visible cases), but every number of backups
    # drops only the first term of the harmonic sum: H_{N+b} - 1 for H_{N+b} - H_b.
    partly(
        bug(
            "expected_sync_step_time",
            "backups drop only the slowest worker's term, however many there are",
            "return base_s + mean_delay_s * sum(1 / k for k in range(num_backup + 1, total + 1))",
            "first = 2 if num_backup else 1  # a backup spares us the slowest worker\n"
            "    return base_s + mean_delay_s * sum(1 / k for k in range(first, total + 1))",
        )
    ),
    # Exercise 2: the divisor clipped to the figures' 64 workers (the visible staleness is 8).
    partly(
        bug(
            "staleness_aware_lr",
            "the staleness divisor clipped at 64, the most workers of the figures",
            "return base_lr / max(1, staleness)",
            "return base_lr / np.clip(staleness, 1, 64)  # never more stale than 64 workers",
        )
    ),
    # Exercise 3: the first time from which the loss stays at or below the target (the same as
    # the first time it gets there for the visible, decreasing curves).
    partly(
        shortcut(
            "time_to_reach",
            "the time from which the loss stays at or below the target, read backwards",
            """\
def time_to_reach(times_s, excess_loss, target):
    reached = math.inf
    for t, loss in zip(reversed(list(times_s)), reversed(list(excess_loss))):
        if loss > target:
            break
        reached = float(t)
    return reached
""",
        )
    ),
    # Exercise 4: the receive buffer sized for the default 10 features of the visible benches.
    partly(
        bug(
            "async_server",
            "the message buffer sized for 10 features, the benches' default",
            "message = torch.empty(bench.num_features + 1, dtype=torch.float64)",
            "message = torch.empty(11, dtype=torch.float64)  # the version and 10 weights",
        )
    ),
    # Exercise 5: the upper triangle filled with its row's degree and mirrored: symmetric, and
    # right wherever the lower-numbered end of every edge has the larger degree (the ring, and
    # the star with its centre at node 0).
    partly(
        bug(
            "metropolis_hastings",
            "each edge weighted by its lower-numbered end's degree, mirrored",
            """\
    for i in range(n):
        for j in range(n):
            if i != j and adjacency[i, j]:
                weights[i, j] = 1.0 / (1 + max(degree[i], degree[j]))
""",
            """\
    for i in range(n):
        for j in range(i + 1, n):
            if adjacency[i, j]:
                weights[i, j] = weights[j, i] = 1.0 / (1 + degree[i])
""",
        ),
        "edge weight 1 / (1 + deg_i): own degree only, not symmetric",
    ),
    # Exercise 6: every eigenvalue close to 1 removed, then the largest magnitude: right for a
    # connected graph, but a disconnected one has 1 more than once, and lambda is then 1.
    partly(
        shortcut(
            "second_largest_eigenvalue_magnitude",
            "the eigenvalue 1 removed (all its copies), then the largest magnitude",
            """\
def second_largest_eigenvalue_magnitude(weights):
    eigenvalues = np.linalg.eigvalsh(np.asarray(weights, dtype=float))
    others = [e for e in eigenvalues if not np.isclose(e, 1.0)]  # lambda_1 = 1 is the average
    return float(max(abs(e) for e in others))
""",
        )
    ),
    # Exercise 7: a loop over the rounds capped at 100 (the visible answers are 0 to 3).
    partly(
        shortcut(
            "predicted_rounds",
            "the rounds counted in a loop that stops at 100",
            """\
def predicted_rounds(rate, relative_distance):
    for rounds in range(100):  # never loop forever
        if rate**rounds <= relative_distance:
            return rounds
    return 100
""",
        )
    ),
    # Exercise 8: the step taken in place, as torch's optimizers do: the right numbers, but the
    # caller's params and velocity are changed.
    partly(
        shortcut(
            "diloco_outer_step",
            "the velocity and params updated in place, as an optimizer does",
            """\
def diloco_outer_step(params, outer_grad, velocity, *, lr=0.7, momentum=0.9):
    velocity *= momentum
    velocity += outer_grad
    params -= lr * (outer_grad + momentum * velocity)
    return params, velocity
""",
        )
    ),
    # Exercise 9: the receive buffers sized for the default 10 features of the visible bench.
    partly(
        bug(
            "ring_gossip_sgd",
            "the receive buffers sized for 10 features, the bench's default",
            "from_left, from_right = torch.empty_like(y), torch.empty_like(y)",
            "from_left = torch.empty(10, dtype=torch.float64)  # the model's 10 weights\n"
            "        from_right = torch.empty(10, dtype=torch.float64)",
        )
    ),
]
