"""Partly right answers of section 06 (federated learning): each passes every visible check of
its exercise and fails a hidden case only (see heldout.py's ``partly``).

The visible cases run on the lesson's data (10 clients of 200 examples, learning rate 0.1,
batches of 32 or 320), on small hand-made vectors, and on rank benches whose clients all run
the same number of local steps; the hidden ones vary the sizes, rates, batches and steps.
"""

from tests.grader.mutants import bug, shortcut
from tests.grader.mutants.heldout import partly

PARTLY = [
    # --- Exercise 1: fedavg -------------------------------------------------------------------
    # Every visible client has 200 examples, more than a batch; the hidden clients of 5, 1 or 2
    # examples would draw fewer than batch_size, so the draws (and the rng's stream) differ.
    partly(
        bug(
            "fedavg",
            "no more examples drawn than the client holds: min(batch_size, n_k)",
            "idx = problem.rng.choice(len(y), batch_size)",
            "idx = problem.rng.choice(len(y), min(batch_size, len(y)))",
        )
    ),
    # The visible run uses the default rate; the hidden ones pass lr=0.3 and 0.05.
    partly(
        bug(
            "fedavg",
            "the learning rate typed as its default 0.1, the lr argument unused",
            "local -= lr * logistic_grad(local, X[idx], y[idx])",
            "local -= 0.1 * logistic_grad(local, X[idx], y[idx])",
        )
    ),
    # --- Exercise 2: centralized_sgd ----------------------------------------------------------
    # The visible run uses the default batch of 320; the hidden ones 17, 64 and 1.
    partly(
        bug(
            "centralized_sgd",
            "the batch size typed as its default 320, the batch_size argument unused",
            "idx = problem.rng.choice(len(y), batch_size)",
            "idx = problem.rng.choice(len(y), 320)",
        )
    ),
    # --- Exercise 3: client_drift -------------------------------------------------------------
    # The visible drifts are 1, 0, 5 and 1.5, exact at 3 decimals; the hidden ones are not.
    partly(
        bug(
            "client_drift",
            "the drift rounded to 3 decimals",
            "return float(np.mean(np.linalg.norm(models - models.mean(axis=0), axis=1)))",
            "drift = np.mean(np.linalg.norm(models - models.mean(axis=0), axis=1))\n"
            "    return round(float(drift), 3)",
        )
    ),
    # --- Exercise 4: fedprox ------------------------------------------------------------------
    # The visible clients all have 200 examples, where the plain mean is the weighted one.
    partly(
        bug(
            "fedprox",
            "the models summed and divided by the number of clients",
            "w = np.average(models, axis=0, weights=sizes)  # client k weighs n_k / n",
            "w = np.sum(models, axis=0) / problem.num_clients",
        ),
        "the plain mean of the models, clients not weighted by size",
    ),
    # --- Exercise 5: scaffold -----------------------------------------------------------------
    # Option II's c_k = c_k - c + (w - y_k) / (K lr), with the visible runs' lr 0.1 typed in.
    partly(
        bug(
            "scaffold",
            "the step size in the control variates' update typed as 0.1",
            "new_c = client_c[k] - c + (w - local) / (local_steps * lr)",
            "new_c = client_c[k] - c + (w - local) / (local_steps * 0.1)",
        )
    ),
    # The paper's 1/N for the models and the control variates alike: right while every client
    # has as many examples as the others, as the visible ones do.
    partly(
        bug(
            "scaffold",
            "every client weighs 1/N, in the models' average and in c's",
            "shares = np.array([len(y) for _, y in problem.clients]) / sum(len(y) for _, y in "
            "problem.clients)",
            "shares = np.full(n, 1 / n)",
        )
    ),
    # --- Exercise 6: fedavg_over_ranks --------------------------------------------------------
    # Both visible benches give every client the same local_steps; the hidden ones give each
    # client its own, which steps_of(rank) reads one client off (and past the last).
    partly(
        bug(
            "fedavg_over_ranks",
            "the client's local steps looked up by its rank, not its client index",
            "for _ in range(bench.steps_of(client)):",
            "for _ in range(bench.steps_of(rank)):",
        )
    ),
    # --- Exercise 7: masked_update ------------------------------------------------------------
    # The visible checks see only that the masks cancel in the sum and move each vector; the
    # hidden ones compare with the pairs' masks, signs included.
    partly(
        shortcut(
            "masked_update",
            "the sign chosen from the pair: + for the higher client, - for the lower",
            """\
def masked_update(update, client, pair_seeds, *, mask_scale):
    masked = np.array(update, dtype=float)
    for (i, j), seed in pair_seeds.items():
        if client in (i, j):
            sign = 1.0 if client == j else -1.0
            masked += sign * federated.pair_mask(seed, len(masked), scale=mask_scale)
    return masked
""",
        ),
        "signs swapped: subtract the masks with higher clients, add those with lower",
    ),
    # The visible case has 4 clients; a hidden one has a lone client, whose seeds are {}.
    partly(
        shortcut(
            "masked_update",
            "the clients counted from the seeds' pairs: max() of nothing for a lone client",
            """\
def masked_update(update, client, pair_seeds, *, mask_scale):
    num_clients = max(j for _, j in pair_seeds) + 1
    masked = np.array(update, dtype=float)
    for other in range(num_clients):
        if other > client:
            masked += federated.pair_mask(pair_seeds[client, other], len(masked),
                                          scale=mask_scale)
        elif other < client:
            masked -= federated.pair_mask(pair_seeds[other, client], len(masked),
                                          scale=mask_scale)
    return masked
""",
        )
    ),
    # --- Exercise 8: secure_sum ---------------------------------------------------------------
    # Every visible case has at most one client missing; the hidden ones drop several.
    partly(
        shortcut(
            "secure_sum",
            "the masks of the first missing client removed, as if only one ever drops",
            """\
def secure_sum(masked, pair_seeds, *, mask_scale):
    total = sum(np.asarray(v, dtype=float) for v in masked.values())
    clients = sorted({k for pair in pair_seeds for k in pair})
    missing = [k for k in clients if k not in masked]
    if not missing:
        return total  # everyone sent: the masks cancel
    gone = missing[0]  # the client that dropped
    for (i, j), seed in pair_seeds.items():
        if gone in (i, j):
            mask = federated.pair_mask(seed, len(total), scale=mask_scale)
            total = total - mask if j == gone else total + mask
    return total
""",
        )
    ),
    # With one client missing, "a pair with a missing member" is "a pair with one missing
    # member"; with two missing, their own pair's mask (in nobody's vector) is removed too.
    partly(
        shortcut(
            "secure_sum",
            "the mask of every pair with a missing member removed",
            """\
def secure_sum(masked, pair_seeds, *, mask_scale):
    total = np.sum([np.asarray(v, dtype=float) for v in masked.values()], axis=0)
    for (i, j), seed in pair_seeds.items():
        if i not in masked or j not in masked:  # a mask nobody cancelled
            sign = -1.0 if i in masked else 1.0
            total = total + sign * federated.pair_mask(seed, len(total), scale=mask_scale)
    return total
""",
        ),
        "masks removed for pairs of two dropped clients as well",
    ),
    # --- Exercise 9: private_mean -------------------------------------------------------------
    # The visible noise check asks only that the noised mean differ from the clipped one.
    partly(
        bug(
            "private_mean",
            "every client's update noised with std sigma S, the noises summed",
            "noise = rng.normal(0.0, noise_multiplier * clip_norm, updates.shape[1])",
            "noise = rng.normal(0.0, noise_multiplier * clip_norm, updates.shape).sum(axis=0)",
        )
    ),
]
